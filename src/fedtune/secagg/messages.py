"""The messages of a secure-aggregation round (JSON, hex bytes: nothing here unpickles).

Advertisements and share parts carry Ed25519 signatures (:mod:`fedtune.secagg.identity`); the
roster carries the public graph parameters every party checks against the job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from fedtune.secagg import graph, identity, keys

SEED, KEY = "seed", "key"


@dataclass(frozen=True)
class Advertisement:
    """A tenant's public keys for one round, signed with its identity key (whose public
    half it carries; receivers trust the registered key, see :func:`identities_of`)."""

    tenant: str
    channel_public: bytes
    mask_public: bytes
    identity: bytes = b""
    signature: str = ""

    def signed_part(self, context: str) -> dict[str, str]:
        return {
            "context": context,
            "tenant": self.tenant,
            "channel": self.channel_public.hex(),
            "mask": self.mask_public.hex(),
            "identity": self.identity.hex(),
        }

    def to_json(self) -> dict[str, str]:
        return {
            "tenant": self.tenant,
            "channel": self.channel_public.hex(),
            "mask": self.mask_public.hex(),
            "identity": self.identity.hex(),
            "signature": self.signature,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Advertisement:
        return cls(
            str(data["tenant"]),
            bytes.fromhex(data["channel"]),
            bytes.fromhex(data["mask"]),
            bytes.fromhex(data.get("identity", "")),
            str(data.get("signature", "")),
        )


def identities_of(roster: Roster, registered: Mapping[str, bytes | None]) -> tuple[dict[str, bytes], list[str]]:
    """The identity key to verify each advertiser against: the registered one, else (for a
    tenant registered with none) the one its advertisement carries; and those unregistered.

    An unregistered identity protects against nothing the provider does (it could replace
    the key with the advertisement); it only binds a tenant's messages of one round together.
    """
    keys_: dict[str, bytes] = {}
    unregistered: list[str] = []
    for name, ad in roster.ads.items():
        known = registered.get(name)
        if known is None:
            unregistered.append(name)
            keys_[name] = ad.identity
        else:
            keys_[name] = known
    return keys_, sorted(unregistered)


@dataclass(frozen=True)
class TenantSecrets:
    """What a tenant keeps private for one round: its key pairs and self-mask seed."""

    channel: keys.KeyPair
    masking: keys.KeyPair
    seed: bytes | None = None

    @classmethod
    def new(cls) -> TenantSecrets:
        return cls(keys.generate(), keys.generate())

    def to_json(self) -> dict[str, str | None]:
        return {
            "channel": self.channel.private.hex(),
            "mask": self.masking.private.hex(),
            "seed": self.seed.hex() if self.seed is not None else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TenantSecrets:
        ch, mk = bytes.fromhex(data["channel"]), bytes.fromhex(data["mask"])
        seed = bytes.fromhex(data["seed"]) if data.get("seed") else None
        return cls(keys.KeyPair(ch, keys.public_of(ch)), keys.KeyPair(mk, keys.public_of(mk)), seed)

    def advertisement(self, tenant: str, context: str, signing_key: bytes) -> Advertisement:
        """The public halves, signed for ``context`` with the tenant's identity key."""
        ad = Advertisement(tenant, self.channel.public, self.masking.public, identity.public_of(signing_key))
        return replace(ad, signature=identity.sign(signing_key, "advert", ad.signed_part(context)))


@dataclass(frozen=True)
class Roster:
    """Every advertisement of a round (U1), the threshold, the round's context string and the
    public graph: the sampled tenants, their degree and the seed that orders them."""

    context: str
    threshold: int
    ads: dict[str, Advertisement]
    sampled: tuple[str, ...] = ()
    degree: int | None = None  # None: the complete graph
    graph_seed: str = ""

    @property
    def names(self) -> list[str]:
        return sorted(self.ads)

    @cached_property
    def graph(self) -> graph.Graph:
        """Neighbours of every sampled tenant (of every advertiser when ``sampled`` is empty)."""
        nodes = sorted(set(self.sampled) | set(self.ads))
        k = len(nodes) - 1 if self.degree is None else self.degree
        return graph.harary(nodes, k, bytes.fromhex(self.graph_seed))

    def neighbourhood(self, tenant: str) -> list[str]:
        """``{tenant} + N(tenant)`` among the advertisers: who holds the tenant's shares."""
        return sorted((self.graph.get(tenant, frozenset()) | {tenant}) & set(self.ads))

    def point(self, tenant: str) -> int:
        """The tenant's Shamir share point."""
        return self.names.index(tenant) + 1

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context,
            "threshold": self.threshold,
            "ads": [self.ads[n].to_json() for n in self.names],
            "sampled": list(self.sampled),
            "degree": self.degree,
            "graph_seed": self.graph_seed,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Roster:
        ads = [Advertisement.from_json(a) for a in data["ads"]]
        degree = data.get("degree")
        return cls(
            str(data["context"]),
            int(data["threshold"]),
            {a.tenant: a for a in ads},
            tuple(str(n) for n in data.get("sampled", ())),
            None if degree is None else int(degree),
            str(data.get("graph_seed", "")),
        )


@dataclass(frozen=True)
class Dealt:
    """One dealer's step-2 output: per recipient a sealed share pair, commitments and the
    dealer's signature over them; the seed hash."""

    dealer: str
    sealed: dict[str, str]  # recipient -> hex ciphertext of {"seed": hex, "key": hex}
    commitments: dict[str, dict[str, str]]  # recipient -> {"seed": sha256, "key": sha256}
    seed_hash: str
    signatures: dict[str, str] = field(default_factory=dict)  # recipient -> Ed25519 hex

    def part(self, recipient: str) -> Dealt:
        """What the provider routes to ``recipient``: its own entry, still signed."""
        pick = [recipient] if recipient in self.sealed else []
        return Dealt(
            self.dealer,
            {r: self.sealed[r] for r in pick},
            {r: self.commitments[r] for r in pick if r in self.commitments},
            self.seed_hash,
            {r: self.signatures[r] for r in pick if r in self.signatures},
        )

    def signed_part(self, context: str, recipient: str) -> dict[str, Any]:
        return {
            "context": context,
            "dealer": self.dealer,
            "recipient": recipient,
            "sealed": self.sealed.get(recipient),
            "commitments": self.commitments.get(recipient),
            "seed_hash": self.seed_hash,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "dealer": self.dealer,
            "sealed": self.sealed,
            "commitments": self.commitments,
            "seed_hash": self.seed_hash,
            "signatures": self.signatures,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Dealt:
        return cls(
            str(data["dealer"]),
            dict(data["sealed"]),
            dict(data["commitments"]),
            str(data["seed_hash"]),
            dict(data.get("signatures", {})),
        )
