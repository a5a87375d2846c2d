"""FedMKT's per-model scores: label sets from the data, option log-likelihood accuracy for
classification examples, Rouge-L for the others."""

from __future__ import annotations

import pytest

from fedtune.algorithms.fedmkt.scoring import label_sets, score_model
from fedtune.config.models import TinyModelConfig
from fedtune.core.errors import ConfigError
from fedtune.data.formats import Example
from fedtune.data.templates import render_prompt
from fedtune.eval.choice import ChoiceItem, mc_accuracy
from fedtune.training.context import build_model

CLASSIFY = [Example(f"Answer with animal or fruit: what is '{w}'?", "", label, "classify")
            for w, label in [("cat", "animal"), ("pear", "fruit"), ("dog", "animal"), ("fig", "fruit")]]
REVERSE = [Example("Reverse the letters.", w, w[::-1], "reverse") for w in ("abc", "hello", "tree")]


def test_label_sets_are_small_response_sets_per_category():
    sets = label_sets([*CLASSIFY, *REVERSE], max_options=2)
    assert sets == {"classify": ("animal", "fruit")}  # reverse has 3 distinct answers > 2
    assert label_sets(CLASSIFY[:1], max_options=8) == {}  # one label is no choice


def test_score_model_splits_choice_and_generation():
    model, tok = build_model(TinyModelConfig(source="tiny", arch="gpt2", hidden_size=32, num_layers=1,
                                             num_heads=2, intermediate_size=64), "builtin")
    scores = score_model(model, tok, [*CLASSIFY, *REVERSE], labels_from=[*CLASSIFY, *REVERSE],
                         max_options=2, max_new_tokens=4)
    assert scores["n_choice"] == 4 and scores["n_generate"] == 3
    expected = mc_accuracy(model, tok, [ChoiceItem(render_prompt(e), ("animal", "fruit"),
                                                   ("animal", "fruit").index(e.response)) for e in CLASSIFY])
    assert scores["acc"] == expected and 0.0 <= scores["rouge_l"] <= 1.0


def test_no_held_out_examples_is_a_clear_error():
    with pytest.raises(ConfigError, match="got no held-out examples"):
        score_model(None, None, [], labels_from=[], max_options=8, max_new_tokens=4)
