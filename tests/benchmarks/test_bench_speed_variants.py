"""Issue 33's client-step speed variants (plain, ``training.compile``, ``training.kernels:
liger``, both) against the bare eager PEFT loop, the 7b shape, and their docs block."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedtune.benchmarks.docs import regenerate
from fedtune.benchmarks.step_memory import (
    SHAPES,
    VARIANTS,
    StepMemorySpec,
    _base,
    _unpatched,
    measure,
    measure_client_speed,
    speed_summary,
)
from fedtune.cli.main import main
from fedtune.core.devices import BACKEND_ENV
from fedtune.models.tokenizer import load_tokenizer
from fedtune.training.precision import Runtime

TINY = StepMemorySpec(shape="tiny", lora_r=4, speed_batch_size=2, speed_seq_len=32,
                      speed_steps=2, speed_reps=2, memory_cells=False, gpu=False)
LIGER = [name for name, (_, kernels) in VARIANTS.items() if kernels == "liger"]


def _liger_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("liger_kernel") is not None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("variant", LIGER)
def test_a_liger_variant_this_machine_cannot_run_is_a_skipped_row(variant: str, device: str) -> None:
    """No crash and no model built: the row says why (no GPU; the package missing)."""
    if device == "cuda" and _liger_installed():
        pytest.skip("liger-kernel is installed here")
    row = measure_client_speed({**TINY.cell_base(device), "variant": variant})
    assert row["variant"] == variant and row["kernels"] == "liger"
    assert row["compile"] is VARIANTS[variant][0]
    assert "fedtune_tokens_per_s" not in row
    reason = "needs a CUDA GPU" if device == "cpu" else "liger-kernel package is not installed"
    assert reason in row["skipped"]
    assert speed_summary(row).endswith(f"{variant}: skipped ({row['skipped']})")


def test_variants_that_cannot_run_are_recorded_without_a_process(tmp_path: Path) -> None:
    partial = tmp_path / "partial.json"
    results = measure(replace(TINY, speed_variants=tuple(LIGER)), tmp_path / "cells",
                      partial=partial)
    rows = results["cpu_speed"]["variants"]
    assert [r["variant"] for r in rows] == LIGER and all("needs a CUDA GPU" in r["skipped"]
                                                          for r in rows)
    assert "client_speed" not in results["cpu_speed"]  # no plain variant asked for
    assert json.loads(partial.read_text())["cpu_speed"]["variants"] == rows
    assert not any((tmp_path / "cells").iterdir())  # no cell process wrote a report


def test_variants_past_the_speed_budget_are_skipped_rows(tmp_path: Path) -> None:
    """A lease's budget spent: the rest are recorded as out of time, no process started."""
    results = measure(replace(TINY, speed_variants=("plain", "compile"), speed_budget_s=5.0),
                      tmp_path / "cells")
    rows = results["cpu_speed"]["variants"]
    assert [r["variant"] for r in rows] == ["plain", "compile"]
    assert all(r["skipped"].startswith("out of time: the speed budget of 5 s") for r in rows)
    assert not any((tmp_path / "cells").iterdir())


@pytest.mark.slow
def test_variants_are_recorded_per_variant_and_saved_as_they_end(tmp_path: Path) -> None:
    partial = tmp_path / "partial.json"
    spec = replace(TINY, speed_variants=("plain", "liger"))
    results = measure(spec, tmp_path / "cells", partial=partial)
    assert results["rows"] == []  # speed only: no memory cell ran
    plain, liger = results["cpu_speed"]["variants"]
    assert (plain["variant"], plain["compile"], plain["kernels"]) == ("plain", False, "none")
    assert plain["fedtune_tokens_per_s"] > 0 and plain["bare_tokens_per_s"] > 0
    assert plain["speedup"] == pytest.approx(
        plain["fedtune_tokens_per_s"] / plain["bare_tokens_per_s"])
    assert plain["first_run_s"] > 0 and len(plain["pairs"]) == 2
    assert plain["compiled_bare"] is None  # the torch.compile reference is CUDA's
    assert results["cpu_speed"]["client_speed"] == plain
    assert liger["variant"] == "liger" and "skipped" in liger
    saved = json.loads(partial.read_text())
    assert saved["partial"] is True and saved["cpu_speed"]["variants"] == [plain, liger]


@pytest.mark.slow
def test_the_compile_variant_runs_fedtunes_step_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    # aot_eager traces and differentiates the graphs as inductor does, without generating code.
    monkeypatch.setenv(BACKEND_ENV, "aot_eager")
    row = measure_client_speed({**TINY.cell_base("cpu"), "precision": "bf16",
                                "variant": "compile", "speed_reps": 1})
    assert (row["variant"], row["compile"], row["kernels"]) == ("compile", True, "none")
    assert row["fedtune_tokens_per_s"] > 0 and row["first_run_s"] > 0


