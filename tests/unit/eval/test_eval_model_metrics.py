"""Loss, greedy generation and option log-likelihood on a tiny offline Llama.

Each is checked against an independent computation: the model's own loss, a hand-written
greedy loop, and the chain rule evaluated one token at a time without batching or padding.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from fedtune.core.errors import ConfigError, DataError, ModelError
from fedtune.eval.choice import ChoiceItem, mc_accuracy, option_loglik, predict_choice
from fedtune.eval.generation import generate_greedy, greedy_generate_fn
from fedtune.eval.loss import lm_eval_loss
from fedtune.eval.memorization import memorization_audit

PROMPTS = [
    "### Instruction:\nName the capital of France.\n\n### Response:\n",
    "The answer is",
    "Question: is the sky blue? Answer:",
]


def _batch(
    tok: PreTrainedTokenizerFast, texts: list[str], prompt_tokens: int
) -> dict[str, torch.Tensor]:
    """Right-padded batch whose first ``prompt_tokens`` tokens and padding carry no loss."""
    encoded = [tok(t)["input_ids"] for t in texts]
    width = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(texts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    labels[:, :prompt_tokens] = -100
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def test_loss_of_one_batch_equals_the_models_own_loss(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    batch = _batch(tiny_tokenizer, PROMPTS, prompt_tokens=2)
    with torch.no_grad():
        expected = tiny_llama(**batch).loss.item()
    assert lm_eval_loss(tiny_llama, [batch]) == pytest.approx(expected, rel=1e-5)


def test_loss_is_weighted_by_tokens_across_batches(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    long_batch = _batch(tiny_tokenizer, [PROMPTS[0]], prompt_tokens=1)
    short_batch = _batch(tiny_tokenizer, [PROMPTS[1]], prompt_tokens=1)
    losses, tokens = [], []
    for batch in (long_batch, short_batch):
        with torch.no_grad():
            losses.append(tiny_llama(**batch).loss.item())
        tokens.append(int((batch["labels"][:, 1:] != -100).sum()))
    weighted = (losses[0] * tokens[0] + losses[1] * tokens[1]) / sum(tokens)
    result = lm_eval_loss(tiny_llama, [long_batch, short_batch])
    assert result == pytest.approx(weighted, rel=1e-5)
    assert result != pytest.approx(sum(losses) / 2, rel=1e-3)  # not a mean of batch means


def test_evaluation_leaves_a_training_model_in_training_mode(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    tiny_llama.train()
    try:
        lm_eval_loss(tiny_llama, [_batch(tiny_tokenizer, PROMPTS, prompt_tokens=1)])
        generate_greedy(tiny_llama, tiny_tokenizer, PROMPTS[:1], max_new_tokens=2)
        assert tiny_llama.training
    finally:
        tiny_llama.eval()


def test_loss_without_target_tokens_is_a_data_error(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    batch = _batch(tiny_tokenizer, PROMPTS, prompt_tokens=1)
    batch["labels"][:] = -100
    with pytest.raises(DataError, match="no target token"):
        lm_eval_loss(tiny_llama, [batch])
    with pytest.raises(DataError, match="no target token"):
        lm_eval_loss(tiny_llama, [])


def test_loss_batch_without_labels_is_a_data_error(tiny_llama: LlamaForCausalLM) -> None:
    with pytest.raises(DataError, match=r"batch 0 lacks \['labels'\]"):
        lm_eval_loss(tiny_llama, [{"input_ids": torch.ones((1, 3), dtype=torch.long)}])


def test_loss_with_misaligned_labels_is_a_data_error(tiny_llama: LlamaForCausalLM) -> None:
    batch = {
        "input_ids": torch.ones((1, 3), dtype=torch.long),
        "labels": torch.ones((1, 2), dtype=torch.long),
    }
    with pytest.raises(DataError, match="labels shape"):
        lm_eval_loss(tiny_llama, [batch])


def _greedy_by_hand(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompt: str, max_new_tokens: int
) -> str:
    ids = tok(prompt)["input_ids"]
    new: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids + new])).logits[0, -1]
            token = int(logits.argmax())
            if token == tok.eos_token_id:
                break
            new.append(token)
    return tok.decode(new, skip_special_tokens=True)


def test_batched_greedy_generation_equals_a_hand_written_greedy_loop(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    # Prompts of different lengths in one batch exercise the left padding.
    outputs = generate_greedy(tiny_llama, tiny_tokenizer, PROMPTS, max_new_tokens=6, batch_size=3)
    expected = [_greedy_by_hand(tiny_llama, tiny_tokenizer, p, 6) for p in PROMPTS]
    assert outputs == expected
    assert any(outputs)  # the check compares real text, not empty strings
    assert (
        generate_greedy(tiny_llama, tiny_tokenizer, PROMPTS, max_new_tokens=6, batch_size=1)
        == expected
    )


def test_generation_with_no_prompts_returns_nothing(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    assert generate_greedy(tiny_llama, tiny_tokenizer, [], max_new_tokens=3) == []


def test_generation_of_an_empty_prompt_is_a_data_error(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(DataError, match="prompt 1"):
        generate_greedy(tiny_llama, tiny_tokenizer, ["hi", ""], max_new_tokens=3)


def test_generation_length_below_one_is_a_config_error(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(ConfigError, match="max_new_tokens=0"):
        generate_greedy(tiny_llama, tiny_tokenizer, ["hi"], max_new_tokens=0)


def test_generation_without_pad_or_eos_is_a_model_error(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    bare = PreTrainedTokenizerFast(tokenizer_object=tiny_tokenizer.backend_tokenizer)
    with pytest.raises(ModelError, match="neither a pad nor an eos"):
        generate_greedy(tiny_llama, bare, ["hi"], max_new_tokens=2)


def test_memorization_audit_runs_on_a_model(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    generate = greedy_generate_fn(tiny_llama, tiny_tokenizer, max_new_tokens=6)
    outputs = generate_greedy(tiny_llama, tiny_tokenizer, PROMPTS, max_new_tokens=6)
    # Training responses equal to what the model says are fully reproduced ...
    report = memorization_audit(generate, list(zip(PROMPTS, outputs, strict=True)))
    assert report.generations == tuple(outputs)
    assert report.mean_rouge_l == pytest.approx(1.0)
    # ... and responses it does not say are not.
    unrelated = [(p, "the capital of France is Paris") for p in PROMPTS]
    assert memorization_audit(generate, unrelated).mean_rouge_l < 0.5


def _loglik_by_hand(
    model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, prompt: str, option: str
) -> float:
    context = tok(prompt)["input_ids"]
    total = 0.0
    with torch.no_grad():
        for token in tok(option, add_special_tokens=False)["input_ids"]:
            logits = model(input_ids=torch.tensor([context])).logits[0, -1]
            total += float(torch.log_softmax(logits.double(), dim=-1)[token])
            context = context + [token]
    return total


OPTIONS = (" yes", " no", " the capital of France is Paris")


def test_option_loglik_equals_the_chain_rule_token_by_token(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    prompt = PROMPTS[2]
    scores = option_loglik(tiny_llama, tiny_tokenizer, prompt, OPTIONS)
    expected = [_loglik_by_hand(tiny_llama, tiny_tokenizer, prompt, o) for o in OPTIONS]
    assert scores == pytest.approx(expected, abs=1e-4)


def test_length_normalisation_divides_by_option_tokens(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    prompt = PROMPTS[2]
    raw = option_loglik(tiny_llama, tiny_tokenizer, prompt, OPTIONS)
    normalised = option_loglik(tiny_llama, tiny_tokenizer, prompt, OPTIONS, length_normalize=True)
    lengths = [len(tiny_tokenizer(o, add_special_tokens=False)["input_ids"]) for o in OPTIONS]
    assert lengths[2] > 1
    assert normalised == pytest.approx([s / n for s, n in zip(raw, lengths, strict=True)], abs=1e-6)


def test_mc_accuracy_follows_the_highest_likelihood(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    items_best, items_worst = [], []
    for prompt in PROMPTS:
        scores = [_loglik_by_hand(tiny_llama, tiny_tokenizer, prompt, o) for o in OPTIONS]
        best = max(range(3), key=scores.__getitem__)
        worst = min(range(3), key=scores.__getitem__)
        items_best.append(ChoiceItem(prompt, OPTIONS, best))
        items_worst.append(ChoiceItem(prompt, OPTIONS, worst))
        assert predict_choice(tiny_llama, tiny_tokenizer, items_best[-1]) == best
    assert mc_accuracy(tiny_llama, tiny_tokenizer, items_best) == 1.0
    assert mc_accuracy(tiny_llama, tiny_tokenizer, items_worst) == 0.0


@pytest.mark.parametrize(
    ("prompt", "options", "message"),
    [
        ("Q:", (), "no options"),
        ("Q:", (" a", ""), "option 1"),
        ("", (" a",), "prompt tokenises to no token"),
    ],
)
def test_option_loglik_rejects_unscorable_input(
    tiny_llama: LlamaForCausalLM,
    tiny_tokenizer: PreTrainedTokenizerFast,
    prompt: str,
    options: tuple[str, ...],
    message: str,
) -> None:
    with pytest.raises(DataError, match=message):
        option_loglik(tiny_llama, tiny_tokenizer, prompt, options)


def test_mc_accuracy_rejects_bad_items(
    tiny_llama: LlamaForCausalLM, tiny_tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(DataError, match="answer index 2"):
        mc_accuracy(tiny_llama, tiny_tokenizer, [ChoiceItem("Q:", (" a", " b"), 2)])
    with pytest.raises(DataError, match="no items"):
        mc_accuracy(tiny_llama, tiny_tokenizer, [])
