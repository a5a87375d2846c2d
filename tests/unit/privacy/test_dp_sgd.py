"""A tenant's example-level DP-SGD: its epsilon, its per-example clipping, its bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dp_accounting
import pytest
import torch
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant

from fedtune.config import parse_job
from fedtune.config.capabilities import dp_sgd_algorithms
from fedtune.config.dp_sgd import DpSgdConfig
from fedtune.core.errors import ConfigError, PrivacyBudgetError
from fedtune.engines.fingerprint import config_fingerprint
from fedtune.engines.steps import TenantEnv
from fedtune.engines.tenant import dp_sgd as dp_sgd_steps
from fedtune.models import lora as lora_helpers
from fedtune.privacy.example_level import epsilon, sample_rate
from fedtune.training.context import ExampleBatches
from fedtune.training.dp_sgd import PrivateRun, running
from fedtune.training.local import train_local
from tests.integration.conftest import tiny_job_dict
from tests.integration.test_algorithm_table import JOB_OVERRIDES, TABLE

GOOD = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}
#: Opacus' default RDP orders, given to the independent accountant so both evaluate the same curve.
OPACUS_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))


def _library_epsilon(rounds: list[tuple[float, float, int]], delta: float) -> float:
    """dp-accounting's RDP accountant: Poisson-subsampled Gaussian steps, add/remove one example."""
    accountant = RdpAccountant(orders=OPACUS_ORDERS)
    for z, q, steps in rounds:
        accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return float(accountant.get_epsilon(delta))


@pytest.mark.parametrize(
    ("rounds", "delta"),
    [
        ([(1.0, 0.05, 2)], 1e-5),
        ([(1.1, 0.01, 100), (1.1, 0.01, 100), (1.1, 0.01, 100)], 1e-5),
        ([(0.8, 0.2, 10), (2.0, 0.2, 10)], 1e-6),
        ([(1.0, 1.0, 5)], 1e-5),  # no sampling: every example every step
    ],
    ids=["two-steps", "three-rounds", "noise-changed", "full-batch"],
)
def test_rdp_epsilon_matches_an_independent_accountant(
    rounds: list[tuple[float, float, int]], delta: float
) -> None:
    ours = epsilon(rounds, delta, "rdp")
    # Not bit-equal: dp-accounting drops fractional orders whose series does not converge
    # (sigma 0.8, q 0.2), where Opacus evaluates them; the bounds then differ by < 0.1 %.
    assert ours == pytest.approx(_library_epsilon(rounds, delta), rel=1e-3)


def test_prv_epsilon_is_close_to_the_pld_accountant() -> None:
    rounds = [(1.0, 0.02, 200)]
    pld = PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.0)), 200)
    assert epsilon(rounds, 1e-5, "prv") == pytest.approx(pld.get_epsilon(1e-5), rel=0.05)
    assert epsilon(rounds, 1e-5, "prv") < epsilon(rounds, 1e-5, "rdp")  # RDP is the looser bound


def test_epsilon_composes_over_rounds_and_none_spent_is_zero() -> None:
    assert epsilon([], 1e-5) == 0.0
    per_round = [(1.0, 0.1, 10)] * 3
    assert epsilon(per_round, 1e-5) == pytest.approx(epsilon([(1.0, 0.1, 30)], 1e-5), rel=1e-12)
    assert epsilon(per_round[:1], 1e-5) < epsilon(per_round[:2], 1e-5) < epsilon(per_round, 1e-5)
    assert sample_rate(8, 81) == pytest.approx(8 / 81) and sample_rate(8, 5) == 1.0


# -- the loop on the tiny LoRA model --------------------------------------------------------
def _env(tmp_path: Path, **training: Any) -> TenantEnv:
    d = tiny_job_dict(tmp_path)
    d["training"] = {**d["training"], **training}
    return TenantEnv.create(parse_job(d), "tenant-a")


def _one_step(
    env: TenantEnv, encoded: list[dict[str, list[int]]], clip: float, noise: float = 1e-9,
    noise_seed: int = 2,
) -> dict[str, torch.Tensor]:
    """Clipped gradient sum + noise of one full-batch step (q = 1), read off SGD at lr 1."""
    model = env.ctx.peft_model(None)
    before = lora_helpers.adapter_state(model)
    params = lora_helpers.trainable_parameters(model)
    config = DpSgdConfig(noise_multiplier=noise, max_grad_norm=clip)
    run = PrivateRun("tenant-a", config, [], sample_seed=1, noise_seed=noise_seed)
    batches = ExampleBatches(encoded, 1, 0, len(encoded), env.ctx.tokenizer().pad_token_id)
    with running(run):
        train_local(model, params, batches, env.job.training, seed=0)
    after = lora_helpers.adapter_state(model)
    # w' = w - lr * (sum + noise) / expected batch, with lr 1 and an expected batch of N.
    return {k: (before[k].double() - after[k].double()) * len(encoded) for k in before}


def _norm(tensors: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(sum((t**2).sum() for t in tensors.values())))


def _contribution(env: TenantEnv, base: list[Any], extra: Any, clip: float) -> float:
    with_it, without = _one_step(env, [*base, extra], clip), _one_step(env, base, clip)
    return _norm({k: with_it[k] - without[k] for k in with_it})


def test_clipping_bounds_one_huge_example_contribution(tmp_path: Path) -> None:
    env = _env(tmp_path, optimizer="sgd", lr=1.0)
    encoded = env.ctx.encode(env.data().train)
    base, outlier = encoded[:5], encoded[5]
    unclipped = _contribution(env, base, outlier, clip=1e6)
    clip = unclipped / 1000  # the extra example's gradient is a thousand times the bound
    clipped = _contribution(env, base, outlier, clip=clip)
    assert clipped <= clip * 1.001
    assert clipped == pytest.approx(clip, rel=1e-3)  # scaled down to C, not dropped
    within = _contribution(env, base, outlier, clip=unclipped * 2)
    assert within == pytest.approx(unclipped, rel=1e-3)  # below the bound: untouched


def test_noise_has_std_sigma_c_and_comes_from_the_secret_seed(tmp_path: Path) -> None:
    env = _env(tmp_path, optimizer="sgd", lr=1.0)
    encoded = env.ctx.encode(env.data().train)[:4]
    one = _one_step(env, encoded, clip=0.01, noise=2.0, noise_seed=11)
    again = _one_step(env, encoded, clip=0.01, noise=2.0, noise_seed=11)
    other = _one_step(env, encoded, clip=0.01, noise=2.0, noise_seed=12)
    assert all(torch.equal(one[k], again[k]) for k in one)  # same secret seed: same noise
    diff = torch.cat([(one[k] - other[k]).flatten() for k in one])
    # Two independent draws differ by N(0, 2 sigma^2 C^2) per coordinate (C = 0.01, sigma = 2).
    assert float(diff.std()) == pytest.approx(2**0.5 * 2.0 * 0.01, rel=0.1)


def test_hooks_are_removed_after_training(tmp_path: Path) -> None:
    env = _env(tmp_path)
    encoded = env.ctx.encode(env.data().train)
    _one_step(env, encoded[:3], clip=1.0)
    model = env.ctx.peft_model(None)
    assert not any(m._forward_hooks or m._backward_hooks for m in model.modules())
    assert not any(hasattr(p, "grad_sample") for p in model.parameters())


def test_target_epsilon_refuses_the_round_that_would_exceed_it() -> None:
    step = (1.0, 8 / 81, 2)
    target = (epsilon([step], 1e-5) + epsilon([step] * 2, 1e-5)) / 2  # one round fits, two do not
    config = DpSgdConfig(noise_multiplier=1.0, max_grad_norm=1.0, target_epsilon=target)
    assert PrivateRun("t", config, [], 1, 2).budget_check(step) == epsilon([step], 1e-5)
    with pytest.raises(PrivacyBudgetError, match=r"refuses to train.*above its dp_sgd.target_epsilon="):
        PrivateRun("t", config, [step], 1, 2).budget_check(step)


# -- the setting: the job's and the tenant's own -------------------------------------------
def test_bad_values_are_collected_in_one_config_error(tmp_path: Path) -> None:
    d = tiny_job_dict(tmp_path)
    d["tenants"][0]["dp_sgd"] = {"noise_multiplier": -1.0, "max_grad_norm": 0.0, "delta": 1.5}
    with pytest.raises(ConfigError) as caught:
        parse_job(d)
    text = caught.value.render()
    assert "3 problem(s)" in text
    for field in ("dp_sgd.noise_multiplier", "dp_sgd.max_grad_norm", "dp_sgd.delta"):
        assert field in text


@pytest.mark.parametrize("algorithm", sorted(TABLE))
def test_a_tenants_dp_sgd_is_refused_by_exactly_the_algorithms_outside_the_loop(
    tmp_path: Path, algorithm: str
) -> None:
    d = tiny_job_dict(tmp_path, algorithm=TABLE[algorithm], **JOB_OVERRIDES.get(algorithm, {}))
    parse_job(d)  # a valid job without dp_sgd
    d["tenants"][0]["dp_sgd"] = GOOD
    if algorithm in dp_sgd_algorithms():
        assert parse_job(d).tenants[0].dp_sgd is not None
        return
    with pytest.raises(ConfigError, match=r"cannot apply a tenant's dp_sgd.*remove tenants\[\]\.dp_sgd"):
        parse_job(d)