def test_the_bare_loop_runs_without_what_liger_patched_into_the_llama_module() -> None:
    """Liger replaces module globals of transformers' Llama (its RoPE for every Llama in the
    process); the bare loop runs with the originals put back, and the patch returns after."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.apply_rotary_pos_emb

    def patched(*args: object) -> None: ...

    modeling_llama.apply_rotary_pos_emb = patched  # as Liger does
    try:
        with _unpatched({"apply_rotary_pos_emb": original}):
            assert modeling_llama.apply_rotary_pos_emb is original
        assert modeling_llama.apply_rotary_pos_emb is patched
    finally:
        modeling_llama.apply_rotary_pos_emb = original


def test_the_7b_shape_is_llama_2_7b_built_in_the_runtimes_dtype_on_its_device() -> None:
    shape = SHAPES["7b"]
    # Llama-2-7B's published count: embeddings and head 2 x 32000 x 4096, 32 layers of
    # 4 x 4096^2 + 3 x 4096 x 11008 + two norms, and the final norm.
    assert shape.parameters() == 6_738_415_616
    # Built on the device in bf16 (meta here: nothing allocated), never fp32 on the CPU first.
    model = _base(shape, Runtime(device=torch.device("meta"), precision="bf16"),
                  load_tokenizer("builtin"), max_positions=1024)
    params = list(model.parameters())
    assert sum(p.numel() for p in params) == shape.parameters()
    assert {p.device.type for p in params} == {"meta"} and {p.dtype for p in params} == {torch.bfloat16}


@pytest.mark.parametrize(("option", "value", "named"), [
    ("--steps-variants", "plain,fused", "compile+liger"),
    ("--steps-set", "speed_steps=0", "speed_steps=10"),
    ("--steps-set", "speed_steps=ten", "speed_reps"),
    ("--steps-set", "lora_r=8", "memory_cells"),
    ("--steps-set", "memory_cells=3", "true/false"),
])
def test_bad_speed_options_are_clear_errors(option: str, value: str, named: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", option, value])
    assert code == 2
    err = capsys.readouterr().err
    assert repr(value)[1:-1] in err and named in err
    assert not (tmp_path / "system" / "results.json").exists()


def _measured(variant: str, tokens: float, bare: float, first: float) -> dict[str, object]:
    compile_forward, kernels = VARIANTS[variant]
    return {"variant": variant, "compile": compile_forward, "kernels": kernels,
            "device": "NVIDIA H200", "precision": "bf16", "batch_size": 8, "seq_len": 1024,
            "steps": 10, "reps": 2, "flops_per_token": 4_000_000_000,
            "flops_formula": "4*frozen_matmul + 6*trainable + 12*layers*seq_len*hidden",
            "peak_bf16_flops": 989e12, "fedtune_tokens_per_s": tokens, "bare_tokens_per_s": bare,
            "speedup": tokens / bare, "fedtune_mfu": tokens * 4e9 / 989e12,
            "bare_mfu": bare * 4e9 / 989e12, "first_run_s": first, "peak_mib": 30_000.0,
            "compiled_bare": None}


def test_the_docs_block_renders_every_variant_or_says_it_is_not_measured(tmp_path: Path) -> None:
    path = "docs/results/speed.json"
    page = f"# page\n<!-- generated: gpusystem {path} -->\nold\n<!-- end generated -->\n"
    absent = regenerate(page, tmp_path)
    assert "Not yet measured on a GPU" in absent and "scripts/gpu_check.sh speed33" in absent
    variants = [_measured("plain", 53_000, 46_000, 3.1), _measured("compile", 99_000, 46_500, 64.0),
                {"variant": "liger", "compile": False, "kernels": "liger",
                 "skipped": "training.kernels: liger, but the liger-kernel package is not installed"},
                {"variant": "compile+liger", "error": "timed out after 130 s"}]
    results = {"commit": "abc1234", "device": {"description": "CUDA NVIDIA H200",
                                               "torch": "2.11.0", "threads": 16},
               "step_memory": {"description": f"{SHAPES['1b'].describe()}, random weights; ...",
                               "rows": [], "gpu": {"measured": True, "variants": variants,
                                                   "client_speed": variants[0]}}}
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / path).write_text(json.dumps(results))
    text = regenerate(page, tmp_path)
    assert "(measured at commit abc1234)" in text and "Not yet measured" not in text
    assert "Peak memory per step kind" not in text  # a speed-only run has no memory table
    assert "| plain | 53,000 | 21.4 % | 1.15 | 46,000 | 18.6 % | 3.1 | 30,000 |" in text
    assert "| compile | 99,000 | 40.0 % | 2.13 | 46,500 | 18.8 % | 64.0 | 30,000 |" in text
    assert "| liger | - | - | - | - | - | - | - (training.kernels: liger, but the liger-kernel" in text
    assert "| compile+liger | - | - | - | - | - | - | - (timed out after 130 s) |" in text
    assert "batch 8 x 1024 tokens, 10 steps, 2 alternating pairs" in text
