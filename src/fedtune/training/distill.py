"""The emulator-alignment losses of FedBiOT Eq. 2, with padding masked.

``L(E) = L2(E(x), E*(x)) + lambda * KL(M(x; A, E*) || M(x; A, E))``: the distance between
the emulator's and the non-compressed emulator's output activations, plus the KL divergence
from the full model with the current adapter (teacher) to the emulator with the same adapter
(student). The paper prints the KL's arguments in the other order; its text ("the output
distribution of the full model-adapter combination and the emulator-adapter") and the
reference's distillation use the teacher as the reference distribution, as here.

Both terms are means over real tokens only: positions with ``attention_mask == 0`` carry no
weight (the reference averages over padding too, so its loss depends on batch-mates' lengths).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_RMS_FLOOR = 1e-6


def _weights(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weights = mask.to(torch.float32)
    return weights, weights.sum().clamp_min(1.0)


def masked_l2(
    student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, *, normalize: bool = True
) -> torch.Tensor:
    """Mean over real tokens of the squared activation distance, per hidden unit.

    Args:
        student: Emulator output activations (B, T, H).
        teacher: E* output activations (B, T, H); no gradient flows into them.
        mask: Attention mask (B, T); 0 marks padding.
        normalize: Divide the difference by the teacher's per-token RMS (scale-free, as in the
            reference) instead of the plain mean squared error.
    """
    target = teacher.detach().to(torch.float32)
    diff = student.to(torch.float32) - target
    if normalize:
        rms = target.pow(2).mean(dim=-1, keepdim=True).sqrt().clamp_min(_RMS_FLOOR)
        diff = diff / rms
    per_token = diff.pow(2).mean(dim=-1)
    weights, count = _weights(mask)
    return (per_token * weights).sum() / count


def masked_kl(
    teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean over real tokens of ``KL(p_teacher || p_student)`` over the vocabulary (B, T, V)."""
    teacher_logp = F.log_softmax(teacher_logits.detach().to(torch.float32), dim=-1)
    student_logp = F.log_softmax(student_logits.to(torch.float32), dim=-1)
    per_token = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(dim=-1)
    weights, count = _weights(mask)
    return (per_token * weights).sum() / count


def alignment_loss(
    *,
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_logits: torch.Tensor | None,
    teacher_logits: torch.Tensor | None,
    mask: torch.Tensor,
    kl_lambda: float,
    normalize: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. 2 on one batch: ``L2 + kl_lambda * KL``; returns the loss and both terms' values.

    With ``kl_lambda == 0`` the KL term is not part of the graph at all (logits may then be
    None), so it cannot move the emulator even through numerical noise.
    """
    l2 = masked_l2(student_hidden, teacher_hidden, mask, normalize=normalize)
    parts = {"l2": float(l2.detach())}
    if kl_lambda == 0.0:
        return l2, parts
    if student_logits is None or teacher_logits is None:
        raise ValueError("alignment_loss needs both logits when kl_lambda > 0")
    kl = masked_kl(teacher_logits, student_logits, mask)
    parts["kl"] = float(kl.detach())
    return l2 + kl_lambda * kl, parts


def topk_kd(
    student_logp: torch.Tensor, teacher_ids: torch.Tensor, teacher_logp: torch.Tensor
) -> torch.Tensor:
    """Mean over rows of ``KL(p_teacher || p_student)`` for a teacher given as top-k.

    Args:
        student_logp: Student log-probabilities (Q, V) over its full vocabulary.
        teacher_ids: (Q, k) student-vocabulary ids the teacher puts mass on.
        teacher_logp: (Q, k) the teacher's log-probabilities there (``-inf`` = no mass); each
            row is renormalised over its k entries, so a top-k truncation is a distribution.
    """
    if teacher_ids.shape[0] == 0:
        return student_logp.new_zeros(())
    teacher = torch.log_softmax(teacher_logp.to(torch.float32), dim=-1)
    probs = teacher.exp()
    student = student_logp.gather(1, teacher_ids.long())
    terms = torch.where(probs > 0, probs * (teacher - student), torch.zeros_like(probs))
    return terms.sum(dim=-1).mean()


def weighted_ce_kd(ce: torch.Tensor, kd: torch.Tensor, ce_weight: float) -> torch.Tensor:
    """``ce_weight * CE + (1 - ce_weight) * KD`` (FedMKT, paper 003, Eq. L_2 / L_3, lambda =
    ``ce_weight``); a zero weight drops its term from the graph."""
    if ce_weight == 1.0:
        return ce
    if ce_weight == 0.0:
        return kd
    return ce_weight * ce + (1.0 - ce_weight) * kd
