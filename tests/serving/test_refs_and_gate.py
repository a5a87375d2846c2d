"""Model references, alias rules and the leakage gate: pure functions, no MLflow."""

from __future__ import annotations

import pytest

from fedtune.core.errors import ConfigError, ModelError
from fedtune.serving.gate import AUDIT_TAG, GATE_TAG, LeakageGate
from fedtune.serving.refs import ModelSpec, check_alias, check_version, parse_model_spec


@pytest.mark.parametrize("alias", ["champion", "candidate", "prod_2", "a", "b-" + "x" * 61])
def test_valid_aliases(alias: str) -> None:
    assert check_alias(alias) == alias


@pytest.mark.parametrize(
    "alias",
    ["Champion", "champ ion", "champion!", "1st", "", "latest", "v3", "-x", "a" * 64, "prod/1"],
)
def test_invalid_aliases_are_refused_with_the_value(alias: str) -> None:
    with pytest.raises(ConfigError, match="invalid model alias") as info:
        check_alias(alias)
    assert repr(alias) in str(info.value)
    assert "lowercase" in info.value.fix


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("quickstart@champion", ModelSpec("quickstart", alias="champion")),
        ("models:/quickstart@champion", ModelSpec("quickstart", alias="champion")),
        ("quickstart/3", ModelSpec("quickstart", version=3)),
        ("team/model/12", ModelSpec("team/model", version=12)),
    ],
)
def test_parse_model_spec(text: str, expected: ModelSpec) -> None:
    assert parse_model_spec(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("quickstart", "names no alias or version"),
        ("@champion", "no model name"),
        ("quickstart@Bad!", "invalid model alias"),
        ("quickstart/zero", "invalid model version"),
        ("quickstart/0", "invalid model version"),
    ],
)
def test_parse_model_spec_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_model_spec(text)


@pytest.mark.parametrize("version", ["1", 7, " 12 "])
def test_check_version_accepts_positive_numbers(version: str | int) -> None:
    assert check_version(version) == int(str(version).strip())


# -- the leakage gate: (gate, version tags, model tags) -> passes with audit / refuses --------
PASS_CASES = {
    "off without threshold": (LeakageGate(), {}, {}, None),
    "cli threshold met": (LeakageGate(max_leakage=0.3), {AUDIT_TAG: "0.25"}, {}, 0.25),
    "equal to threshold passes": (LeakageGate(max_leakage=0.3), {AUDIT_TAG: "0.3"}, {}, 0.3),
    "model tag threshold met": (LeakageGate(), {AUDIT_TAG: "0.1"}, {GATE_TAG: "0.2"}, 0.1),
    "cli overrides model tag": (
        LeakageGate(max_leakage=0.5),
        {AUDIT_TAG: "0.4"},
        {GATE_TAG: "0.2"},
        0.4,
    ),
    "require audit without bound": (LeakageGate(require_audit=True), {AUDIT_TAG: "0.9"}, {}, 0.9),
}


@pytest.mark.parametrize("case", sorted(PASS_CASES))
def test_gate_passes(case: str) -> None:
    gate, version_tags, model_tags, audit = PASS_CASES[case]
    result = gate.check("m", 1, version_tags, model_tags)
    assert result.audit == audit
    assert result.checked is (audit is not None)
    assert ("off" in result.describe()) is (audit is None)


REFUSE_CASES = {
    "missing audit with cli threshold": (
        LeakageGate(max_leakage=0.3),
        {},
        {},
        ModelError,
        "has no audit result",
    ),
    "missing audit with model tag": (
        LeakageGate(),
        {},
        {GATE_TAG: "0.3"},
        ModelError,
        "0.3 is configured",
    ),
    "missing audit when required": (
        LeakageGate(require_audit=True),
        {},
        {},
        ModelError,
        "--require-audit",
    ),
    "too high": (LeakageGate(max_leakage=0.3), {AUDIT_TAG: "0.31"}, {}, ModelError, "exceeds"),
    "too high for model tag": (
        LeakageGate(),
        {AUDIT_TAG: "0.5"},
        {GATE_TAG: "0.2"},
        ModelError,
        "exceeds",
    ),
    "audit not a number": (
        LeakageGate(max_leakage=0.3),
        {AUDIT_TAG: "low"},
        {},
        ModelError,
        "not a number",
    ),
    "audit out of range": (
        LeakageGate(max_leakage=0.3),
        {AUDIT_TAG: "1.5"},
        {},
        ModelError,
        "between 0 and 1",
    ),
    "audit nan": (
        LeakageGate(max_leakage=0.3),
        {AUDIT_TAG: "nan"},
        {},
        ModelError,
        "between 0 and 1",
    ),
    "model tag malformed": (
        LeakageGate(),
        {AUDIT_TAG: "0.1"},
        {GATE_TAG: "strict"},
        ConfigError,
        GATE_TAG,
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSE_CASES))
def test_gate_refuses(case: str) -> None:
    gate, version_tags, model_tags, error, message = REFUSE_CASES[case]
    with pytest.raises(error, match=message) as info:
        gate.check("m", 4, version_tags, model_tags)
    assert info.value.fix


@pytest.mark.parametrize("bad", [-0.1, 1.01, float("nan"), float("inf")])
def test_gate_rejects_a_bad_cli_threshold(bad: float) -> None:
    with pytest.raises(ConfigError, match="--max-leakage"):
        LeakageGate(max_leakage=bad)
