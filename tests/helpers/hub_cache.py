"""A Hugging Face cache folder built by hand, holding one tiny Llama (nothing downloaded).

The layout is the one huggingface_hub documents: ``models--org--name/refs/main`` names a
commit, ``models--org--name/snapshots/<commit>/`` holds the files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fedtune.models.tokenizer import load_tokenizer

REPO = "tinyorg/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Put REPO at COMMIT into ``home/hub``, point HF_HOME at ``home``, go offline; return
    the snapshot folder."""
    repo = home / "hub" / "models--tinyorg--tiny-llama"
    snapshot = repo / "snapshots" / COMMIT
    tokenizer = load_tokenizer("builtin")
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(3)
    LlamaForCausalLM(config).save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot
