"""``fedtune bench system --parts steps-memory``: peak memory per step kind, fp32 vs bf16,
with and without checkpointing (tiny shape on the CPU), the GPU rows' skip line, and the MFU
arithmetic against a hand computation."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from fedtune.benchmarks.step_memory import (
    NO_GPU,
    SHAPES,
    LlamaShape,
    StepMemorySpec,
    client_flops_per_token,
    measure_cell,
    measure_client_speed,
    mfu,
    peak_bf16_flops,
)
from fedtune.cli.main import main

TINY = StepMemorySpec(shape="tiny", batch_size=2, seq_len=32, steps=2, new_tokens=4, lora_r=4,
                      speed_batch_size=2, speed_seq_len=32, speed_steps=2, speed_reps=2)


def test_cli_prints_the_memory_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory"])
    assert code == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "system" / "results.json").read_text())
    steps = results["step_memory"]
    cpu = {(r["kind"], r["precision"], r["checkpointing"]): r
           for r in steps["rows"] if r["device"] == "cpu"}
    assert sorted(cpu) == sorted(
        [("client", p, c) for p in ("fp32", "bf16") for c in (False, True)]
        + [("eval", "fp32", False), ("eval", "bf16", False)]
    )
    for row in cpu.values():
        assert row["peak_mib"] >= row["model_mib"] > 0 and row["tokens_per_s"] > 0, row
    # Weights are the bulk of an evaluation step: bf16 halves them, which the peak shows.
    fp32, bf16 = cpu["eval", "fp32", False], cpu["eval", "bf16", False]
    assert bf16["model_mib"] < 0.75 * fp32["model_mib"]
    assert bf16["peak_mib"] < fp32["peak_mib"]
    # LoRA trains only the adapter: the client step trains far fewer parameters than it holds.
    client = cpu["client", "fp32", True]
    assert 0 < client["trainable"] < client["parameters"] / 100
    assert "Peak memory per step kind" in printed and "| cpu | client | bf16 | on |" in printed
    assert results["commit"]
    if torch.cuda.is_available():
        assert steps["gpu"]["measured"] and any(r["device"] == "cuda" for r in steps["rows"])
    else:
        assert steps["gpu"] == {"measured": False, "note": NO_GPU}
        assert NO_GPU in printed


def test_provider_and_generation_steps_run_through_fedtunes_code() -> None:
    """The two kinds the CLI test leaves out, in this process (their figures are not checked
    here, only that the steps ran and measured)."""
    cell = next(c for c in TINY.cells("cpu") if c["kind"] == "provider" and c["checkpointing"])
    provider = measure_cell({**cell, "precision": "bf16"})
    assert provider["steps"] == TINY.steps and provider["tokens_per_s"] > 0
    # The emulator's decoder layers train; embeddings, head and the teacher do not.
    assert 0 < provider["trainable"] < provider["parameters"] / 2
    generate = measure_cell(next(c for c in TINY.cells("cpu") if c["kind"] == "generate"))
    assert generate["tokens_per_step"] == TINY.batch_size * TINY.new_tokens
    assert generate["seconds_per_step"] > 0


def test_client_speed_against_the_bare_loop_runs_on_the_cpu() -> None:
    """The GPU-only measurement's code, at a tiny shape on the CPU: no MFU without a GPU peak."""
    speed = measure_client_speed(TINY.cells("cpu")[0])
    assert speed["ratio"] > 0 and speed["fedtune_tokens_per_s"] > 0 and speed["bare_tokens_per_s"] > 0
    # The plain variant (no compile, no kernels), with its first (untimed) run recorded.
    assert (speed["variant"], speed["compile"], speed["kernels"]) == ("plain", False, "none")
    assert speed["speedup"] == speed["fedtune_tokens_per_s"] / speed["bare_tokens_per_s"]
    assert speed["first_run_s"] > 0 and speed["peak_mib"] is None
    assert speed["fedtune_mfu"] is None and speed["peak_bf16_flops"] is None
    shape = SHAPES["tiny"]
    # By hand: q, k, v, o (d x d) and gate, up, down (d x I) per layer, plus the LM head.
    frozen = shape.num_layers * (4 * 512 * 512 + 3 * 512 * 1376) + 32000 * 512
    assert speed["frozen_matmul_parameters"] == frozen
    # LoRA r=4: A (r x in) + B (out x r) on each of the seven matrices.
    lora = shape.num_layers * 4 * (4 * (512 + 512) + 2 * (512 + 1376) + (1376 + 512))
    assert speed["trainable"] == lora
    assert speed["flops_per_token"] == 4 * frozen + 6 * lora + 12 * 2 * 32 * 512


