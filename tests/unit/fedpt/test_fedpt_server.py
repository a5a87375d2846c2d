"""FedPT's provider: Eq. 5 against a reference, distillation, the once-per-job cache, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from fedtune.algorithms.fedpt import server
from fedtune.algorithms.fedpt.algorithm import FedPT
from fedtune.algorithms.fedpt.config import FedPTConfig
from fedtune.config.job import LoraConfig, TinyModelConfig, TrainingConfig
from fedtune.core.errors import ConfigError, ModelError
from fedtune.core.messages import Update, prefixed
from fedtune.models.loading import save_pretrained_dir
from fedtune.models.tokenizer import load_tokenizer
from fedtune.storage import open_store
from fedtune.training.context import ProviderContext
from tests.helpers.models import tiny_llama_for

PUBLIC = Path(__file__).resolve().parents[3] / "examples" / "data" / "quickstart" / "public.jsonl"
SMALL = {"source": "tiny", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64}
LARGE = {**SMALL, "hidden_size": 48, "num_layers": 3, "init_seed": 1}


# LoRA on every projection: on attention alone a fresh tiny model cannot sharpen its nearly
# uniform outputs towards a peaked teacher, whatever the loss.
ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def context(tmp_path: Path, store: bool = True) -> ProviderContext:
    return ProviderContext(
        seed=3,
        model_config=TinyModelConfig(**SMALL, max_position_embeddings=256),  # type: ignore[arg-type]
        lora_config=LoraConfig(r=4, alpha=8, target_modules=ALL_PROJECTIONS),
        training=TrainingConfig(batch_size=4, max_seq_len=96, lr=0.01),
        tokenizer_spec="builtin",
        num_tenants=2,
        public_data_uri=str(PUBLIC),
        store=open_store(str(tmp_path / "provider")) if store else None,
    )


def algorithm(**fields: Any) -> FedPT:
    settings: dict[str, Any] = {
        "name": "fedpt",
        "large_model": LARGE,
        "kd_size": 16,
        "kd_batch_size": 4,
        "kd_steps": 4,
        "max_generation_examples": 0,
        **fields,
    }
    return FedPT(FedPTConfig(**settings))


def test_eq5_loss_matches_a_reference_written_with_torch_losses() -> None:
    torch.manual_seed(0)
    rows = [
        {"input_ids": [1, 5, 6, 7, 8], "labels": [-100, -100, 6, 7, 8], "attention_mask": [1] * 5},
        {"input_ids": [1, 9, 4, 3, 0], "labels": [-100, -100, -100, 3, -100], "attention_mask": [1, 1, 1, 1, 0]},
    ]
    vocab = 11
    logits = torch.randn(2, 5, vocab, requires_grad=True)
    teacher = [F.log_softmax(torch.randn(len(server.response_positions(r)), vocab), -1) for r in rows]
    loss, ce, kl = server.eq5_loss(logits, rows, teacher, gamma=0.3)
    labels = torch.tensor([r["labels"] for r in rows])
    ref_ce = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1), ignore_index=-100)
    student = F.log_softmax(logits[:, :-1], -1)
    mask = labels[:, 1:] != -100
    ref_kl = F.kl_div(student[mask], torch.cat(teacher), log_target=True, reduction="sum") / mask.sum()
    torch.testing.assert_close(loss, ref_ce + 0.3 * ref_kl)
    assert ce == pytest.approx(float(ref_ce.detach())) and kl == pytest.approx(float(ref_kl))


def test_proxy_teacher_is_eq3_renormalised() -> None:
    torch.manual_seed(1)
    large, pre, ft = (F.log_softmax(torch.randn(3, 7), -1) for _ in range(3))
    (got,) = server.proxy_teacher([large], [pre], [ft], 0.5)
    torch.testing.assert_close(got, F.log_softmax(large + 0.5 * (ft - pre), -1))


def _one_update(state: Any, scale: float) -> dict[str, Update]:
    adapter = {n: t + scale * torch.randn_like(t) for n, t in state.group("adapter").items()}
    return {"t": Update(tensors=prefixed("adapter", adapter), meta={"num_samples": 10})}


def shift_low_rank(model: torch.nn.Module, scale: float = 1.0) -> None:
    """A teacher the student can reach: the small model plus rank-2 changes of projections.

    (A sharpened or unrelated random model is no test: the final norm keeps LoRA from
    sharpening a tiny model, so KL cannot fall whatever the loss.)
    """
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("down_proj.weight", "o_proj.weight")):
                rows, cols = param.shape
                left = torch.randn(rows, 2, generator=generator)
                param.add_(scale * left @ torch.randn(2, cols, generator=generator))


def test_distillation_lowers_kl_of_proxy_to_small_on_held_out_public_data(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    algo = algorithm(gamma=10.0, kd_lr=0.02, kd_steps=12, kd_size=24, large_model=SMALL)
    shift_low_rank(algo.large(ctx).local_model)  # type: ignore[arg-type]
    state = algo.init_state(ctx)
    updates = _one_update(state, 0.0)
    after = algo.aggregate(ctx, state, updates, 1)
    metrics = after.meta["metrics"]
    assert metrics["kd/steps"] == 12
    assert metrics["kd/heldout_kl_after"] < 0.7 * metrics["kd/heldout_kl_before"], metrics
    # The next broadcast is the distilled adapter, not the average.
    assert not all(
        torch.equal(after.group("adapter")[n], t) for n, t in updates["t"].group("adapter").items()
    )


def test_fedavg_pt_does_not_distil(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    algo = algorithm(name="fedavg-pt")
    state = algo.init_state(ctx)
    updates = _one_update(state, 0.02)
    after = algo.aggregate(ctx, state, updates, 1)
    for name, tensor in updates["t"].group("adapter").items():
        assert torch.equal(after.group("adapter")[name], tensor)
    assert "kd/steps" not in after.meta["metrics"]


def test_large_model_is_queried_once_per_job_across_rounds_and_processes(tmp_path: Path) -> None:
    ctx = context(tmp_path)
    algo = algorithm()
    large = algo.large(ctx).source
    state = algo.init_state(ctx)
    sets = algo.public(ctx)
    assert sets is not None
    n_rows = len(sets.kd) + len(sets.heldout)
    assert state.meta["large_queries"] == n_rows and large.calls > 0  # type: ignore[attr-defined]
    calls = large.calls  # type: ignore[attr-defined]
    for round_index in (1, 2, 3):
        state = algo.aggregate(ctx, state, _one_update(state, 0.01), round_index)
        assert state.meta["metrics"]["fedpt/large_queries"] == 0
    assert large.calls == calls  # type: ignore[attr-defined]
    # A new process (a resumed job, the next pod) finds the cache in the provider's store.
    fresh_ctx = context(tmp_path)
    fresh = algorithm()
    assert fresh.init_state(fresh_ctx).meta["large_queries"] == 0
    assert fresh.large(fresh_ctx).source.calls == 0  # type: ignore[attr-defined]
    cached = [k for k in fresh_ctx.store.list("fedpt/")]
    assert len(cached) == 1 and cached[0].startswith(server.CACHE_PREFIX)


def test_a_kd_set_larger_than_the_public_set_is_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"kd_size=5000 is larger than the public set.*100 examples"):
        algorithm(kd_size=5000).init_state(context(tmp_path))


def test_a_missing_large_model_directory_is_refused(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    algo = algorithm(large_model={"source": "pretrained", "uri": str(missing)})
    with pytest.raises(ModelError, match="is not a directory"):
        algo.init_state(context(tmp_path))


def test_a_large_model_with_another_vocabulary_is_refused(tmp_path: Path) -> None:
    tokenizer = load_tokenizer("builtin")
    tokenizer.add_tokens(["<only-in-large>"])
    model = tiny_llama_for(tokenizer, max_positions=128)
    large_dir = save_pretrained_dir(model, tokenizer, tmp_path / "large")
    algo = algorithm(large_model={"source": "pretrained", "uri": str(large_dir)})
    small_size = len(load_tokenizer("builtin"))
    with pytest.raises(ConfigError) as err:
        algo.init_state(context(tmp_path))
    message = str(err.value)
    assert f"({small_size} tokens" in message and f"({small_size + 1} tokens" in message
    assert "'<only-in-large>'" in message
