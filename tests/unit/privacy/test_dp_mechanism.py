"""DP-FedAvg's pieces against independent computations: clipping, noise, adaptive clipping."""

from __future__ import annotations

import math

import pytest
import torch

from fedtune.config.privacy import DifferentialPrivacyConfig
from fedtune.privacy.adaptive import next_clip_norm, noised_unclipped_fraction
from fedtune.privacy.clipping import clip, l2_norm
from fedtune.privacy.mechanism import RoundPlan, clipped_sum, privatize, release
from fedtune.privacy.noise import secret_generator


def _adapter(scale: float, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.lora_A": scale * torch.randn(4, 8, generator=g),
        "a.lora_B": scale * torch.randn(8, 4, generator=g),
    }


def test_a_huge_delta_is_clipped_to_the_bound_and_keeps_its_direction() -> None:
    delta = _adapter(1e6)
    clipped, norm = clip(delta, 0.5)
    assert norm == pytest.approx(l2_norm(delta))
    assert l2_norm(clipped) == pytest.approx(0.5, rel=1e-6)
    flat = torch.cat([v.flatten() for v in delta.values()]).double()
    flat_clipped = torch.cat([v.flatten() for v in clipped.values()]).double()
    assert torch.allclose(flat_clipped, flat * (0.5 / flat.norm()), rtol=1e-5)


def test_a_small_delta_is_left_as_it_is() -> None:
    delta = _adapter(1e-3)
    clipped, _ = clip(delta, 10.0)
    assert all(torch.equal(clipped[k], delta[k]) for k in delta)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan])
def test_a_bad_bound_is_refused(bound: float) -> None:
    with pytest.raises(ValueError, match="clip bound must be a positive finite number"):
        clip(_adapter(1.0), bound)


def test_a_non_finite_update_cannot_be_clipped() -> None:
    delta = _adapter(1.0)
    delta["a.lora_A"][0, 0] = math.inf
    with pytest.raises(ValueError, match="non-finite L2 norm"):
        clip(delta, 1.0)


def test_the_tenant_uploads_reference_plus_clipped_delta() -> None:
    reference = _adapter(0.1, seed=1)
    trained = {k: v + _adapter(1e4, seed=2)[k] for k, v in reference.items()}
    plan = RoundPlan(round=1, clip_norm=0.25, noise_share_std=0.0, report_unclipped=True)
    upload, fitted = privatize(trained, reference, plan, secret_generator())
    assert not fitted
    delta = {k: upload[k].double() - reference[k].double() for k in reference}
    assert l2_norm(delta) <= 0.25 * (1 + 1e-5)
    assert all(upload[k].dtype == reference[k].dtype for k in reference)


def test_the_noise_share_has_the_planned_spread() -> None:
    reference = {"w": torch.zeros(200_000)}
    plan = RoundPlan(round=1, clip_norm=1.0, noise_share_std=0.3, report_unclipped=False)
    upload, fitted = privatize(reference, reference, plan, secret_generator())
    assert fitted
    assert float(upload["w"].std()) == pytest.approx(0.3, rel=0.01)


def test_two_draws_differ_so_the_noise_is_not_derived_from_a_known_seed() -> None:
    zeros = {"w": torch.zeros(16)}
    first = release(zeros, 1.0, 1, secret_generator())
    second = release(zeros, 1.0, 1, secret_generator())
    assert not torch.equal(first["w"], second["w"])


def test_the_provider_reclips_a_tenant_that_skipped_clipping_and_divides_by_the_expected_count() -> None:
    reference = _adapter(0.1, seed=3)
    honest = {k: v + 1e-3 for k, v in reference.items()}
    cheat = {k: v + 1e3 for k, v in reference.items()}
    total = clipped_sum([honest, cheat], reference, clip_norm=0.5)
    cheat_part = {k: total[k] - (honest[k].double() - reference[k].double()) for k in total}
    assert l2_norm(cheat_part) == pytest.approx(0.5, rel=1e-6)
    mean = release(total, 0.0, 4, secret_generator())  # 4 expected, 2 arrived: the fixed denominator
    assert all(torch.allclose(mean[k], total[k] / 4) for k in total)


def test_adaptive_clipping_follows_the_geometric_update_of_andrew_et_al() -> None:
    # Algorithm 1: C <- C exp(-eta (b~ - gamma)).
    assert next_clip_norm(0.1, 0.9, 0.5, 0.2) == pytest.approx(0.1 * math.exp(-0.2 * 0.4))
    assert next_clip_norm(0.1, 0.1, 0.5, 0.2) > 0.1  # most updates clipped: C grows
    # With (almost) no count noise the noised fraction is the plain fraction.
    g = secret_generator()
    assert noised_unclipped_fraction([True, True, False, True], 4, 1e-12, g) == pytest.approx(0.75)
    # The fixed denominator: one of four expected arrived, unclipped.
    assert noised_unclipped_fraction([True], 4, 1e-12, g) == pytest.approx((0.5 / 4) + 0.5)


def test_the_budget_split_of_adaptive_clipping_recovers_the_total_noise_multiplier() -> None:
    dp = DifferentialPrivacyConfig.model_validate(
        {"noise_multiplier": 1.0, "clipping": {"adaptive": {"count_noise": 2.0}}}
    )
    z_delta = dp.delta_noise_multiplier(sampled=10)
    # Andrew et al. Thm. 1: the pair is a Gaussian mechanism with z = (z_D^-2 + (2 s_b)^-2)^-1/2.
    assert (z_delta**-2 + (2 * 2.0) ** -2) ** -0.5 == pytest.approx(1.0)
    assert z_delta > 1.0
    fixed = DifferentialPrivacyConfig.model_validate({"noise_multiplier": 1.0, "clipping": {"norm": 1.0}})
    assert fixed.delta_noise_multiplier(sampled=10) == 1.0
