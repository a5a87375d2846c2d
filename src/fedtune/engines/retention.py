"""Keeping only the newest server states (``storage.state_retention``).

At 7B a server state (FedBiOT: adapter, emulator and the tenants' view of it) is tens of GB,
so a run keeps the tensors of its newest ``state_retention`` states and drops older ones once
a newer round is completely recorded: its state written and checksummed, then its summary.
A resume needs only the last recorded state, so pruning never costs one.

What is dropped, for every round older than the kept ones:

- the state's tensors (``state/round-N.safetensors``). Its JSON half stays: a few KB of
  metrics, run facts and the privacy ledger that accounting and the run's report read, and
  the mark that the round is done (:func:`round_recorded`).
- the provider's record of the round's broadcast (both halves): aggregation validated the
  round's updates against it and is done.
- each tenant's copy of that broadcast in the exchange (the provider's data, sent again as a
  whole or as a delta every round).

What stays: the tenants' updates and every other message in the exchange. They are the
tenants' data and the evidence of what each tenant sent; a provider deleting them would
surprise a tenant or an auditor, and next to the states they are small (adapters). Their
retention is the exchange bucket's lifecycle policy, set by whoever operates it.

Crash safety: pruning runs only after the round's summary is stored, and deletes nothing of
that round or of the ``state_retention - 1`` rounds before it. A crash before or during
pruning leaves extra objects, which the next round's pruning removes; never too few.
"""

from __future__ import annotations

import logging
import re

from fedtune.core import killpoints
from fedtune.core.messages import ServerState
from fedtune.engines import layout
from fedtune.engines.steps import ProviderEnv
from fedtune.storage.base import Store

log = logging.getLogger(__name__)

_STATE_TENSORS = re.compile(r"^state/round-(\d{6})\.safetensors$")
_BROADCAST = re.compile(r"^broadcast/round-(\d{6})\.(safetensors|json)$")
_TENANT_BROADCAST = re.compile(r"^round-(\d{6})/broadcast\.(safetensors|json)$")


def round_recorded(store: Store, round_index: int) -> bool:
    """True when round ``round_index`` is done: its summary and its state's record are stored.

    The state's JSON half is written after its tensors and outlives their pruning, so it
    marks an aggregated round whether or not the tensors are still kept.
    """
    return store.exists(layout.summary_key(round_index)) and store.exists(
        f"{layout.state_key(round_index)}.json"
    )


def _older(store: Store, prefix: str, pattern: re.Pattern[str], keep_from: int) -> list[str]:
    """Keys under ``prefix`` that ``pattern`` dates to a round before ``keep_from``."""
    return [k for k in store.list(prefix) if (m := pattern.match(k)) and int(m.group(1)) < keep_from]


def prune(env: ProviderEnv, round_index: int) -> dict[str, int]:
    """After round ``round_index`` is recorded, drop what is older than the kept states.

    Returns how many objects were deleted, by kind; nothing when the round's state is not
    completely stored (then the round is not done and nothing older may go).
    """
    store = env.store()
    if not (round_recorded(store, round_index) and ServerState.stored(store, layout.state_key(round_index))):
        return {}
    keep_from = round_index - env.job.storage.state_retention + 1
    if keep_from <= 0:
        return {}
    states = _older(store, "state/", _STATE_TENSORS, keep_from)
    broadcasts = _older(store, "broadcast/", _BROADCAST, keep_from)
    for key in states + broadcasts:
        store.delete(key)
        killpoints.reached("pruning")
    copies = 0
    for tenant in sorted(t.name for t in env.job.tenants):
        exchange = env.stores.exchange(tenant)
        for key in _older(exchange, "", _TENANT_BROADCAST, keep_from):
            exchange.delete(key)
            copies += 1
    if states or broadcasts or copies:
        log.debug(
            "round %d: pruned %d state(s), %d broadcast record(s), %d tenant copies (rounds < %d)",
            round_index, len(states), len(broadcasts), copies, keep_from,
        )
    return {"states": len(states), "broadcasts": len(broadcasts), "tenant_broadcasts": copies}
