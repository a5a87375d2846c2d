"""A tenant's example-level DP-SGD: the local training loop with Opacus' clipping and noise.

Abadi et al. 2016, "Deep Learning with Differential Privacy", Algorithm 1, per local step:
draw a Poisson batch (each example with probability ``q``), compute each example's gradient
``g_i`` over the trainable (LoRA) parameters, clip it to ``g_i / max(1, ||g_i|| / C)``, add
N(0, sigma^2 C^2) to the sum and divide by the expected batch size ``qN``. Opacus does each
part: ``GradSampleModule`` (per-example gradients by hooks), ``DPOptimizer`` (clip, noise,
scale), ``UniformWithReplacementSampler`` (Poisson batches); fedtune wires them into the
client step through one hook in :func:`fedtune.training.local.train_local`, switched on for
the duration of a tenant's step by :func:`running`.

Choices between readings, written down:

- The loss of an example is its mean token loss over its response tokens; a batch's loss is
  the mean over its examples (``loss_reduction="mean"``). The non-private loop's token mean
  over the whole batch would make one example's gradient depend on the others' lengths.
- Terms that do not read data are added after privatisation: FedProx's and FedBiOT's
  proximal gradient and SCAFFOLD's correction ``c - c_i`` (post-processing of the noisy
  gradient; they cost no privacy). Opacus' optimizer would otherwise drop them.
- Both the batches and the noise come from generators seeded by a secret of the tenant
  (never the job seed, which the provider knows): amplification by sampling assumes the
  adversary does not know the batches, and known noise could be subtracted.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional

from fedtune.config.dp_sgd import DpSgdConfig
from fedtune.config.job import TrainingConfig
from fedtune.core.errors import ConfigError, DataError, PrivacyBudgetError
from fedtune.data.tokenize import collate
from fedtune.privacy.example_level import Step, epsilon, sample_rate
from fedtune.training.context import ExampleBatches
from fedtune.training.local import _SEGMENT, Batch, Regularizer, TrainResult, make_optimizer


@dataclass
class PrivateRun:
    """One client step's DP-SGD: the tenant's setting, its secret seeds and what it applied.

    ``history`` holds the earlier rounds' ``(sigma, q, steps)``; after :meth:`train`,
    ``applied`` says what this round added and the epsilon after it.
    """

    tenant: str
    config: DpSgdConfig
    history: list[Step]
    sample_seed: int
    noise_seed: int
    source: str = "job"  # where the setting came from: the job, or the tenant's own policy
    applied: dict[str, Any] | None = None
    _calls: int = field(default=0, repr=False)

    def budget_check(self, step: Step) -> float:
        """Epsilon after this round's ``step``.

        Raises:
            PrivacyBudgetError: It would exceed the tenant's ``target_epsilon``.
        """
        cfg = self.config
        after = epsilon([*self.history, step], cfg.delta, cfg.accountant)
        if cfg.target_epsilon is not None and after > cfg.target_epsilon:
            spent = epsilon(self.history, cfg.delta, cfg.accountant)
            raise PrivacyBudgetError(
                f"tenant {self.tenant!r} refuses to train: this round's {step[2]} DP-SGD step(s) "
                f"would raise its epsilon from {spent:.3f} to {after:.3f} at delta={cfg.delta:g}, "
                f"above its dp_sgd.target_epsilon={cfg.target_epsilon:g}",
                fix="The tenant takes no further part (the rounds go on while the quorum holds); "
                "to go on, the tenant raises its target_epsilon or noise_multiplier.",
            )
        return after

    def train(
        self,
        model: nn.Module,
        params: dict[str, nn.Parameter],
        batches: Iterable[Batch],
        config: TrainingConfig,
        *,
        seed: int,
        regularizer: Regularizer | None = None,
        grad_correction: dict[str, torch.Tensor] | None = None,
        progress: Callable[[int, float], Any] | None = None,
    ) -> TrainResult:
        """``train_local``'s contract, with per-example clipping and noise on ``params``.

        Raises:
            ConfigError: The client step cannot be privatised as asked (its batches are not
                the tenant's examples, a second training in one step, a split step).
            DataError: The tenant has no training example.
            PrivacyBudgetError: The round would exceed the tenant's target epsilon.
        """
        self._calls += 1
        if self._calls > 1 or not isinstance(batches, ExampleBatches) or _SEGMENT.get() is not None:
            why = ("it trains more than once" if self._calls > 1
                   else "it is split across workers" if _SEGMENT.get() is not None
                   else "its batches are not drawn from the tenant's examples")
            raise ConfigError(
                f"tenant {self.tenant!r}: its client step cannot run under its dp_sgd: {why}",
                fix="Run the tenant with an algorithm that supports dp_sgd, with engine.workers: 1 "
                "if the tenant sets dp_sgd only in its own store.",
            )
        cfg = self.config
        n = len(batches.encoded)
        if n == 0:
            raise DataError(
                f"tenant {self.tenant!r} has no training example within training.max_seq_len",
                fix="Raise training.max_seq_len or give the tenant shorter records.",
            )
        q = sample_rate(batches.batch_size, n)
        after = self.budget_check((cfg.noise_multiplier, q, batches.steps))
        result = self._loop(model, params, batches, q, config, seed, regularizer, grad_correction, progress)
        self.applied = {
            "noise_multiplier": cfg.noise_multiplier,
            "max_grad_norm": cfg.max_grad_norm,
            "sample_rate": q,
            "steps": batches.steps,
            "examples": n,
            "delta": cfg.delta,
            "epsilon": after,
            "accountant": cfg.accountant,
        }
        return result

    def _loop(
        self,
        model: nn.Module,
        params: dict[str, nn.Parameter],
        batches: ExampleBatches,
        q: float,
        config: TrainingConfig,
        seed: int,
        regularizer: Regularizer | None,
        grad_correction: dict[str, torch.Tensor] | None,
        progress: Callable[[int, float], Any] | None,
    ) -> TrainResult:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer
        from opacus.utils.uniform_sampler import UniformWithReplacementSampler

        torch.manual_seed(seed)  # dropout, as in the plain loop
        n = len(batches.encoded)
        device = next(iter(params.values())).device  # wherever the caller placed the model
        model.train()
        try:
            wrapped = GradSampleModule(model, batch_first=True, loss_reduction="mean", strict=True)
        except (NotImplementedError, ValueError) as exc:  # Opacus' validation of the layers
            model.eval()
            raise ConfigError(
                f"tenant {self.tenant!r}: Opacus cannot compute per-example gradients of this "
                f"model's trainable layers: {exc}",
                fix="Train LoRA adapters (e.g. fedbiot's adapter_training: lora), or remove dp_sgd.",
            ) from None
        losses: list[float] = []
        tokens = 0
        started = time.perf_counter()
        try:
            optimizer = DPOptimizer(
                make_optimizer(list(params.values()), config),
                noise_multiplier=self.config.noise_multiplier,
                max_grad_norm=self.config.max_grad_norm,
                expected_batch_size=max(1, round(q * n)),
                loss_reduction="mean",
                generator=torch.Generator(device=device).manual_seed(self.noise_seed),
            )
            sampler = UniformWithReplacementSampler(
                num_samples=n, sample_rate=q, steps=batches.steps,
                generator=torch.Generator().manual_seed(self.sample_seed),
            )
            for step, indices in enumerate(sampler, start=1):
                optimizer.zero_grad(set_to_none=True)
                if indices:
                    batch = collate([batches.encoded[i] for i in indices], batches.pad_id)
                    batch = {k: v.to(device) for k, v in batch.items()}
                    loss = example_mean_loss(wrapped, batch)
                    with warnings.catch_warnings():  # the first LoRA input needs no gradient
                        warnings.filterwarnings("ignore", message="Full backward hook is firing")
                        loss.backward()
                    losses.append(float(loss.detach()))
                    tokens += int((batch["labels"] != -100).sum())
                else:  # an empty Poisson batch: the step is noise only
                    for p in params.values():
                        p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype, device=device)  # type: ignore[attr-defined]
                optimizer.pre_step()  # clip each example, add the noise, divide by qN
                _add_data_free_terms(params, regularizer, grad_correction)
                optimizer.original_optimizer.step()
                if progress is not None and losses:
                    progress(step, losses[-1])
        finally:
            wrapped._close()  # hooks off: the cached model also serves evaluation and later rounds
            model.eval()
        mean = sum(losses) / len(losses) if losses else float("nan")
        return TrainResult(loss=mean, steps=batches.steps, tokens=tokens,
                           seconds=time.perf_counter() - started)


def example_mean_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Mean over the batch's examples of each example's mean response-token loss."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    per_token = functional.cross_entropy(
        logits[:, :-1].transpose(1, 2).float(), labels, ignore_index=-100, reduction="none"
    )
    counts = (labels != -100).sum(dim=1).clamp(min=1)
    return (per_token.sum(dim=1) / counts).mean()


def _add_data_free_terms(
    params: dict[str, nn.Parameter],
    regularizer: Regularizer | None,
    grad_correction: dict[str, torch.Tensor] | None,
) -> None:
    """Add what does not read data to the privatised gradient (post-processing)."""
    if regularizer is not None:
        names = list(params)
        grads = torch.autograd.grad(regularizer(params), [params[n] for n in names], allow_unused=True)
        for name, grad in zip(names, grads, strict=True):
            if grad is not None:
                params[name].grad.add_(grad)  # type: ignore[union-attr]
    if grad_correction is not None:
        for name, param in params.items():
            param.grad.add_(grad_correction[name])  # type: ignore[union-attr]


_ACTIVE: ContextVar[PrivateRun | None] = ContextVar("fedtune_dp_sgd", default=None)


def active() -> PrivateRun | None:
    """The DP-SGD of the client step running in this context, if any."""
    return _ACTIVE.get()


@contextmanager
def running(run: PrivateRun | None) -> Iterator[PrivateRun | None]:
    """Train the block's client step under ``run`` (None: the plain loop)."""
    token = _ACTIVE.set(run)
    try:
        yield run
    finally:
        _ACTIVE.reset(token)
