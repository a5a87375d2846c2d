"""Knowledge messages: per public sample a CE and per response token the top-k predictions
(paper 003, Section 3: "a knowledge set consisting of loss-logit pairs" on the public set).

A :class:`Knowledge` is a handful of flat arrays, stored as safetensors (never lists):

- ``sample``   int32 (N,)    index of each sample in the public set;
- ``ce``       float32 (N,)  the sample's CE per character (see below);
- ``tokens``   int32 (T,)    every sample's token ids back to back (the receiver aligns them);
- ``token_offsets`` int64 (N+1,);
- ``positions`` int32 (P,)   response token positions inside each sample's tokens;
- ``position_offsets`` int64 (N+1,);
- ``topk_ids`` int32 (P, k) and ``topk_logprobs`` float16 (P, k): the k most likely next
  tokens predicting each response token, as log-probabilities (softmax-invariant, so the
  receiver's renormalised top-k distribution equals the logits', and fp16 never overflows).

CE normalisation: the summed negative log-likelihood of the response tokens (EOS included)
divided by the response's character count. Every party scores the same text, so the
denominator is the same for all on a sample and DualMinCE compares total likelihoods of the
text; a per-token mean would favour the tokenizer that cuts the text into more (easier) pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedtune.core.errors import ConfigError
from fedtune.data.tokenize import collate
from fedtune.eval._model_utils import model_device
from fedtune.training.precision import model_autocast

FIELDS = ("sample", "ce", "tokens", "token_offsets", "positions", "position_offsets", "topk_ids", "topk_logprobs")


@dataclass(frozen=True)
class Knowledge:
    """One party's knowledge on the public set (see the module docstring for the fields)."""

    sample: np.ndarray
    ce: np.ndarray
    tokens: np.ndarray
    token_offsets: np.ndarray
    positions: np.ndarray
    position_offsets: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray

    @property
    def top_k(self) -> int:
        """k of the top-k rows."""
        return int(self.topk_ids.shape[1])

    def to_tensors(self, prefix: str = "knowledge") -> dict[str, torch.Tensor]:
        """The arrays as tensors named ``<prefix>/<field>`` (for a message)."""
        return {f"{prefix}/{name}": torch.from_numpy(np.ascontiguousarray(getattr(self, name))) for name in FIELDS}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str = "knowledge") -> Knowledge:
        """Read back what :meth:`to_tensors` wrote."""
        return cls(**{name: tensors[f"{prefix}/{name}"].numpy() for name in FIELDS})

    def sample_tokens(self, row: int) -> np.ndarray:
        """Token ids of the ``row``-th sample of this message."""
        return self.tokens[self.token_offsets[row] : self.token_offsets[row + 1]]

    def sample_topk(self, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions, topk_ids, topk_logprobs) of the ``row``-th sample."""
        s = slice(int(self.position_offsets[row]), int(self.position_offsets[row + 1]))
        return self.positions[s], self.topk_ids[s], self.topk_logprobs[s]


# fp16 rounding of log-probabilities: the top-k probabilities may sum a little over 1.
_LOGSUMEXP_SLACK = 1e-2


def value_problems(t: dict[str, torch.Tensor]) -> list[str]:
    """What is out of bounds in the knowledge arrays ``t`` (field -> tensor, shapes and dtypes
    already checked): each a sentence, empty when every value is one a model could produce.

    A received CE decides DualMinCE's choice of teacher (paper 003, Eq. 4), so a negative or
    non-finite one would win every sample; log-probabilities must be finite, at most 0 and
    sum (as probabilities) to at most 1; offsets must cut the arrays into consecutive
    in-range pieces, positions point inside their sample, and samples appear once each."""
    problems: list[str] = []
    ce, logprobs = t["ce"], t["topk_logprobs"].float()
    if not torch.isfinite(ce).all():
        problems.append("ce holds NaN/Inf")
    elif (ce < 0).any():
        problems.append(f"ce holds a negative value ({float(ce.min()):.4g}); a cross-entropy is >= 0")
    if not torch.isfinite(logprobs).all():
        problems.append("topk_logprobs holds NaN/Inf")
    elif logprobs.numel():
        if (logprobs > 0).any():
            problems.append(f"topk_logprobs holds a positive log-probability ({float(logprobs.max()):.4g})")
        mass = float(torch.logsumexp(logprobs, dim=1).max())
        if mass > _LOGSUMEXP_SLACK:
            problems.append(f"a top-k row's probabilities sum to {np.exp(mass):.4g}, more than 1")
    cut = True
    for offsets, array in (("token_offsets", "tokens"), ("position_offsets", "positions")):
        o, n = t[offsets], t[array].shape[0]
        if o.numel() and (int(o[0]) != 0 or int(o[-1]) != n or bool((o[1:] < o[:-1]).any())):
            problems.append(f"{offsets} do not cut {array} ({n} entries) into consecutive pieces from 0")
            cut = False
    if cut:
        problems += _position_problems(t)
    sample = t["sample"]
    if (sample < 0).any() or sample.unique().numel() != sample.numel():
        problems.append("sample indices are negative or repeated")
    return problems


def _position_problems(t: dict[str, torch.Tensor]) -> list[str]:
    """Each sample's response positions lie inside its own tokens (1 .. length - 1)."""
    per_sample = torch.diff(t["position_offsets"])
    rows = torch.repeat_interleave(torch.arange(per_sample.numel()), per_sample)
    lengths = torch.diff(t["token_offsets"])[rows]
    positions = t["positions"].long()
    outside = rows[(positions < 1) | (positions >= lengths)]
    if outside.numel():
        row = int(outside[0])
        return [f"positions of sample row {row} fall outside its {int(lengths[rows == row][0])} tokens"]
    return []


