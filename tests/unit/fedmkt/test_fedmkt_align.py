"""DP token alignment, top-k mapping, knowledge messages, DualMinCE and the loss."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.algorithms.fedmkt import align, knowledge, select, transfer, vocab
from fedtune.core.errors import ConfigError
from fedtune.storage import open_store
from fedtune.training.distill import topk_kd, weighted_ce_kd
from tests.helpers.tokenizers import byte_bpe, metaspace_bpe

SENTENCE = "we utilize the dynamic programming approach to align tokens"


def _canon(tok, text):
    canon = vocab.canonical_tokens(tok)
    return [canon[i] for i in tok(text, add_special_tokens=False)["input_ids"]]


def test_one_to_one_and_many_to_one_pairs():
    src = _canon(byte_bpe(), SENTENCE)  # 'we', '▁uti', 'lize', ..., '▁appro', 'ach', ...
    dst = _canon(metaspace_bpe(), SENTENCE)  # '▁we', '▁utilize', ..., '▁approach', ...
    assert src[1:3] == ["▁uti", "lize"] and dst[1] == "▁utilize"
    pairs = align.align_tokens(src, dst)
    # 2-to-1 groups take their first sender token (the appendix's 'util' for 'utilize').
    assert pairs == [(0, 0), (1, 1), (3, 2), (4, 3), (5, 4), (6, 5), (8, 6), (9, 7), (10, 8)]


def test_one_to_many_leaves_receiver_unmatched():
    src = ["▁we", "▁utilize", "▁it"]
    dst = ["we", "▁uti", "lize", "▁it"]
    pairs = align.align_tokens(src, dst)
    assert pairs == [(0, 0), (2, 3)]
    assert align.receiver_sources(pairs, 4).tolist() == [0, -1, -1, 2]


def test_mapped_topk_keeps_top1_and_first_wins():
    table = np.array([5, 7, 7, 2])
    ids = np.array([[1, 2, 0], [3, 0, 2]])
    lp = np.array([[-0.1, -2.0, -3.0], [-0.5, -1.0, -4.0]], dtype=np.float16)
    mapped, values = align.map_topk(ids, lp, table)
    assert mapped.tolist() == [[7, 7, 5], [2, 5, 7]]
    assert values[0, 1] == -np.inf and values[0, 0] == np.float32(np.float16(-0.1))
    assert np.all(np.isfinite(values[1]))
    assert mapped[np.arange(2), values.argmax(1)].tolist() == [7, 2]  # top-1 kept


def test_one_hot_rows():
    ids, values = align.one_hot(np.array([4, 9]), 3)
    assert ids[:, 0].tolist() == [4, 9] and values[:, 0].tolist() == [0.0, 0.0]
    assert np.all(values[:, 1:] == -np.inf)


def test_dual_min_ce_provider_side():
    own = np.array([1.0, 1.0, 0.5, 2.0])
    tenants = np.array([[0.9, 1.2, 0.6, 1.5], [0.8, 1.0, 0.7, 1.5]])
    # sample 0: tenant 1 best and beats; 1: tie with own -> none; 2: own best; 3: tie -> first
    assert select.dual_min_ce(own, tenants).tolist() == [1, -1, -1, 0]


def test_dual_min_ce_tenant_side_and_missing_samples():
    own = np.array([1.0, 3.0, 2.0])
    llm = select.ce_by_sample(np.array([0, 1]), np.array([0.5, 3.5]), 3)
    assert llm.tolist() == [0.5, 3.5, np.inf]
    assert select.dual_min_ce(own, llm[None]).tolist() == [0, -1, -1]


class _Fixed(torch.nn.Module):
    """A 'model' whose logits are given: row t predicts from a fixed table."""

    def __init__(self, logits):
        super().__init__()
        self.table = logits

    def forward(self, input_ids, attention_mask):
        out = self.table[input_ids]
        return type("O", (), {"logits": out})()


def test_knowledge_arrays_and_per_character_ce():
    vocab_size = 6
    logits = torch.log_softmax(torch.arange(36, dtype=torch.float32).reshape(6, 6) % 5, dim=-1)
    rows = [
        {"input_ids": [1, 2, 3, 4], "labels": [-100, -100, 3, 4], "attention_mask": [1] * 4},
        {"input_ids": [1, 5], "labels": [-100, 5], "attention_mask": [1] * 2},
    ]
    k = knowledge.compute_knowledge(
        _Fixed(logits), rows, [7, 9], [4, 2], pad_id=0, vocab_size=vocab_size, top_k=3, batch_size=2
    )
    assert k.topk_ids.dtype == np.int32 and k.topk_logprobs.dtype == np.float16
    assert k.positions.tolist() == [2, 3, 1] and k.position_offsets.tolist() == [0, 2, 3]
    nll0 = -(logits[2, 3] + logits[3, 4])
    assert k.ce[0] == pytest.approx(float(nll0) / 4, rel=1e-6)
    assert k.sample_tokens(1).tolist() == [1, 5]
    assert k.topk_ids[0, 0] == int(logits[2].argmax())
    back = knowledge.Knowledge.from_tensors(k.to_tensors())
    assert np.array_equal(back.topk_ids, k.topk_ids)
    assert all(t.dtype in (torch.int32, torch.int64, torch.float16, torch.float32) for t in k.to_tensors().values())


def test_top_k_larger_than_vocabulary_is_refused():
    with pytest.raises(ConfigError, match=r"top_k=128 is larger than the vocabulary of tenant 'a' \(100"):
        knowledge.check_top_k(128, 100, "tenant 'a'")


def test_topk_kd_and_weighted_loss():
    student = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0]]), dim=-1)
    ids = torch.tensor([[0, 2]])
    teacher = torch.tensor([[0.0, float("-inf")]])  # all mass on token 0
    assert float(topk_kd(student, ids, teacher)) == pytest.approx(-float(student[0, 0]))
    ce, kd = torch.tensor(2.0), torch.tensor(4.0)
    assert float(weighted_ce_kd(ce, kd, 0.9)) == pytest.approx(0.9 * 2 + 0.1 * 4)
    assert float(weighted_ce_kd(ce, kd, 1.0)) == 2.0


def test_alignment_cache_is_hit_on_second_run(tmp_path, monkeypatch):
    s_tok, r_tok = byte_bpe(), metaspace_bpe()
    rows = [{"input_ids": r_tok(SENTENCE, add_special_tokens=False)["input_ids"]}]
    ids = np.asarray(s_tok(SENTENCE, add_special_tokens=False)["input_ids"], dtype=np.int32)
    k = knowledge.Knowledge(
        sample=np.array([0], np.int32), ce=np.zeros(1, np.float32), tokens=ids,
        token_offsets=np.array([0, len(ids)]), positions=np.zeros(0, np.int32),
        position_offsets=np.array([0, 0]), topk_ids=np.zeros((0, 2), np.int32),
        topk_logprobs=np.zeros((0, 2), np.float16),
    )
    sender = transfer.Side(vocab.canonical_tokens(s_tok), [], np.zeros(0), vocab.content_hash(s_tok))
    receiver = transfer.Side(vocab.canonical_tokens(r_tok), rows, np.array([0]), vocab.content_hash(r_tok))
    cache = transfer.StoreCache(open_store(str(tmp_path)))
    first = transfer.alignment(k, sender, receiver, "public", cache)
    assert cache.hits == 0 and first[0].tolist()[:3] == [0, 1, 3]
    monkeypatch.setattr(transfer, "align_tokens", lambda *_: pytest.fail("re-aligned"))
    second = transfer.alignment(k, sender, receiver, "public", cache)
    assert cache.hits == 1 and np.array_equal(first[0], second[0])