def test_mfu_arithmetic_by_hand() -> None:
    # 4 x 1000 frozen + 6 x 10 trained + 12 x 2 layers x 8 tokens x 4 hidden.
    assert client_flops_per_token(
        frozen_matmul=1000, trainable=10, num_layers=2, hidden_size=4, seq_len=8
    ) == 4000 + 60 + 768
    # The 1B shape at 1024 tokens on an H100 SXM: 10,000 tokens/s of 3.95 GFLOP each.
    one_b = SHAPES["1b"]
    frozen = 16 * (4 * 2048**2 + 3 * 2048 * 5632) + 32000 * 2048
    flops = client_flops_per_token(frozen_matmul=frozen, trainable=0, num_layers=16,
                                   hidden_size=2048, seq_len=1024)
    assert flops == 4 * 887_619_584 + 402_653_184 == 3_953_131_520
    assert one_b.parameters() == frozen + 32000 * 2048 + 16 * 2 * 2048 + 2048
    assert mfu(10_000, flops, 989e12) == pytest.approx(10_000 * 3_953_131_520 / 989e12)
    assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert peak_bf16_flops("NVIDIA H200") == 989e12
    assert peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_bf16_flops("Tesla T4") is None


def test_cells_cover_every_kind_and_precision() -> None:
    cells = StepMemorySpec().cells("cpu")
    assert len(cells) == 2 * (2 + 2) + 2 * 2  # training kinds twice (checkpointing on/off)
    assert {c["kind"] for c in cells} == {"client", "provider", "generate", "eval"}
    assert all(c["shape"] == asdict(LlamaShape(2048, 16, 32, 5632, 32000)) for c in cells)
    assert not any(c["checkpointing"] for c in cells if c["kind"] in ("generate", "eval"))


def test_unknown_shape_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", "--steps-shape", "13b"])
    assert code == 2
    err = capsys.readouterr().err
    assert "13b" in err and "1b" in err and "7b" in err


def test_unknown_steps_device_is_a_clear_error(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", "--steps-devices", "tpu"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'tpu'" in err and "cpu,cuda" in err
    assert not (tmp_path / "system" / "results.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_gpu_rows_only_without_a_gpu_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", "--steps-devices", "cuda"])
    assert code == 2
    assert "CUDA reports no device" in capsys.readouterr().err
    assert not (tmp_path / "system" / "results.json").exists()


def test_cpu_off_measures_no_cpu_cell(tmp_path: Path) -> None:
    """``--steps-devices cuda`` on a GPU lease: no CPU cell runs (here, with no GPU, nothing)."""
    from fedtune.benchmarks.step_memory import measure

    results = measure(replace(TINY, cpu=False, gpu=False), tmp_path)
    assert results["rows"] == [] and results["gpu"] == {"measured": False, "note": NO_GPU}


def test_a_subset_of_kinds_and_precisions(tmp_path: Path) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", "--steps-kinds", "eval", "--steps-precisions", "bf16"])
    assert code == 0
    rows = json.loads((tmp_path / "system" / "results.json").read_text())["step_memory"]["rows"]
    assert {(r["device"], r["kind"], r["precision"]) for r in rows} >= {("cpu", "eval", "bf16")}
    assert all(r["kind"] == "eval" and r["precision"] == "bf16" for r in rows)


def test_unknown_kind_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "system", "--out", str(tmp_path), "--preset", "ci", "--parts",
                 "steps-memory", "--steps-kinds", "client,train"])
    assert code == 2
    err = capsys.readouterr().err
    assert "'client,train'" in err and "generate" in err


def test_rows_are_saved_as_they_are_measured(tmp_path: Path) -> None:
    """A run cut off after some cells keeps them: the partial file is rewritten per cell."""
    from fedtune.benchmarks.step_memory import measure

    partial = tmp_path / "out" / "step-memory.partial.json"
    spec = replace(TINY, kinds=("eval",), gpu=False)
    results = measure(spec, tmp_path / "cells", partial=partial)
    saved = json.loads(partial.read_text())
    assert saved["partial"] is True and len(saved["rows"]) == len(results["rows"]) == 2
    assert [r["precision"] for r in saved["rows"]] == ["fp32", "bf16"]
    assert not partial.with_name(partial.name + ".tmp").exists()
