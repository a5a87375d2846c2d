"""The FewFedPIT memorization audit with fake generate functions."""

from __future__ import annotations

import pytest

from fedtune.core.errors import ConfigError, DataError
from fedtune.eval.memorization import memorization_audit

EXAMPLES = [
    (
        "### Instruction:\nWhat is my card number?\n\n### Response:\n",
        "Your card number is 4921 7731.",
    ),
    (
        "### Instruction:\nWhere does Ana live?\n\n### Response:\n",
        "Ana lives at 12 Elm Street, Oslo.",
    ),
    (
        "### Instruction:\nSummarise the visit.\n\n### Response:\n",
        "The patient reported chest pain.",
    ),
]
RESPONSES = dict(EXAMPLES)


def test_a_model_that_copies_the_response_scores_one() -> None:
    report = memorization_audit(RESPONSES.__getitem__, EXAMPLES)
    assert report.mean_rouge_l == pytest.approx(1.0)
    assert report.scores == pytest.approx((1.0, 1.0, 1.0))
    assert report.exceeds_threshold
    assert report.num_reproduced == 3
    assert report.reproduced_rate == 1.0
    assert report.generations == tuple(RESPONSES.values())


def test_a_model_that_says_something_else_scores_low() -> None:
    report = memorization_audit(lambda prompt: "I would rather talk about the weather.", EXAMPLES)
    assert report.mean_rouge_l < 0.2
    assert not report.exceeds_threshold
    assert report.num_reproduced == 0


def test_partial_leak_is_counted_per_sample() -> None:
    def generate(prompt: str) -> str:
        # Leaks only the first example.
        return RESPONSES[prompt] if "card" in prompt else "no idea"

    report = memorization_audit(generate, EXAMPLES, threshold=0.5)
    assert report.scores[0] == pytest.approx(1.0)
    assert report.num_reproduced == 1
    assert report.mean_rouge_l == pytest.approx(sum(report.scores) / 3)
    assert not report.exceeds_threshold


def test_subset_is_seeded_and_reproducible() -> None:
    examples = [(f"prompt {i}", f"response {i}") for i in range(20)]
    seen: list[str] = []

    def generate(prompt: str) -> str:
        seen.append(prompt)
        return ""

    first = memorization_audit(generate, examples, max_examples=5, seed=3)
    second = memorization_audit(lambda p: "", examples, max_examples=5, seed=3)
    other = memorization_audit(lambda p: "", examples, max_examples=5, seed=4)
    assert len(first.indices) == 5 and len(seen) == 5
    assert first.indices == second.indices != other.indices
    assert seen == [f"prompt {i}" for i in first.indices]


def test_no_examples_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no training examples"):
        memorization_audit(lambda p: p, [])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"threshold": 1.5}, "threshold=1.5"), ({"max_examples": 0}, "max_examples=0")],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        memorization_audit(lambda p: p, EXAMPLES, **kwargs)  # type: ignore[arg-type]
