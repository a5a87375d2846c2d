"""A tiny Hugging Face model directory built offline (GPT-2 config + ByteLevel BPE)."""

from __future__ import annotations

from pathlib import Path

import pytest

CORPUS = [
    "federated fine tuning keeps the data with the tenant",
    "the provider owns the model and the tenant owns the data",
    "hello world, hello tenant, hello provider",
] * 4
EOS = "<|endoftext|>"


def build_tiny_hf_dir(path: Path, *, with_adapter: bool = False) -> Path:
    """Save a ~15 KB GPT-2 and its tokenizer (and optionally a LoRA adapter) to ``path``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=280,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=raw, eos_token=EOS, bos_token=EOS, pad_token=EOS
    )
    eos_id = int(tokenizer.convert_tokens_to_ids(EOS))  # type: ignore[arg-type]
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=64,
        n_embd=8,
        n_layer=1,
        n_head=2,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.generation_config.pad_token_id = eos_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if with_adapter:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(
            r=2, target_modules=["c_attn"], fan_in_fan_out=True, init_lora_weights=False
        )
        get_peft_model(model, lora).save_pretrained(str(path / "adapter"))
    return path


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_hf_dir(tmp_path_factory.mktemp("tiny") / "model", with_adapter=True)