def check_top_k(top_k: int, vocab_size: int, who: str) -> None:
    """Refuse a top-k larger than a vocabulary it is taken from.

    Raises:
        ConfigError: ``top_k`` exceeds ``vocab_size``.
    """
    if top_k > vocab_size:
        raise ConfigError(
            f"algorithm.top_k={top_k} is larger than the vocabulary of {who} ({vocab_size} tokens)",
            fix=f"Set algorithm.top_k to at most {vocab_size} (the smallest vocabulary in the job).",
        )


def response_positions(labels: Sequence[int]) -> np.ndarray:
    """Positions of response tokens (labels not -100); position 0 predicts nothing."""
    out = [t for t, label in enumerate(labels) if label != -100 and t > 0]
    return np.asarray(out, dtype=np.int64)


def compute_knowledge(
    model: Any,
    rows: Sequence[dict[str, list[int]]],
    samples: Sequence[int],
    chars: Sequence[int],
    *,
    pad_id: int,
    vocab_size: int,
    top_k: int,
    batch_size: int,
) -> Knowledge:
    """The model's knowledge on encoded public ``rows`` (``samples``: their public indices,
    ``chars``: their responses' character counts). Logits beyond ``vocab_size`` (padding of
    the embedding) are ignored."""
    ce = np.zeros(len(rows), dtype=np.float32)
    pos_list: list[np.ndarray] = []
    ids_list: list[np.ndarray] = []
    lp_list: list[np.ndarray] = []
    device = model_device(model)
    model.eval()
    for start in range(0, len(rows), batch_size):
        chunk = list(rows[start : start + batch_size])
        batch = collate(chunk, pad_id)
        with torch.no_grad(), model_autocast(model):
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
        for b, row in enumerate(chunk):
            positions = response_positions(row["labels"])
            logp = F.log_softmax(logits[b, positions - 1, :vocab_size].float(), dim=-1).cpu()
            target = torch.as_tensor(np.asarray(row["input_ids"])[positions])
            nll = -logp.gather(1, target[:, None]).sum()
            ce[start + b] = float(nll) / max(int(chars[start + b]), 1)
            values, ids = logp.topk(top_k, dim=-1)
            pos_list.append(positions.astype(np.int32))
            ids_list.append(ids.numpy().astype(np.int32))
            lp_list.append(values.numpy().astype(np.float16))
    lengths = [len(r["input_ids"]) for r in rows]
    return Knowledge(
        sample=np.asarray(samples, dtype=np.int32),
        ce=ce,
        tokens=np.concatenate([np.asarray(r["input_ids"], dtype=np.int32) for r in rows]),
        token_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        positions=np.concatenate(pos_list),
        position_offsets=np.concatenate([[0], np.cumsum([len(p) for p in pos_list])]).astype(np.int64),
        topk_ids=np.concatenate(ids_list),
        topk_logprobs=np.concatenate(lp_list),
    )
