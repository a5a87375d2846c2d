"""FewFedPIT behind the phase interface (paper 004, Algorithm 1).

The provider is FedAvg's: it broadcasts the global adapter W^g and averages what comes back,
weighted by the tenants' local record counts (lines 12-14). The tenant's step is the paper's:

6. W^l <- LocTrain(D_k, W^g): FedAvg's client step on the local data, reused as is;
7. D^syn <- SynGen(W^l, W^g, D_k): candidates from M^g, filtered, the best by IFS under M^l;
8. W^g_k <- LocTrain(D^syn, W^g): the public adapter trained on the synthetic data only;
9. upload beta * W^l + (1 - beta) * W^g_k.

W^l and the synthetic data stay in the tenant's store (client state, ``synthetic/round-N.jsonl``);
the provider sees the mix and counts (how many candidates each filter dropped, how many kept).
The kept W^l is the tenant's own (the paper's private parameters, "managed locally by each
client"), never an input: line 6 retrains W^l from W^g every round, so no step reads it back.
At ``beta = 1`` the upload is FedAvg's (the paper: "degenerates into FedIT"), so synthesis,
whose product would get zero weight, is skipped.
"""

from __future__ import annotations

from fedtune.algorithms.fedavg.algorithm import LoraFedAlgorithm
from fedtune.algorithms.fewfedpit import client
from fedtune.algorithms.fewfedpit.config import FewFedPITConfig
from fedtune.algorithms.registry import register
from fedtune.core.messages import Broadcast, ClientState, Update, prefixed
from fedtune.training.context import TenantContext, TenantData


def synthetic_key(round_index: int) -> str:
    """Where a tenant keeps round ``round_index``'s synthetic data in its own store."""
    return f"synthetic/round-{round_index}.jsonl"


@register
class FewFedPIT(LoraFedAlgorithm[FewFedPITConfig]):
    """FedAvg on the provider; parameter isolation and local aggregation on the tenant."""

    def client_step(
        self,
        ctx: TenantContext,
        broadcast: Broadcast,
        data: TenantData,
        client_state: ClientState | None,
    ) -> tuple[Update, ClientState | None]:
        """Algorithm 1, lines 6-10 (W^l restarts from W^g every round, as line 6 says)."""
        update, _ = super().client_step(ctx, broadcast, data, None)  # line 6
        round_index = int(broadcast.meta["round"])
        global_adapter = broadcast.group("adapter")
        private = update.group("adapter")
        if self.config.beta == 1.0:
            public = client.PublicTraining(
                adapter=global_adapter, flags=["fewfedpit/beta-one"]
            )
        else:
            public = client.train_public(
                ctx, self.config, global_adapter, private, list(data.train), round_index
            )
        mixed = client.local_aggregation(private, public.adapter, self.config.beta)  # line 9
        meta = dict(update.meta)
        meta["metrics"] = {**meta.get("metrics", {}), **public.metrics}
        if public.flags:
            meta["flags"] = public.flags
        files = {}
        if public.kept:
            files[synthetic_key(round_index)] = client.synthetic_jsonl(
                public.kept, public.scores, round_index
            )
        # W^l kept for the tenant (see the module docstring); the next round does not read it.
        state = ClientState(
            tensors=prefixed("private", private),
            meta={
                "round": round_index,
                "beta": self.config.beta,
                "synthetic": next(iter(files), None),
                "synthetic_examples": len(public.kept),
            },
            files=files,
        )
        return Update(tensors=prefixed("adapter", mixed), meta=meta), state
