"""The SecAgg+ protocol of one round as pure functions of each party (Bonawitz et al. 2017;
Bell et al. 2020 for the sparse graph).

Steps, with U1 >= U2 >= U3 the tenants still present at each and N(u) the neighbours of u in
the round's public graph (:mod:`fedtune.secagg.graph`; every other tenant by default):

1. **Advertise** (tenant): two X25519 key pairs, one for the share channel, one for masks,
   signed with the tenant's long-term Ed25519 identity (:mod:`fedtune.secagg.identity`).
2. **Share** (tenant, after the provider routes the roster U1): verify every advertisement
   against the registered identities; draw a self-mask seed ``b``; Shamir-share ``b`` and the
   mask private key among ``{u} + N(u)`` in U1; seal each share for its recipient
   (ChaCha20-Poly1305 under an X25519/HKDF channel key) with a hash commitment per share, and
   sign each recipient's part.
3. **Masked upload** (tenant, after the provider routes the sealed shares of U2):
   ``y = encode(x) + PRG(b) + sum_{v in N(u) & U2, v > u} PRG(s_uv) - sum_{v < u} PRG(s_uv)``.
4. **Unmask** (tenant, told the uploaders U3): reveal its share of ``b_u`` for u in U3 and of
   the mask key for u in U2 \\ U3, never both for one u, and only while U3 is connected in
   the graph (else a partial sum would be exposed); the provider reconstructs, removes the
   self-masks of U3 and the pairwise masks left by dropped tenants: the sum remains.

Every message is JSON (hex bytes): nothing here unpickles. The names are tenant names; a
tenant's share point is its 1-based position in the sorted roster.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedtune.core.errors import SecureAggregationError
from fedtune.secagg import graph, identity, keys, prg, shamir
from fedtune.secagg.messages import (
    KEY,
    SEED,
    Advertisement,
    Dealt,
    Roster,
    TenantSecrets,
    identities_of,
)

__all__ = [
    "KEY",
    "SEED",
    "Advertisement",
    "Dealt",
    "Roster",
    "TenantSecrets",
    "UnmaskResult",
    "check_roster",
    "deal",
    "identities_of",
    "mask",
    "open_shares",
    "pairwise_seed",
    "respond",
    "unmask",
]


@dataclass
class UnmaskResult:
    """The unmasked sum and the shares set aside on the way (named, with why)."""

    total: np.ndarray
    rejected: list[tuple[str, str]] = field(default_factory=list)  # (revealer, why)

    @property
    def rejected_shares(self) -> list[str]:
        """Why each set-aside share was set aside."""
        return [why for _, why in self.rejected]

    @property
    def offenders(self) -> dict[str, list[str]]:
        """Each tenant whose revealed shares were set aside, with why."""
        out: dict[str, list[str]] = {}
        for who, why in self.rejected:
            out.setdefault(who, []).append(why)
        return out


def _pair_info(context: str, kind: str, a: str, b: str) -> bytes:
    lo, hi = sorted((a, b))
    return f"{context}|{kind}|{lo}|{hi}".encode()


def _seed_hash(context: str, dealer: str, seed: bytes) -> str:
    return hashlib.sha256(f"{context}|{dealer}|seed|".encode() + seed).hexdigest()


def _tag(roster: Roster, dealer: str, kind: str) -> str:
    return f"{roster.context}|{dealer}|{kind}"


def _channel(secrets_: TenantSecrets, roster: Roster, me: str, peer: str) -> bytes:
    return keys.agree(
        secrets_.channel.private, roster.ads[peer].channel_public, _pair_info(roster.context, "channel", me, peer)
    )


def check_roster(
    roster: Roster, me: str, secrets_: TenantSecrets, identities: Mapping[str, bytes]
) -> None:
    """A tenant's checks of the routed roster before it deals shares.

    Raises:
        SecureAggregationError: Listing every problem: its own keys missing or replaced, an
            advertisement whose signature does not verify against the advertiser's identity
            key (named), a neighbourhood smaller than the threshold, or a threshold that is
            not a majority of the neighbourhood.
    """
    problems = []
    mine = roster.ads.get(me)
    if mine is None or (mine.channel_public, mine.mask_public) != (secrets_.channel.public, secrets_.masking.public):
        problems.append(f"the roster does not carry tenant {me!r}'s advertised keys")
    for name in roster.names:
        ad = roster.ads[name]
        public = identities.get(name)
        if ad.tenant != name:
            problems.append(f"the advertisement filed under {name!r} names tenant {ad.tenant!r}")
        elif public is None:
            problems.append(f"tenant {name!r} has no identity key to verify its advertisement against")
        elif ad.identity != public:
            problems.append(
                f"the advertisement of tenant {name!r} carries identity key {ad.identity.hex()[:16]}..., "
                f"not {name!r}'s registered {public.hex()[:16]}... (substituted keys)"
            )
        elif not identity.verify(public, "advert", ad.signed_part(roster.context), ad.signature):
            problems.append(
                f"the advertisement of tenant {name!r} fails its signature check against {name!r}'s "
                "identity key (forged or substituted keys)"
            )
    size = len(roster.neighbourhood(me)) if me in roster.ads else 0
    full = len(roster.graph.get(me, frozenset())) + 1
    if not full // 2 < roster.threshold <= full:
        problems.append(
            f"threshold {roster.threshold} for a neighbourhood of {full} tenants is not in {full // 2 + 1}..{full}; "
            "below a majority the provider could learn single updates"
        )
    elif size < roster.threshold:
        problems.append(
            f"only {size} of tenant {me!r}'s neighbourhood of {full} advertised keys, fewer than the threshold {roster.threshold}"
        )
    if problems:
        raise SecureAggregationError(
            f"tenant {me!r} refuses the roster of {roster.context!r}: " + "; ".join(problems),
            fix="The provider must route the signed advertisements unchanged; check each named "
            "tenant's registered identity key (tenants[].identity_key) and re-run the round.",
        )


def deal(
    me: str, secrets_: TenantSecrets, roster: Roster, identities: Mapping[str, bytes], signing_key: bytes
) -> tuple[TenantSecrets, Dealt]:
    """Step 2: draw the self-mask seed and seal signed shares of it and of the mask key for
    ``me``'s neighbourhood in U1."""
    check_roster(roster, me, secrets_, identities)
    seed = os.urandom(prg.SEED_BYTES)
    points = {name: roster.point(name) for name in roster.neighbourhood(me)}
    seed_shares = shamir.split(seed, points.values(), roster.threshold)
    key_shares = shamir.split(secrets_.masking.private, points.values(), roster.threshold)
    sealed: dict[str, str] = {}
    commitments: dict[str, dict[str, str]] = {}
    for name, x in points.items():
        plain = json.dumps({SEED: f"{seed_shares[x]:x}", KEY: f"{key_shares[x]:x}"}).encode()
        aad = f"{roster.context}|{me}->{name}".encode()
        sealed[name] = keys.seal(_channel(secrets_, roster, me, name), plain, aad).hex()
        commitments[name] = {
            SEED: shamir.commitment(_tag(roster, me, SEED), x, seed_shares[x]),
            KEY: shamir.commitment(_tag(roster, me, KEY), x, key_shares[x]),
        }
    dealt = Dealt(me, sealed, commitments, _seed_hash(roster.context, me, seed))
    signatures = {r: identity.sign(signing_key, "dealt", dealt.signed_part(roster.context, r)) for r in sealed}
    return replace(secrets_, seed=seed), replace(dealt, signatures=signatures)


