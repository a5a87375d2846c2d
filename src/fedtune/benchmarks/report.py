"""Markdown tables and PNG plots of benchmark results (matplotlib, Agg canvas, no display).

Figures are drawn on :class:`matplotlib.figure.Figure` with an Agg canvas rather than through
``pyplot``: no global state, no GUI backend, safe in a server process or a test run.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.claims import evaluate_claims
from fedtune.benchmarks.peer import FLOOR
from fedtune.benchmarks.per_model import mean_std, per_model_lines
from fedtune.benchmarks.premises import premise_lines
from fedtune.benchmarks.suite import recorded_constant_answers, recorded_public_categories
from fedtune.benchmarks.synthesis_steps import synthesis_lines

__all__ = [
    "PLOT_METRICS",
    "is_png",
    "kfp_local_markdown",
    "mined_markdown",
    "plot_rounds",
    "quality_markdown",
    "record",
    "secagg_lines",
    "secagg_markdown",
    "system_markdown",
]

PLOT_METRICS: Final[dict[str, str]] = {
    "em": "exact match, balanced test set",
    "local_em": "exact match, each tenant's own task mix",
    "test_loss": "held-out loss (response tokens)",
    "train_loss": "clients' training loss",
}
_PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
_CANDIDATES: Final = "clients/fewfedpit/candidates"
_KEPT: Final = "clients/fewfedpit/kept"
_LEAKAGE: Final = ("leakage", "leakage/reproduced")
_ADAPEMU: Final = "adapemu/em"
_EPSILON: Final = "dp/epsilon"


def quality_markdown(results: Mapping[str, Any]) -> str:
    """The quality table (final round, mean ± std over seeds) and the paper claims."""
    spec = results["spec"]
    categories: list[str] = results["categories"]
    # FedPT's rows score the proxy-tuned large model; its small model gets its own column.
    small = any("small/em" in row["metrics"] for row in results["table"])
    leakage = any("leakage" in row["metrics"] for row in results["table"])
    # FewFedPIT's synthetic examples over a run: passed the filters / kept by IFS (what its
    # public parameters train on).
    synthetic = any(_CANDIDATES in row["metrics"] for row in results["table"])
    # FedBiOT's second output: the emulator with the adapter (the row's EM is AdapFu).
    adapemu = any(_ADAPEMU in row["metrics"] for row in results["table"])
    # Differential privacy: epsilon at the runs' delta after the last round.
    private = any(_EPSILON in row["metrics"] for row in results["table"])
    # The premises the table's paper claims rest on, with their numbers, above it; the claims
    # below read the same constant-answer EM.
    constant_em = recorded_constant_answers(results)
    public = recorded_public_categories(results)
    premises = premise_lines(results["runs"], constant_em=constant_em, public_categories=public)
    lines = [
        *(premises + [""] if premises else []),
        (
            f"Final round {spec['rounds']}; mean ± std over seeds {list(spec['seeds'])} "
            f"(n = runs); exact match (EM) is greedy, per category, on "
            f"{results['suite']['test']['records']} held-out records."
        ),
        *_split_lines(results),
        *_privacy_lines(results),
        "",
        "| method | n | EM | local EM | best-round EM | "
        + " | ".join(f"EM {c}" for c in categories)
        + " | Rouge-L | test loss |"
        + (" small-model EM |" if small else "")
        + (" leakage | reproduced |" if leakage else "")
        + (" synthetic passed / kept |" if synthetic else "")
        + (" AdapEmu EM |" if adapemu else "")
        + (" epsilon |" if private else "")
        + " s/run |",
        "|---|---:|---:|---:|---:|"
        + "---:|" * (len(categories) + small + 2 * leakage + synthetic + adapemu + private)
        + "---:|---:|---:|",
    ]
    for row in results["table"]:
        metrics = row["metrics"]
        cells = [
            row["method"],
            str(int(metrics["em"]["n"])),
            mean_std(metrics["em"]),
            mean_std(metrics["local_em"]),
            mean_std(row["best_em"]),
            *(f"{metrics[f'em/{c}']['mean']:.2f}" for c in categories),
            mean_std(metrics["rouge_l"]) if "rouge_l" in metrics else "-",
            mean_std(metrics["test_loss"]),
            *([mean_std(metrics["small/em"]) if "small/em" in metrics else "-"] if small else []),
            *([mean_std(metrics[k]) if k in metrics else "-" for k in _LEAKAGE] if leakage else []),
            *([_synthetic(metrics)] if synthetic else []),
            *([mean_std(metrics[_ADAPEMU]) if _ADAPEMU in metrics else "-"] if adapemu else []),
            *([_epsilon(metrics)] if private else []),
            f"{row['seconds']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += per_model_lines(results)
    lines += synthesis_lines(results)
    lines += _selection_lines(results)
    claims = evaluate_claims(results["runs"], constant_em=constant_em, public_categories=public)
    if claims:
        lines += [
            "",
            "Paper orderings, paired by seed: difference = mean of (first - second) over the "
            "seeds both ran (n), with its 95% t-interval; the verdict rule is "
            "`fedtune.benchmarks.claims`'s.",
            "",
            "| paper ordering | source | n | difference | 95% interval | verdict |",
            "|---|---|---:|---:|---|---|",
        ]
        for claim in claims:
            lines.append(
                f"| {claim['claim']} | {claim['source']} | {claim['n']} | "
                f"{claim['difference']:+.3f} | [{claim['low']:+.3f}, {claim['high']:+.3f}] | "
                f"{claim['verdict']} |"
            )
    return "\n".join(lines) + "\n"


def _selection_lines(results: Mapping[str, Any]) -> list[str]:
    """Each tuned method's grid: validation and test EM per point, the selected one marked."""
    selection = results.get("selection") or {}
    if not selection:
        return []
    lines = [
        "",
        "Tuned methods: each grid point's mean final EM over the seeds on the validation split "
        "(what selects) and on the test split (what the tuned row reports).",
        "",
        "| tuned method | grid point | n | validation EM | validation loss | test EM | |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for name, tuned in selection.items():
        for point in tuned["grid"]:
            mark = "**selected**" if point["label"] == tuned["selected"] else ""
            lines.append(
                f"| {name} | {point['label']} | {point['n']} | {point['val_em']:.3f} | "
                f"{point['val_loss']:.3f} | {point['test_em']:.3f} | {mark} |"
            )
    return lines


def _epsilon(metrics: Mapping[str, Mapping[str, float]]) -> str:
    """Epsilon (the same for every seed: it depends on the settings only), or no DP."""
    if _EPSILON not in metrics:
        return "no DP"
    return f"{metrics[_EPSILON]['mean']:.3g}"


def _synthetic(metrics: Mapping[str, Mapping[str, float]]) -> str:
    """``passed / kept`` synthetic examples per run (means over seeds), ``-`` if none made."""
    if _CANDIDATES not in metrics:
        return "-"
    kept = metrics[_KEPT]["mean"] if _KEPT in metrics else 0.0
    return f"{metrics[_CANDIDATES]['mean']:.0f} / {kept:.0f}"


def _privacy_lines(results: Mapping[str, Any]) -> list[str]:
    """The DP settings shared by the DP rows (their own noise multiplier is in the label)."""
    privacy = results["spec"].get("privacy") or {}
    if not any(_EPSILON in row["metrics"] for row in results["table"]):
        return []
    clipping = privacy.get("clipping", {})
    return [
        f"DP-FedAvg rows: clipping {clipping}, delta {privacy.get('delta', 1e-5):g}, uniform "
        "weights; epsilon from dp-accounting's RDP accountant after the last round."
    ]


def _split_lines(results: Mapping[str, Any]) -> list[str]:
    """What the tenants held, when not the suite's own tenants; what leakage measures."""
    spec = results["spec"]
    lines = []
    split = results.get("split", {})
    if split.get("name", "suite") != "suite":
        sizes = [t["records"] for t in split["tenants"].values()]
        per_round = spec.get("clients_per_round") or len(sizes)
        lines.append(
            f"Tenants: the {split['name']} split, {len(sizes)} tenants with {min(sizes)} to "
            f"{max(sizes)} records ({sum(sizes)} in all), {per_round} sampled per round."
        )
    if spec.get("audit_records"):
        lines.append(
            f"Leakage: mean Rouge-L of the final model's greedy answers to the training prompts "
            f"of {spec['audit_records']} of the tenants' records against the true responses "
            "(discoverable memorization; lower leaks less); reproduced: share at Rouge-L >= 0.7."
        )
    return lines


def _series(
    runs: Sequence[Mapping[str, Any]], metric: str
) -> dict[str, tuple[list[float], list[list[float]]]]:
    """Per method: the rounds, and per round the metric of every run that has it."""
    out: dict[str, tuple[list[float], list[list[float]]]] = {}
    for run in runs:
        rows = [r for r in run["rounds"] if r.get(metric) is not None]
        if not rows:
            continue
        rounds, values = out.setdefault(run["method"], ([], []))
        for row in rows:
            if row["round"] not in rounds:
                rounds.append(row["round"])
                values.append([])
            values[rounds.index(row["round"])].append(float(row[metric]))
    return out


def plot_rounds(results: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """One PNG per metric of :data:`PLOT_METRICS`: mean per round, band = min..max of seeds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for metric, title in PLOT_METRICS.items():
        series = _series(results["runs"], metric)
        if not series:
            continue
        figure = Figure(figsize=(7, 4.2), dpi=110)
        FigureCanvasAgg(figure)
        axes = figure.add_subplot()
        for method, (rounds, values) in series.items():
            order = sorted(range(len(rounds)), key=rounds.__getitem__)
            xs = [rounds[i] for i in order]
            means = [statistics.fmean(values[i]) for i in order]
            style = "--" if method in ("zero-shot", "standalone", "centralized") else "-"
            (line,) = axes.plot(xs, means, style, marker="o", markersize=3, label=method)
            if any(len(values[i]) > 1 for i in order):
                axes.fill_between(
                    xs,
                    [min(values[i]) for i in order],
                    [max(values[i]) for i in order],
                    color=line.get_color(),
                    alpha=0.15,
                    linewidth=0,
                )
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("round")
        axes.set_ylabel(metric)
        axes.set_title(title)
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, ncol=2)
        figure.tight_layout()
        path = out / f"{metric}.png"
        figure.savefig(path, format="png")
        written.append(path)
    return written


def is_png(path: str | Path) -> bool:
    """True when ``path`` is a PNG that Pillow can fully decode."""
    from PIL import Image

    file = Path(path)
    if not file.is_file() or file.read_bytes()[:8] != _PNG_SIGNATURE:
        return False
    try:
        with Image.open(file) as image:
            image.load()
    except OSError:
        return False
    return True


def system_markdown(results: Mapping[str, Any]) -> str:
    """The system benchmark's tables: client step, engine overhead, bytes, server memory."""
    device = results["device"]
    lines = [
        f"Device: {device['description']} (torch {device['torch']}, threads: {device['threads']}).",
        "",
    ]
    client = results.get("client_step")
    if client:
        lines += [
            (
                f"**Client step vs bare PyTorch + PEFT loop** ({client['model']}, batch "
                f"{client['batch_size']}, {client['steps']} steps, {client['reps']} interleaved "
                f"repetitions, medians, on {client.get('device', 'cpu')}):"
            ),
            "",
            "| loop | seconds | tokens/s |",
            "|---|---:|---:|",
            (
                f"| fedtune client step (whole step) | {client['platform_seconds']:.3f} | "
                f"{client['platform_tokens_per_s']:,.0f} |"
            ),
            (
                f"| fedtune training loop only | {client['platform_train_seconds']:.3f} | "
                f"{client['platform_train_tokens_per_s']:,.0f} |"
            ),
            f"| bare PyTorch + PEFT | {client['bare_seconds']:.3f} | {client['bare_tokens_per_s']:,.0f} |",
            "",
            (
                f"Ratio whole step / bare: **{client['ratio']:.3f}** (aim <= {client['aim']}); "
                f"training loop / bare: {client['train_ratio']:.3f}; the two trained the same "
                f"adapter (max abs difference {client['max_abs_diff']:.1e}). {client['verdict']}"
            ),
            "",
        ]
    if results.get("secagg"):
        lines += secagg_lines(results["secagg"])
    peer = results.get("peer")
    if peer:
        lines += _peer_lines(peer)
    engine = results.get("engine")
    if engine:
        lines += [
            (
                f"**Engine overhead** ({engine['num_rounds']} rounds of {engine['algorithm']}, "
                f"{engine['tenants']} tenants): steady-state round wall time / (training + "
                f"aggregation) = **{engine['steady_overhead']:.3f}**."
            ),
            "",
        ]
    sizes = results.get("bytes")
    if sizes:
        lines += [
            (
                "**Bytes per round per tenant** (stored = safetensors + JSON metadata; raw = "
                "tensor bytes of the message; trainable = the LoRA adapter's bytes):"
            ),
            "",
            (
                "| algorithm | broadcast stored | broadcast raw | update stored | update raw | "
                "trainable | update stored / raw | update raw / trainable | aim |"
            ),
            "|---|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for row in sizes:
            lines.append(
                f"| {row['algorithm']} | {row['broadcast_bytes']:,} | {row['broadcast_raw_bytes']:,} | "
                f"{row['update_bytes']:,} | {row['update_raw_bytes']:,} | {row['trainable_bytes']:,} | "
                f"{row['update_ratio']:.4f} | {row['update_vs_trainable']:.2f} | "
                f"{'met' if row['update_ratio'] <= 1.01 else 'missed'} |"
            )
        lines.append("")
    memory = results.get("server_memory")
    if memory:
        lines += [
            (
                f"**Server step peak memory** ({memory['description']}, "
                f"{memory['rows'][0].get('parameters', 0):,} parameters):"
            ),
            "",
            "| mode | ranks | peak MiB | added by training MiB | s/step |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in memory["rows"]:
            if row.get("error"):
                lines.append(f"| {row['mode']} | {row['ranks']} | - | - | - ({row['error']}) |")
                continue
            lines.append(
                f"| {row['mode']} | {row['ranks']} | {row['peak_mib']:,.0f} | "
                f"{row['added_mib']:,.0f} | {row['seconds_per_step']:.2f} |"
            )
        lines.append("")
    steps = results.get("step_memory")
    if steps:
        lines += step_memory_lines(steps)
    for note in results.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"


def _machine(before: Mapping[str, Any]) -> str:
    """The machine's size (its load, also recorded, is no property of what is measured)."""
    return f"{before['cpu_count']} cores, {before['mem_available_gib']:.1f} GiB available before"


def step_memory_lines(steps: Mapping[str, Any]) -> list[str]:
    """Peak memory and speed per step kind (:mod:`fedtune.benchmarks.step_memory`)."""
    lines = [] if not steps["rows"] else [
        (
            f"**Peak memory per step kind** ({steps['description']}; one fresh process per "
            f"cell, one at a time; machine: {_machine(steps['load_before'])}):"
        ),
        "",
        "| device | step | precision | checkpointing | peak MiB | model MiB | added by the step MiB "
        "| s/step | tokens/s |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in steps["rows"]:
        head = (  # (no rows: a speed-only run, no memory table)
            f"| {row['device']} | {row['kind']} | {row['precision']} | "
            f"{'on' if row['checkpointing'] else 'off'} |"
        )
        if "peak_mib" not in row:
            lines.append(f"{head} - | - | - | - | - ({row.get('error', 'no peak measure')}) |")
            continue
        lines.append(
            f"{head} {row['peak_mib']:,.0f} | {row['model_mib']:,.0f} | {row['added_mib']:,.0f} | "
            f"{row['seconds_per_step']:.2f} | {row['tokens_per_s']:,.1f} |"
        )
    lines += [
        "",
        "Peak: CPU, the process's resident high-water mark after the models were built "
        "(so it counts them); CUDA, `torch.cuda.max_memory_allocated`. Model: memory the "
        "built models took. Tokens/s: CPU cells on one thread, steady steps (the first is "
        "not timed); generation counts the new tokens asked for.",
        "",
    ] if steps["rows"] else []
    gpu = steps["gpu"]
    if not gpu["measured"]:
        return lines + [f"GPU: {gpu['note']}.", ""]
    if any(row.get("variant", "plain") != "plain" for row in gpu.get("variants", [])):
        return lines + speed_variant_lines(steps["description"], gpu["variants"])
    speed = gpu["client_speed"]
    if "error" in speed:
        return lines + [f"GPU client-step speed: not measured ({speed['error']}).", ""]

    def share(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f} %"

    return lines + [
        (
            f"**Client step on {speed['device']}** ({speed['precision']}, batch "
            f"{speed['batch_size']} x {speed['seq_len']} tokens, {speed['steps']} steps, "
            f"{speed['reps']} alternating pairs, best of each): model FLOPs per token "
            f"{speed['flops_per_token']:,} = `{speed['flops_formula']}`; device peak "
            + (
                f"{speed['peak_bf16_flops'] / 1e12:,.0f} TFLOP/s dense bf16."
                if speed["peak_bf16_flops"]
                else "unknown (not in the table): no MFU."
            )
        ),
        "",
        "| loop | tokens/s | MFU |",
        "|---|---:|---:|",
        f"| fedtune client step | {speed['fedtune_tokens_per_s']:,.0f} | {share(speed['fedtune_mfu'])} |",
        f"| bare PEFT loop | {speed['bare_tokens_per_s']:,.0f} | {share(speed['bare_mfu'])} |",
        *_compiled_row(speed.get("compiled_bare"), share),
        "",
        f"fedtune / bare time: **{speed['ratio']:.3f}** (aim <= 1.05; MFU aim >= 40 %).",
        "",
    ]


def speed_variant_lines(description: str, rows: list[Mapping[str, Any]]) -> list[str]:
    """The client step per variant (plain, ``training.compile``, ``training.kernels: liger``,
    both), each against the bare eager PEFT loop measured in the same process
    (:func:`fedtune.benchmarks.step_memory.measure_client_speed`)."""
    from fedtune.benchmarks.step_memory import percent

    measured = [r for r in rows if "fedtune_tokens_per_s" in r]
    if not measured:
        return ["GPU client-step speed: no variant measured ("
                + "; ".join(f"{r['variant']}: {r.get('skipped') or r.get('error')}" for r in rows)
                + ").", ""]
    first = measured[0]
    peak = first["peak_bf16_flops"]
    lines = [
        (
            f"**Client step variants on {first['device']}** ({description.split(', random')[0]}; "
            f"{first['precision']}, batch {first['batch_size']} x {first['seq_len']} tokens, "
            f"{first['steps']} steps, {first['reps']} alternating pairs with the bare eager PEFT "
            "loop in each variant's own process, best of each): model FLOPs per token "
            f"{first['flops_per_token']:,} = `{first['flops_formula']}`; device peak "
            + (f"{peak / 1e12:,.0f} TFLOP/s dense bf16." if peak else "unknown: no MFU.")
        ),
        "",
        "| fedtune client step | tokens/s | MFU | x bare eager tokens/s | bare eager tokens/s "
        "| bare eager MFU | first run s | peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        name = row["variant"]
        if "fedtune_tokens_per_s" not in row:
            reason = row.get("skipped") or row.get("error")
            lines.append(f"| {name} | - | - | - | - | - | - | - ({reason}) |")
            continue
        peak_mib = row.get("peak_mib")
        lines.append(
            f"| {name} | {row['fedtune_tokens_per_s']:,.0f} | {percent(row['fedtune_mfu'])} | "
            f"{row['speedup']:.2f} | {row['bare_tokens_per_s']:,.0f} | "
            f"{percent(row['bare_mfu'])} | {row['first_run_s']:.1f} | "
            + ("-" if peak_mib is None else f"{peak_mib:,.0f}") + " |"
        )
    for row in measured:
        compiled = row.get("compiled_bare")
        if compiled:
            lines.append(
                f"| (bare PEFT loop + `torch.compile`, reference) | {compiled['tokens_per_s']:,.0f} "
                f"| {percent(compiled.get('mfu'))} | "
                f"{compiled['tokens_per_s'] / row['bare_tokens_per_s']:.2f} | - | - | "
                f"{compiled['first_run_s']:.1f} | - |"
            )
    return lines + [
        "",
        "First run: the variant's first client step of the process (compiling, for "
        "`compile`; a process pays it once per model). Peak: both loops' models and steps "
        "(`torch.cuda.max_memory_allocated`). Goals (1B shape): MFU >= 40 %, "
        ">= 1.8x the bare eager loop's tokens/s.",
        "",
    ]


def _compiled_row(compiled: Mapping[str, Any] | None,
                  share: Callable[[float | None], str]) -> list[str]:
    """The torch.compile reference row, where it was measured (CUDA only)."""
    if not compiled:
        return []
    return [
        f"| bare PEFT loop + `torch.compile` (reference; first run {compiled['first_run_s']:.0f} s, "
        f"compiling) | {compiled['tokens_per_s']:,.0f} | {share(compiled.get('mfu'))} |"
    ]


def secagg_lines(secagg: Mapping[str, Any]) -> list[str]:
    """The secure-aggregation table: bytes (exact) and time (ratio) per round vs plain."""
    spec = secagg["spec"]
    params = spec["tensors"] * spec["tensor_size"]
    lines = [
        (
            f"**Secure aggregation vs plain, one round** (commit {secagg.get('commit') or 'unknown'}; "
            f"{params:,} float32 parameters per update in {spec['tensors']} tensors; every party "
            f"in turn in one process, one torch thread; time = best of {spec['reps']} alternating "
            "repetitions; bytes as stored, per tenant):"
        ),
        "",
        "| tenants | graph | neighbours | threshold | plain up | secure up | secure down | up / plain | plain s | secure s | time / plain | max abs diff |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in secagg["rows"]:
        lines.append(
            f"| {r['tenants']} | {r['neighbours']} | {r['degree']} | {r['threshold']} | "
            f"{r['plain_up_bytes']:,} | {r['secure_up_bytes']:,} | {r['secure_down_bytes']:,} | "
            f"{r['up_ratio']:.3f} | {r['plain_seconds']:.3f} | {r['secure_seconds']:.3f} | "
            f"{r['time_ratio']:.2f} | {r['max_abs_diff']:.1e} |"
        )
    return [*lines, ""]


def _peaks(row: Mapping[str, Any]) -> str:
    """A peer row's peak resident memory: the engine process's; each worker's."""
    if "engine_peak_rss_mib" not in row:
        return "-"  # the bare loop
    text = f"{row['engine_peak_rss_mib']:,.0f}"
    workers = row.get("workers_peak_rss_mib")
    return text + (f"; {', '.join(f'{w:,.0f}' for w in workers)}" if workers else "")


def _peer_lines(peer: Mapping[str, Any]) -> list[str]:
    """One table per peer job: fedtune's runs against the bare sequential loop, with aims."""
    lines: list[str] = []
    if peer.get("commit"):
        lines += [f"Measured at commit {peer['commit']}.", ""]
    # Results recorded before there were several jobs hold one job (the larger) and one aim.
    jobs = peer.get("jobs") or [{"name": "large", "job": peer["job"], "rows": peer["rows"]}]
    for entry in jobs:
        job = entry["job"]
        lines += [
            (
                f"**Peer job {entry['name']!r} vs a bare sequential PyTorch + PEFT loop** (FedAvg, "
                f"{job['rounds']} rounds x {job['tenants']} tenants x {job['steps']} steps, batch "
                f"{job['batch_size']}, length {job['max_seq_len']}, model {job['model']}; whole-"
                f"process wall time, best of alternating runs, {peer['cores']} cores, one torch "
                "thread per process):"
            ),
            "",
        ]
        # Results recorded before fedtune reported memory (or the floor) have no such column.
        memory = any("engine_peak_rss_mib" in r for r in entry["rows"])
        floor = any("floor_ratio" in r for r in entry["rows"])
        lines += [
            "| run | seconds | / bare |" + (" / floor |" if floor else "") + " aim |"
            + (" peak RSS MiB (engine; workers) |" if memory else ""),
            "|---|---:|---:|" + ("---:|" if floor else "") + "---|" + ("---|" if memory else ""),
            *[
                f"| {r['run']} | {r['seconds']:.1f} | {r['ratio']:.3f} | "
                + (f"{r['floor_ratio']:.3f} | " if floor else "")
                + (_peer_aim(r) if "aim" in r else "")
                + " |"
                + (f" {_peaks(r)} |" if memory else "")
                for r in entry["rows"]
            ],
            "",
        ]
        if "aim" in peer:
            lines += [f"Aim for fedtune with N workers: <= {peer['aim']} x the bare loop.", ""]
    return lines


def _peer_aim(row: Mapping[str, Any]) -> str:
    """``<= 0.65 x floor (met)``: rows recorded before the aims were against the floor
    (no ``aim_of``) were against the bare loop."""
    basis = "floor" if row.get("aim_of") == FLOOR else "bare"
    return f"<= {row['aim']:g} x {basis} ({'met' if row['met'] else 'missed'})"


def secagg_markdown(results: Mapping[str, Any]) -> str:
    """The secure-aggregation table of ``fedtune bench system --parts secagg`` results."""
    return "\n".join(secagg_lines(results["secagg"]))


def dpsgd_markdown(results: Mapping[str, Any]) -> str:
    """A tenant's client step with and without its DP-SGD (``fedtune.benchmarks.dp_sgd``)."""
    dp = results["dp_sgd"]
    best = results["best_step_seconds"]
    lines = [
        f"**Client step with and without DP-SGD** ({results['job']}, tenant {results['tenant']}: "
        f"{results['examples']} training examples, {results['local_steps']} local steps, batch "
        f"{results['batch_size']} (expected Poisson batch under DP-SGD), noise multiplier "
        f"{dp['noise_multiplier']:g}, max_grad_norm {dp['max_grad_norm']:g}; {results['reps']} "
        f"alternating pairs, {results['torch_threads']} torch thread):",
        "",
        "| | plain | DP-SGD | DP-SGD / plain (median of pairs) |",
        "|---|---:|---:|---:|",
        f"| whole client step (best) | {best['plain']:.2f} s | {best['dp-sgd']:.2f} s | "
        f"{results['ratio_median']:.2f} x |",
        f"| training loop only (best) | {min(results['train_seconds']['plain']):.2f} s | "
        f"{min(results['train_seconds']['dp-sgd']):.2f} s | {results['train_ratio_median']:.2f} x |",
    ]
    return "\n".join(lines)


def record(results: Mapping[str, Any], path: Path) -> list[Path]:
    """Write ``results`` to ``path`` (a ``docs/results/*.json``) and regenerate the blocks of
    the docs folder's Markdown files generated from it (:mod:`fedtune.benchmarks.docs`);
    return the files rewritten."""
    from fedtune.benchmarks.docs import regenerate

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    docs = path.resolve().parents[1]
    changed = []
    for page in sorted(docs.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        new = regenerate(text, docs.parent)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def mined_markdown(results: Mapping[str, Any]) -> str:
    """FedMKT's MinED vocabulary mapping times, cold and cached (``scripts/bench_mined.py``)."""
    device = results["device"]
    lines = [
        f"Device: {device['description']} (torch {device['torch']}, threads: "
        f"{device['threads']}), rapidfuzz {results['rapidfuzz']}, measured at commit "
        f"{results['provenance']['measured_at_commit']}.",
        "",
        "| pair | cold, wall | cached, wall | cold, CPU | cached, CPU | cold / cached (CPU) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for pair in results["pairs"]:
        lines.append(
            f"| {pair['src_vocab']:,} -> {pair['dst_vocab']:,} | {pair['cold_s']:.1f} s | "
            f"{pair['cached_s']:.2f} s | {pair['cold_cpu_s']:.1f} s | {pair['cached_cpu_s']:.2f} s "
            f"| {pair['cold_cpu_s'] / pair['cached_cpu_s']:.0f} x |"
        )
    return "\n".join(lines) + "\n"


def kfp_local_markdown(results: Mapping[str, Any]) -> str:
    """kfp-local against the local engine, whole processes (:mod:`fedtune.benchmarks.kfp_local`)."""
    lines = [
        (
            f"**`fedtune run --engine kfp-local` vs `--engine local`** ({results['job']}; "
            f"whole-process wall time, best of {results['reps']} alternating repetitions, one "
            f"torch thread per process, {results['cores']} cores):"
        ),
        "",
        "| run | best s | runs s | / local | aim |",
        "|---|---:|---|---:|---|",
    ]
    aim = float(results["aim"])
    for name in sorted(results["best"], key=lambda n: (n != "local", n)):
        best, ratio = results["best"][name], results["ratio"][name]
        if name == "local":
            verdict = ""
        elif "baseline" in name:
            verdict = f"(before, commit {results.get('baseline_commit') or 'unknown'})"
        else:
            verdict = f"<= {aim:g} ({'met' if ratio <= aim else 'missed'})"
        runs = ", ".join(f"{s:.1f}" for s in results["seconds"][name])
        lines.append(f"| {name} | {best:.1f} | {runs} | {ratio:.2f} | {verdict} |")
    return "\n".join(lines) + "\n"