def test_fingerprint_ignores_absent_dp_sgd_and_the_target(tmp_path: Path) -> None:
    plain = parse_job(tiny_job_dict(tmp_path))
    d = tiny_job_dict(tmp_path)
    d["tenants"][0]["dp_sgd"] = GOOD
    on = parse_job(d)
    d["tenants"][0]["dp_sgd"] = {**GOOD, "target_epsilon": 5.0}
    assert config_fingerprint(on) != config_fingerprint(plain)
    assert config_fingerprint(parse_job(d)) == config_fingerprint(on)


def test_the_tenants_own_policy_wins_over_the_job(tmp_path: Path) -> None:
    env = _env(tmp_path)
    assert dp_sgd_steps.setting(env) == (None, "job")
    own = Path(env.own.uri.removeprefix("file://")) / dp_sgd_steps.POLICY_KEY
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(json.dumps({"noise_multiplier": 2.0, "max_grad_norm": 0.5}))  # uploaded by hand
    config, source = dp_sgd_steps.setting(env)
    assert source == "tenant" and config == DpSgdConfig(noise_multiplier=2.0, max_grad_norm=0.5)
    own.write_text(json.dumps({"noise_multiplier": 0, "max_grad_norm": 0.5}))
    with pytest.raises(ConfigError, match=r"its own dp-sgd.json is invalid: noise_multiplier"):
        dp_sgd_steps.setting(env)


def test_a_step_that_does_not_train_through_dp_sgd_is_withheld(tmp_path: Path) -> None:
    from fedtune.core.messages import Update

    env = _env(tmp_path)
    run = PrivateRun("tenant-a", DpSgdConfig(**GOOD), [], 1, 2)
    with pytest.raises(ConfigError, match="did not train through DP-SGD, so its update is withheld"):
        dp_sgd_steps.finish(env, 1, run, Update(tensors={}, meta={"num_samples": 1}))


def test_a_tenant_policy_the_algorithm_cannot_apply_makes_the_step_refuse(tmp_path: Path) -> None:
    d = tiny_job_dict(tmp_path, algorithm=TABLE["fewfedpit"], **JOB_OVERRIDES.get("fewfedpit", {}))
    env = TenantEnv.create(parse_job(d), "tenant-a")
    env.own.put_json(dp_sgd_steps.POLICY_KEY, GOOD)
    with pytest.raises(ConfigError, match=r"sets dp-sgd.json in its own store, but algorithm 'fewfedpit' cannot"):
        dp_sgd_steps.setting(env)


def test_the_worker_pool_never_splits_a_dp_sgd_step(tmp_path: Path) -> None:
    from fedtune.engines.workers import _split_steps

    d = tiny_job_dict(tmp_path)
    assert _split_steps(parse_job(d)) == 2
    d["tenants"][1]["dp_sgd"] = GOOD
    assert _split_steps(parse_job(d)) is None


def test_empty_poisson_batches_are_noise_only_steps(tmp_path: Path) -> None:
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler

    env = _env(tmp_path)
    encoded = env.ctx.encode(env.data().train)[:20]
    q, sample_seed = 1 / 20, 5
    drawn = list(UniformWithReplacementSampler(
        num_samples=20, sample_rate=q, steps=6, generator=torch.Generator().manual_seed(sample_seed)))
    assert [] in drawn and any(drawn)  # this seed draws empty and non-empty batches
    model = env.ctx.peft_model(None)
    before = lora_helpers.adapter_state(model)
    run = PrivateRun("tenant-a", DpSgdConfig(**GOOD), [], sample_seed=sample_seed, noise_seed=3)
    batches = ExampleBatches(encoded, 6, 0, 1, env.ctx.tokenizer().pad_token_id)
    with running(run):
        result = train_local(model, lora_helpers.trainable_parameters(model), batches, env.job.training, seed=0)
    after = lora_helpers.adapter_state(model)
    assert result.steps == 6 and run.applied is not None and run.applied["sample_rate"] == q
    assert all(torch.isfinite(after[k]).all() and not torch.equal(after[k], before[k]) for k in before)


def test_a_model_opacus_cannot_handle_is_a_config_error(tmp_path: Path) -> None:
    class WithBatchNorm(torch.nn.Module):  # trainable layer with buffers: no per-example gradients
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.BatchNorm1d(4)

    env = _env(tmp_path)
    model = WithBatchNorm()
    run = PrivateRun("tenant-a", DpSgdConfig(**GOOD), [], 1, 2)
    batches = ExampleBatches(env.ctx.encode(env.data().train), 1, 0, 4, 0)
    with running(run), pytest.raises(ConfigError, match=r"Opacus cannot compute per-example gradients.*BatchNorm1d"):
        train_local(model, dict(model.named_parameters()), batches, env.job.training, seed=0)
    assert not model.training