def open_shares(
    me: str, secrets_: TenantSecrets, roster: Roster, dealt: Mapping[str, Dealt], identities: Mapping[str, bytes]
) -> tuple[dict[str, dict[str, int]], dict[str, str]]:
    """Step 3 (tenant): unseal the shares addressed to ``me``; return (held, problems by dealer)."""
    held: dict[str, dict[str, int]] = {}
    problems: dict[str, str] = {}
    x = roster.point(me)
    for dealer, item in sorted(dealt.items()):
        public = identities.get(dealer)
        signature = item.signatures.get(me, "")
        if public is None or not identity.verify(public, "dealt", item.signed_part(roster.context, me), signature):
            problems[dealer] = f"the share message of {dealer!r} for {me!r} fails its signature check"
            continue
        blob = item.sealed.get(me)
        plain = None
        if blob is not None and dealer in roster.ads:
            aad = f"{roster.context}|{dealer}->{me}".encode()
            plain = keys.open_sealed(_channel(secrets_, roster, me, dealer), bytes.fromhex(blob), aad)
        if plain is None:
            problems[dealer] = f"the share sealed by {dealer!r} for {me!r} is missing or fails authentication"
            continue
        pair = {k: int(v, 16) for k, v in json.loads(plain).items()}
        ok = all(
            shamir.commitment(_tag(roster, dealer, k), x, pair[k]) == item.commitments.get(me, {}).get(k)
            for k in (SEED, KEY)
        )
        if not ok:
            problems[dealer] = f"the share dealt by {dealer!r} to {me!r} does not match its commitment"
            continue
        held[dealer] = pair
    return held, problems


