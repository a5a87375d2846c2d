"""Tokenizers: training, the shipped builtin one, directory loading, the build script."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest
from transformers import PreTrainedTokenizerBase

from fedtune.core.errors import DataError, ModelError
from fedtune.models import load_tokenizer, read_info, train_tokenizer

REPO = Path(__file__).resolve().parents[3]
# Awkward text for exact round trips: runs of spaces, tabs, newlines, punctuation after a
# space, digits, non-Latin scripts, emoji and a leading space.
TRICKY = [
    "Below is an instruction that describes a task.",
    " leading space,  double space and trailing space ",
    "tabs\tand\nnewlines\n\n### Response:\n",
    "don't stop . , ! ? 51 - 19 = 32. The answer is 32.",
    "Ünïcödé: 日本語のテキスト, emoji 😀👍, Ελληνικά",
    "",
]


@pytest.fixture(scope="module")
def builtin() -> PreTrainedTokenizerBase:
    return load_tokenizer("builtin")


@pytest.mark.parametrize("text", TRICKY)
def test_builtin_round_trips_text_exactly(builtin: PreTrainedTokenizerBase, text: str) -> None:
    ids = builtin(text)["input_ids"]
    assert builtin.decode(ids) == text
    assert all(i not in (0, 1, 2) for i in ids)  # no special tokens added or unknowns


def test_builtin_special_ids_and_size(builtin: PreTrainedTokenizerBase) -> None:
    assert (builtin.pad_token, builtin.bos_token, builtin.eos_token) == ("<pad>", "<s>", "</s>")
    assert (builtin.pad_token_id, builtin.bos_token_id, builtin.eos_token_id) == (0, 1, 2)
    info = read_info("builtin")
    assert len(builtin) <= info["vocab_size"]
    assert len(builtin) == info["actual_vocab_size"]
    assert max(builtin.get_vocab().values()) < info["vocab_size"]


def test_builtin_knows_the_prompt_template_words(builtin: PreTrainedTokenizerBase) -> None:
    tokens = builtin.convert_ids_to_tokens(builtin(" instruction response")["input_ids"])
    assert tokens == ["Ġinstruction", "Ġresponse"]


def test_builtin_splits_digits(builtin: PreTrainedTokenizerBase) -> None:
    assert builtin.convert_ids_to_tokens(builtin("2026")["input_ids"]) == ["2", "0", "2", "6"]


def test_train_sets_special_tokens_and_respects_vocab_bound() -> None:
    tok = train_tokenizer(["hello world " * 20, "another line"] * 10, vocab_size=270)
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<pad>", "<s>", "</s>"]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) <= 270
    assert tok.decode(tok("hello  wörld!")["input_ids"]) == "hello  wörld!"


def test_train_is_deterministic() -> None:
    texts = ["the quick brown fox jumps over the lazy dog"] * 5 + ["pack my box"] * 3
    assert train_tokenizer(texts, 300).get_vocab() == train_tokenizer(texts, 300).get_vocab()


def test_train_rejects_too_small_vocab() -> None:
    with pytest.raises(ModelError, match="vocab_size=100 is too small") as info:
        train_tokenizer(["x"], vocab_size=100)
    assert "259" in info.value.fix


def test_saved_directory_loads_by_path_and_file_uri(tmp_path: Path) -> None:
    tok = train_tokenizer(["save me and load me"] * 4, vocab_size=280)
    tok.save_pretrained(str(tmp_path))
    for spec in (str(tmp_path), tmp_path.as_uri()):
        loaded = load_tokenizer(spec)
        assert loaded.get_vocab() == tok.get_vocab()
        assert loaded.decode(loaded("load  me.")["input_ids"]) == "load  me."


def test_load_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist") as info:
        load_tokenizer(str(tmp_path / "absent"))
    assert "builtin" in info.value.fix


def test_load_directory_without_tokenizer_lists_contents(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelError, match=r"holds no tokenizer files \(found: \['config.json'\]\)"):
        load_tokenizer(str(tmp_path))


def test_load_corrupt_tokenizer_is_a_model_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="cannot load the tokenizer"):
        load_tokenizer(str(tmp_path))


def test_read_info_without_info_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="fedtune_tokenizer.json does not exist"):
        read_info(str(tmp_path))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_tokenizer", REPO / "scripts" / "build_tokenizer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_build_script_trains_on_text_fields_and_template(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    records = [
        {"instruction": "Name the zorblax colour.", "context": "", "response": "zorblax blue"},
        {"question": "How many zorblax?", "answer": "zorblax 7", "category": "count"},
    ] * 20
    data.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    out = tmp_path / "tok"
    assert _script().main(["--input", str(data), "--vocab-size", "600", "--out", str(out)]) == 0
    tok = load_tokenizer(str(out))
    # A word frequent in the records becomes one token; the template's words are learned too.
    assert tok.convert_ids_to_tokens(tok(" zorblax")["input_ids"]) == ["Ġzorblax"]
    assert "Ġappropriately" in tok.get_vocab()
    # "category" is metadata, not text the model reads.
    assert "count" not in tok.get_vocab() and "Ġcount" not in tok.get_vocab()
    info = read_info(str(out))
    assert info["vocab_size"] == 600 and info["trained_on"][0]["records"] == 40
    assert info["trained_on"][0]["file"] == "train.jsonl"


def test_build_script_reports_bad_jsonl_with_exit_code(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"instruction": "ok"}\n{broken\n', encoding="utf-8")
    code = _script().main(["--input", str(data), "--out", str(tmp_path / "tok")])
    assert code == DataError.exit_code
    assert not (tmp_path / "tok").exists()


def test_corpus_without_text_fields_is_a_data_error(tmp_path: Path) -> None:
    from fedtune.models.tokenizer import tokenizer_corpus

    data = tmp_path / "meta.jsonl"
    data.write_text('{"category": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="has a text field"):
        tokenizer_corpus([data])
