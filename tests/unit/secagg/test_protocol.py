"""The SecAgg protocol end to end in memory: sums, dropouts, thresholds, corruption, privacy."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from fedtune.core.errors import SecureAggregationError
from fedtune.secagg import fixedpoint, identity, keys, prg, protocol as p

FRAC = 24


CONTEXT = "job|round-1"
IDENTITY = {f"t{i}": identity.generate() for i in range(12)}
REGISTERED = {name: pair[1] for name, pair in IDENTITY.items()}


@dataclass
class Round:
    names: list[str]
    roster: p.Roster
    secrets: dict[str, p.TenantSecrets]
    dealt: dict[str, p.Dealt]
    held: dict[str, dict[str, dict[str, int]]]
    values: dict[str, np.ndarray]


def ads(secrets: dict[str, p.TenantSecrets]) -> dict[str, p.Advertisement]:
    return {x: secrets[x].advertisement(x, CONTEXT, IDENTITY[x][0]) for x in secrets}


def setup_round(n: int = 5, t: int = 3, size: int = 64, seed: int = 0, degree: int | None = None) -> Round:
    names = [f"t{i}" for i in range(n)]
    secrets = {name: p.TenantSecrets.new() for name in names}
    roster = p.Roster(CONTEXT, t, ads(secrets), tuple(names), degree, "ab" * 16)
    dealt = {}
    for name in names:
        secrets[name], dealt[name] = p.deal(name, secrets[name], roster, REGISTERED, IDENTITY[name][0])
    held = {}
    for name in names:
        routed = {u: d.part(name) for u, d in dealt.items() if name in d.sealed}
        held[name], problems = p.open_shares(name, secrets[name], roster, routed, REGISTERED)
        assert problems == {}
    rng = np.random.default_rng(seed)
    values = {name: rng.normal(size=size) * (i + 1) for i, name in enumerate(names)}
    return Round(names, roster, secrets, dealt, held, values)


def upload(r: Round, who: list[str]) -> dict[str, np.ndarray]:
    enc = {x: fixedpoint.encode(r.values[x], FRAC, len(r.names)) for x in who}
    return {x: p.mask(x, r.secrets[x], r.roster, r.names, enc[x]) for x in who}


def answers(r: Round, survivors: list[str], responders: list[str]) -> dict:
    return {v: p.respond(v, r.held[v], r.names, survivors, r.roster) for v in responders}


@pytest.mark.parametrize("seed", range(3))
def test_unmasked_sum_equals_plain_sum(seed: int) -> None:
    r = setup_round(seed=seed)
    result = p.unmask(r.roster, r.dealt, upload(r, r.names), answers(r, r.names, r.names))
    plain = sum(r.values.values())
    assert np.abs(fixedpoint.decode(result.total, FRAC) - plain).max() <= len(r.names) * 2.0**-(FRAC + 1)
    assert result.rejected_shares == []


@pytest.mark.parametrize("dropped", [["t1"], ["t0", "t4"], ["t2", "t3"]])
def test_dropouts_after_sharing_leave_the_survivors_sum(dropped: list[str]) -> None:
    r = setup_round(n=5, t=3)
    survivors = [x for x in r.names if x not in dropped]
    result = p.unmask(r.roster, r.dealt, upload(r, survivors), answers(r, survivors, survivors))
    plain = sum(r.values[x] for x in survivors)
    assert np.abs(fixedpoint.decode(result.total, FRAC) - plain).max() < 1e-6


def test_below_threshold_lists_every_reason() -> None:
    r = setup_round(n=5, t=3)
    survivors = ["t0", "t1", "t2"]
    masked = upload(r, survivors[:2])
    with pytest.raises(SecureAggregationError) as info:
        p.unmask(r.roster, r.dealt, masked, answers(r, survivors, survivors[:2]))
    text = str(info.value)
    assert "2 masked upload(s) ['t0', 't1'], threshold is 3" in text
    assert "2 unmasking answer(s) ['t0', 't1'], threshold is 3" in text
    assert "secure_aggregation.threshold" in info.value.fix


def test_corrupted_share_is_named_and_the_round_goes_on() -> None:
    r = setup_round(n=5, t=3)
    resp = answers(r, r.names, r.names)
    resp["t2"]["seed"]["t0"] = "1234"
    result = p.unmask(r.roster, r.dealt, upload(r, r.names), resp)
    assert result.rejected_shares == ["share of 't0''s seed revealed by 't2' does not match 't0''s commitment"]
    assert np.abs(fixedpoint.decode(result.total, FRAC) - sum(r.values.values())).max() < 1e-6


def test_corruption_below_threshold_fails_naming_the_dealer() -> None:
    r = setup_round(n=3, t=2)
    resp = answers(r, r.names, r.names)
    for v in ("t1", "t2"):
        resp[v]["seed"]["t0"] = "ff"
    with pytest.raises(SecureAggregationError, match="'t0''s seed: 1 valid share"):
        p.unmask(r.roster, r.dealt, upload(r, r.names), resp)


def test_a_dealer_with_inconsistent_shares_is_named() -> None:
    r = setup_round(n=3, t=2)
    # t0 commits to shares of a different polynomial than its seed hash says.
    bad = r.dealt["t0"]
    r.dealt["t0"] = p.Dealt(bad.dealer, bad.sealed, bad.commitments, "0" * 64)
    with pytest.raises(SecureAggregationError, match="'t0' dealt inconsistent shares of its seed"):
        p.unmask(r.roster, r.dealt, upload(r, r.names), answers(r, r.names, r.names))


def test_tampered_sealed_share_is_detected_by_its_recipient() -> None:
    r = setup_round(n=3, t=2)
    blob = bytearray.fromhex(r.dealt["t0"].sealed["t1"])
    blob[-1] ^= 1
    r.dealt["t0"].sealed["t1"] = blob.hex()
    held, problems = p.open_shares("t1", r.secrets["t1"], r.roster, r.dealt, REGISTERED)
    assert "t0" not in held
    assert problems == {"t0": "the share message of 't0' for 't1' fails its signature check"}


def test_a_tenant_refuses_to_reveal_both_shares_of_one_tenant() -> None:
    r = setup_round(n=5, t=3)
    first = p.respond("t1", r.held["t1"], r.names, r.names, r.roster)
    with pytest.raises(SecureAggregationError, match="already answered") as info:
        p.respond("t1", r.held["t1"], r.names, ["t1", "t2", "t3"], r.roster, previous=first)
    assert "Start the round over" in info.value.fix
    with pytest.raises(SecureAggregationError, match="below the threshold 3"):
        p.respond("t1", r.held["t1"], r.names, ["t1", "t2"], r.roster)


def test_threshold_must_be_a_majority_of_the_roster() -> None:
    s = {f"t{i}": p.TenantSecrets.new() for i in range(4)}
    roster = p.Roster(CONTEXT, 2, ads(s))
    with pytest.raises(SecureAggregationError, match=r"threshold 2 for a neighbourhood of 4 tenants is not in 3..4"):
        p.deal("t0", s["t0"], roster, REGISTERED, IDENTITY["t0"][0])


def test_a_replaced_key_in_the_roster_is_refused() -> None:
    s = {f"t{i}": p.TenantSecrets.new() for i in range(3)}
    routed = ads(s)
    routed["t0"] = p.TenantSecrets.new().advertisement("t0", CONTEXT, IDENTITY["t0"][0])
    with pytest.raises(SecureAggregationError, match="does not carry tenant 't0'"):
        p.deal("t0", s["t0"], p.Roster(CONTEXT, 2, routed), REGISTERED, IDENTITY["t0"][0])


def test_messages_round_trip_through_json() -> None:
    r = setup_round(n=3, t=2)
    assert p.Roster.from_json(json.loads(json.dumps(r.roster.to_json()))) == r.roster
    assert p.Dealt.from_json(json.loads(json.dumps(r.dealt["t0"].to_json()))) == r.dealt["t0"]
    assert p.TenantSecrets.from_json(json.loads(json.dumps(r.secrets["t0"].to_json()))) == r.secrets["t0"]


def test_the_provider_cannot_unmask_a_single_upload() -> None:
    """Everything the provider holds after a round with a dropout, thrown at one upload."""
    r = setup_round(n=5, t=3, size=4096)
    survivors = ["t0", "t1", "t2", "t3"]
    masked = upload(r, survivors)
    resp = answers(r, survivors, survivors)
    p.unmask(r.roster, r.dealt, masked, resp)  # the legitimate result works
    # The provider reconstructs every secret its answers allow: seeds of survivors, keys of
    # the dropped t4. It removes from t0's upload the self-mask and the pairwise mask with t4.
    from fedtune.secagg import shamir

    def rebuild(u: str, kind: str) -> bytes | None:
        got = {r.roster.point(v): int(a[kind][u], 16) for v, a in resp.items() if u in a[kind]}
        return shamir.combine(got, 3) if len(got) >= 3 else None

    assert rebuild("t0", "key") is None  # no answer reveals a survivor's mask key
    seed0, key4 = rebuild("t0", "seed"), rebuild("t4", "key")
    n = 4096
    y = masked["t0"] - prg.mask(seed0, n)
    y = y - prg.mask(p.pairwise_seed(key4, r.roster.ads["t0"].mask_public, r.roster.context, "t4", "t0"), n)
    guess = fixedpoint.decode(y, FRAC)
    truth = r.values["t0"]
    assert np.abs(guess - truth).min() > 1.0  # nowhere near any coordinate
    assert abs(np.corrcoef(guess, truth)[0, 1]) < 0.1
    # Wrapping the guess into the ring: uniform bits, as any fresh mask.
    assert 0.45 < float(np.mean(y >> np.uint64(63))) < 0.55
    # Nor can it open the sealed shares: the channel keys need a tenant's private key.
    fake = keys.generate()
    ch = keys.agree(fake.private, r.roster.ads["t0"].channel_public, b"any")
    assert keys.open_sealed(ch, bytes.fromhex(r.dealt["t0"].sealed["t1"]), b"job|round-1|t0->t1") is None


# -- SecAgg+: a sparse graph (Bell et al. 2020) ------------------------------------------------
def ring(r: Round) -> list[str]:
    from fedtune.secagg import graph

    return graph._order(r.names, bytes.fromhex(r.roster.graph_seed))


def test_sparse_graph_gives_the_complete_graph_sum() -> None:
    sparse = setup_round(n=12, t=3, degree=4, size=256, seed=1)
    assert all(len(sparse.dealt[x].sealed) == 5 for x in sparse.names)  # itself + 4 neighbours
    result = p.unmask(sparse.roster, sparse.dealt, upload(sparse, sparse.names), answers(sparse, sparse.names, sparse.names))
    dense = setup_round(n=12, t=7, size=256, seed=1)  # the same values, the complete graph
    assert all(len(dense.dealt[x].sealed) == 12 for x in dense.names)
    complete = p.unmask(dense.roster, dense.dealt, upload(dense, dense.names), answers(dense, dense.names, dense.names))
    assert np.array_equal(result.total, complete.total)  # the same sum of encodings, mod 2^64
    plain = sum(sparse.values.values())
    assert np.abs(fixedpoint.decode(result.total, FRAC) - plain).max() <= 12 * 2.0 ** -(FRAC + 1)


@pytest.mark.parametrize("positions", [[0], [0, 6], [3, 4], [0, 4, 8]])
def test_sparse_graph_recovers_dropouts_up_to_the_bound(positions: list[int]) -> None:
    """Each neighbourhood of 5 loses at most 5 - t = 2 tenants; the survivors stay connected."""
    r = setup_round(n=12, t=3, degree=4, seed=2)
    dropped = [ring(r)[i] for i in positions]
    survivors = [x for x in r.names if x not in dropped]
    result = p.unmask(r.roster, r.dealt, upload(r, survivors), answers(r, survivors, survivors))
    plain = sum(r.values[x] for x in survivors)
    assert np.abs(fixedpoint.decode(result.total, FRAC) - plain).max() < 1e-6


def test_sparse_graph_below_the_bound_fails_listing_every_tenant() -> None:
    r = setup_round(n=12, t=3, degree=4, seed=3)
    order = ring(r)
    dropped = order[0:3]  # three neighbours in a row: each keeps only 2 of its 5 share holders
    survivors = [x for x in r.names if x not in dropped]
    with pytest.raises(SecureAggregationError) as info:
        p.unmask(r.roster, r.dealt, upload(r, survivors), answers(r, survivors, survivors))
    text = str(info.value)
    for u in dropped:
        assert f"{u!r}'s key: 2 valid share(s) revealed, threshold is 3" in text


def test_a_tenant_refuses_to_unmask_survivors_that_fall_apart() -> None:
    """A partial sum is exposed when the survivors split: the answer is refused."""
    r = setup_round(n=8, t=2, degree=2, seed=4)  # a ring
    order = ring(r)
    survivors = [order[i] for i in (0, 1, 4, 5)]
    with pytest.raises(SecureAggregationError, match="fall apart into 2 parts"):
        p.respond(order[0], r.held[order[0]], r.names, survivors, r.roster)


# -- signed advertisements and share messages -------------------------------------------------
def test_a_tampered_advertisement_is_refused_naming_its_tenant() -> None:
    s = {f"t{i}": p.TenantSecrets.new() for i in range(3)}
    routed = ads(s)
    evil = p.TenantSecrets.new()
    # The provider swaps t1's mask key for its own, keeping t1's signature.
    routed["t1"] = p.Advertisement("t1", routed["t1"].channel_public, evil.masking.public, routed["t1"].identity, routed["t1"].signature)
    with pytest.raises(SecureAggregationError) as info:
        p.deal("t0", s["t0"], p.Roster(CONTEXT, 2, routed), REGISTERED, IDENTITY["t0"][0])
    assert "the advertisement of tenant 't1' fails its signature check" in str(info.value)
    assert "tenants[].identity_key" in info.value.fix


def test_a_forged_advertisement_is_refused_naming_its_tenant() -> None:
    s = {f"t{i}": p.TenantSecrets.new() for i in range(3)}
    routed = ads(s)
    forger, _ = identity.generate()  # the provider's own identity, not t2's registered one
    routed["t2"] = p.TenantSecrets.new().advertisement("t2", CONTEXT, forger)
    with pytest.raises(SecureAggregationError) as info:
        p.deal("t0", s["t0"], p.Roster(CONTEXT, 2, routed), REGISTERED, IDENTITY["t0"][0])
    assert "the advertisement of tenant 't2' carries identity key" in str(info.value)
    assert "not 't2''s registered" in str(info.value)


def test_an_advertisement_signed_for_another_round_is_refused() -> None:
    s = {f"t{i}": p.TenantSecrets.new() for i in range(3)}
    routed = ads(s)
    routed["t1"] = s["t1"].advertisement("t1", "job|round-0", IDENTITY["t1"][0])  # replayed
    with pytest.raises(SecureAggregationError, match="tenant 't1' fails its signature check"):
        p.deal("t0", s["t0"], p.Roster(CONTEXT, 2, routed), REGISTERED, IDENTITY["t0"][0])


def test_a_tampered_share_message_is_set_aside_naming_its_dealer() -> None:
    r = setup_round(n=3, t=2)
    part = r.dealt["t0"].part("t1")
    part.commitments["t1"] = {"seed": "0" * 64, "key": "0" * 64}
    held, problems = p.open_shares("t1", r.secrets["t1"], r.roster, {"t0": part}, REGISTERED)
    assert held == {} and problems == {"t0": "the share message of 't0' for 't1' fails its signature check"}


def test_unregistered_identities_fall_back_to_the_advertised_key_and_are_listed() -> None:
    r = setup_round(n=3, t=2)
    keys_, unregistered = p.identities_of(r.roster, {"t0": REGISTERED["t0"]})
    assert unregistered == ["t1", "t2"] and keys_ == {x: REGISTERED[x] for x in r.names}


@pytest.mark.parametrize(
    ("n", "degree"), [(n, None) for n in range(2, 8)] + [(5, 2), (7, 2), (8, 4)]
)
def test_a_lone_survivor_is_never_unmasked_at_any_valid_threshold(n: int, degree: int | None) -> None:
    """The sum of one upload is that upload: whatever the roster size, graph and valid
    threshold (a majority of each neighbourhood), neither the lone uploader's own tenant nor
    the provider's unmasking goes on, so a round where all others drop exposes no one."""
    full = (degree or n - 1) + 1
    for t in range(full // 2 + 1, full + 1):
        r = setup_round(n=n, t=t, size=8, degree=degree)
        for lone in r.names:
            with pytest.raises(SecureAggregationError, match="below the threshold"):
                p.respond(lone, r.held[lone], r.names, [lone], r.roster)
            # Even given every other tenant's answer for that split, the provider refuses.
            others = {v: {p.SEED: {}, p.KEY: {}} for v in r.names if v != lone}
            with pytest.raises(SecureAggregationError, match=r"1 masked upload\(s\)"):
                p.unmask(r.roster, r.dealt, upload(r, [lone]), others)