def pairwise_seed(private: bytes, peer_public: bytes, context: str, me: str, peer: str) -> bytes:
    """The mask seed ``s_uv`` two tenants share (X25519 + HKDF)."""
    return keys.agree(private, peer_public, _pair_info(context, "mask", me, peer))


def mask(
    me: str, secrets_: TenantSecrets, roster: Roster, sharers: Iterable[str], encoded: np.ndarray
) -> np.ndarray:
    """Step 3 (tenant): the masked upload of an encoded vector (uint64, mod 2^64)."""
    if secrets_.seed is None:
        raise SecureAggregationError(
            f"tenant {me!r} has no self-mask seed for {roster.context!r}",
            fix="Run the share step of this round before the masked upload.",
        )
    n = len(encoded)
    out = np.asarray(encoded, dtype=np.uint64) + prg.mask(secrets_.seed, n)
    for peer in sorted(set(sharers) & set(roster.neighbourhood(me)) - {me}):
        m = prg.mask(pairwise_seed(secrets_.masking.private, roster.ads[peer].mask_public, roster.context, me, peer), n)
        out = out + m if me < peer else out - m
    return out


def respond(
    me: str,
    held: Mapping[str, Mapping[str, int]],
    sharers: Iterable[str],
    survivors: Iterable[str],
    roster: Roster,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, str]]:
    """Step 4 (tenant): reveal seed shares of ``survivors`` and key shares of the dropped.

    Raises:
        SecureAggregationError: ``me`` is not a survivor, survivors are not sharers, fewer
            than the threshold of ``me``'s neighbourhood survived, the survivors fall apart
            in the graph (each part's sum would be exposed), or an earlier answer of this
            round named a different split (revealing both shares of one tenant would expose
            its update).
    """
    sharers_, survivors_ = sorted(set(sharers)), sorted(set(survivors))
    threshold = roster.threshold
    problems = []
    if me not in survivors_:
        problems.append(f"tenant {me!r} is not among the uploaders {survivors_}")
    if not set(survivors_) <= set(sharers_):
        problems.append(f"uploaders {sorted(set(survivors_) - set(sharers_))} never dealt shares")
    near = sorted(set(survivors_) & set(roster.neighbourhood(me)))
    if len(near) < threshold:
        problems.append(f"{len(near)} uploader(s) {near} in {me!r}'s neighbourhood is below the threshold {threshold}")
    parts = graph.components(roster.graph, survivors_)
    if len(parts) > 1:
        problems.append(f"the uploaders fall apart into {len(parts)} parts {parts} of the graph")
    if previous is not None and sorted(previous.get(SEED, {})) != [u for u in survivors_ if u in held]:
        problems.append(f"tenant {me!r} already answered this round for uploaders {sorted(previous.get(SEED, {}))}")
    if problems:
        raise SecureAggregationError(
            "unmasking request refused: " + "; ".join(problems),
            fix="Start the round over (new keys); a tenant answers one unmasking request per round.",
        )
    return {
        SEED: {u: f"{held[u][SEED]:x}" for u in survivors_ if u in held},
        KEY: {u: f"{held[u][KEY]:x}" for u in sharers_ if u not in survivors_ and u in held},
    }


