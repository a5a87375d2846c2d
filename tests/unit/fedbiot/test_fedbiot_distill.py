"""Eq. 2 losses: masked to real tokens, KL direction, and lambda = 0 leaving KL out."""

from __future__ import annotations

import math

import pytest
import torch

from fedtune.training.distill import alignment_loss, masked_kl, masked_l2

G = torch.Generator().manual_seed(3)


def _pair(shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(*shape, generator=G), torch.randn(*shape, generator=G)


def test_padding_positions_do_not_change_either_term() -> None:
    student, teacher = _pair((2, 5, 8))
    s_logits, t_logits = _pair((2, 5, 11))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    l2, kl = masked_l2(student, teacher, mask), masked_kl(t_logits, s_logits, mask)
    # Garbage at the padded positions of row 0 must not matter.
    student2, s_logits2 = student.clone(), s_logits.clone()
    student2[0, 3:] = 1e3
    s_logits2[0, 3:] = -1e3
    assert torch.allclose(masked_l2(student2, teacher, mask), l2)
    assert torch.allclose(masked_kl(t_logits, s_logits2, mask), kl)


def test_l2_is_mean_over_real_tokens() -> None:
    student = torch.zeros(1, 3, 2)
    teacher = torch.tensor([[[1.0, 1.0], [2.0, 2.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    plain = masked_l2(student, teacher, mask, normalize=False)
    assert math.isclose(float(plain), (1.0 + 4.0) / 2)
    # Normalised by the teacher's RMS per token: every real token then contributes 1.
    assert math.isclose(float(masked_l2(student, teacher, mask)), 1.0, rel_tol=1e-6)


def test_kl_is_zero_for_equal_logits_and_takes_the_teacher_as_reference() -> None:
    logits = torch.randn(1, 4, 6, generator=G)
    mask = torch.ones(1, 4)
    assert float(masked_kl(logits, logits, mask)) == pytest.approx(0.0, abs=1e-6)
    teacher = torch.tensor([[[5.0, 0.0, 0.0]]])
    student = torch.tensor([[[0.0, 0.0, 0.0]]])
    p = torch.softmax(teacher[0, 0], -1)
    expected = float((p * (p.log() - math.log(1 / 3))).sum())
    assert float(masked_kl(teacher, student, torch.ones(1, 1))) == pytest.approx(expected, rel=1e-5)


def test_lambda_zero_keeps_kl_out_of_the_graph() -> None:
    student, teacher = _pair((1, 3, 4))
    s_logits = torch.randn(1, 3, 5, generator=G, requires_grad=True)
    t_logits = torch.randn(1, 3, 5, generator=G)
    mask = torch.ones(1, 3)
    loss, parts = alignment_loss(
        student_hidden=student, teacher_hidden=teacher, student_logits=s_logits,
        teacher_logits=t_logits, mask=mask, kl_lambda=0.0,
    )
    assert "kl" not in parts and not loss.requires_grad
    loss, parts = alignment_loss(
        student_hidden=student, teacher_hidden=teacher, student_logits=s_logits,
        teacher_logits=t_logits, mask=mask, kl_lambda=0.5,
    )
    assert loss.item() == pytest.approx(parts["l2"] + 0.5 * parts["kl"], rel=1e-6)
    loss.backward()
    assert s_logits.grad is not None and s_logits.grad.abs().sum() > 0