def _recover(
    roster: Roster,
    item: Dealt,
    kind: str,
    responses: Mapping[str, Mapping[str, Mapping[str, str]]],
    rejected: list[tuple[str, str]],
    reasons: list[str],
) -> bytes | None:
    """Reconstruct one dealer's seed or key from the revealed shares that match commitments."""
    u = item.dealer
    good: dict[int, int] = {}
    for v, answer in sorted(responses.items()):
        raw = answer.get(kind, {}).get(u)
        if raw is None or v not in roster.ads:
            continue
        x = roster.point(v)
        try:
            y = int(raw, 16)
        except (TypeError, ValueError):
            y = -1
        if shamir.commitment(_tag(roster, u, kind), x, y) != item.commitments.get(v, {}).get(kind):
            rejected.append((v, f"share of {u!r}'s {kind} revealed by {v!r} does not match {u!r}'s commitment"))
            continue
        good[x] = y
    if len(good) < roster.threshold:
        reasons.append(
            f"{u!r}'s {kind}: {len(good)} valid share(s) revealed, threshold is {roster.threshold}"
        )
        return None
    secret = shamir.combine(good, roster.threshold)
    valid = secret is not None and (
        _seed_hash(roster.context, u, secret) == item.seed_hash
        if kind == SEED
        else keys.public_of(secret) == roster.ads[u].mask_public
    )
    if not valid:
        reasons.append(f"{u!r} dealt inconsistent shares of its {kind} (they do not reconstruct its commitment)")
        return None
    return secret


def unmask(
    roster: Roster,
    dealt: Mapping[str, Dealt],
    masked: Mapping[str, np.ndarray],
    responses: Mapping[str, Mapping[str, Mapping[str, str]]],
) -> UnmaskResult:
    """Provider: the sum of the encoded updates of the uploaders ``masked`` (mod 2^64).

    Raises:
        SecureAggregationError: Listing every reason the sum cannot be recovered.
    """
    reasons: list[str] = []
    rejected: list[tuple[str, str]] = []
    sharers = sorted(dealt)
    survivors = sorted(masked)
    strangers = sorted(set(survivors) - set(sharers))
    if strangers:
        reasons.append(f"masked uploads from {strangers}, who dealt no shares")
    if len(survivors) < roster.threshold:
        reasons.append(f"{len(survivors)} masked upload(s) {survivors}, threshold is {roster.threshold}")
    lengths = sorted({len(v) for v in masked.values()})
    if len(lengths) > 1:
        reasons.append(f"masked uploads differ in length: {lengths}")
    answered = sorted(responses)
    if len(answered) < roster.threshold:
        reasons.append(f"{len(answered)} unmasking answer(s) {answered}, threshold is {roster.threshold}")
    recovered: dict[str, bytes] = {}
    if not reasons:
        for u in sharers:
            kind = SEED if u in masked else KEY
            secret = _recover(roster, dealt[u], kind, responses, rejected, reasons)
            if secret is not None:
                recovered[u] = secret
    if reasons:
        raise SecureAggregationError(
            f"secure aggregation of {roster.context!r} cannot recover the sum: " + "; ".join(reasons),
            fix="Fix or drop the named tenants and re-run the round, or lower secure_aggregation.threshold "
            "(it must stay above half of each neighbourhood).",
        )
    n = lengths[0]
    links = roster.graph
    total = np.zeros(n, dtype=np.uint64)
    for u in survivors:
        total = total + np.asarray(masked[u], dtype=np.uint64) - prg.mask(recovered[u], n)
    for u in sorted(set(sharers) - set(survivors)):
        for v in sorted(set(survivors) & links.get(u, frozenset())):
            m = prg.mask(pairwise_seed(recovered[u], roster.ads[v].mask_public, roster.context, u, v), n)
            total = total - m if v < u else total + m  # v added +m when v < u, else -m
    return UnmaskResult(total=total, rejected=rejected)
