"""Markdown tables and PNG plots of benchmark results (matplotlib, Agg canvas, no display).

Figures are drawn on :class:`matplotlib.figure.Figure` with an Agg canvas rather than through
``pyplot``: no global state, no GUI backend, safe in a server process or a test run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.claims import evaluate_claims

__all__ = ["PLOT_METRICS", "is_png", "plot_rounds", "quality_markdown", "system_markdown"]

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


def _pm(stats: Mapping[str, float], digits: int = 3) -> str:
    if stats["n"] < 2:
        return f"{stats['mean']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


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
    lines = [
        (
            f"Final round {spec['rounds']}; mean ± std over seeds {list(spec['seeds'])} "
            f"(n = runs); exact match (EM) is greedy, per category, on "
            f"{results['suite']['test']['records']} held-out records."
        ),
        *_split_lines(results),
        "",
        "| method | n | EM | local EM | best-round EM | "
        + " | ".join(f"EM {c}" for c in categories)
        + " | Rouge-L | test loss |"
        + (" small-model EM |" if small else "")
        + (" leakage | reproduced |" if leakage else "")
        + (" synthetic passed / kept |" if synthetic else "")
        + (" AdapEmu EM |" if adapemu else "")
        + " s/run |",
        "|---|---:|---:|---:|---:|"
        + "---:|" * (len(categories) + small + 2 * leakage + synthetic + adapemu)
        + "---:|---:|---:|",
    ]
    for row in results["table"]:
        metrics = row["metrics"]
        cells = [
            row["method"],
            str(int(metrics["em"]["n"])),
            _pm(metrics["em"]),
            _pm(metrics["local_em"]),
            _pm(row["best_em"]),
            *(f"{metrics[f'em/{c}']['mean']:.2f}" for c in categories),
            _pm(metrics["rouge_l"]) if "rouge_l" in metrics else "-",
            _pm(metrics["test_loss"]),
            *([_pm(metrics["small/em"]) if "small/em" in metrics else "-"] if small else []),
            *([_pm(metrics[k]) if k in metrics else "-" for k in _LEAKAGE] if leakage else []),
            *([_synthetic(metrics)] if synthetic else []),
            *([_pm(metrics[_ADAPEMU]) if _ADAPEMU in metrics else "-"] if adapemu else []),
            f"{row['seconds']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _per_model_lines(results)
    lines += _selection_lines(results)
    claims = evaluate_claims(results["runs"])
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


def _per_model_lines(results: Mapping[str, Any]) -> list[str]:
    """FedMKT's per-model table: the LLM's EM and each tenant's small model's ("-": the method
    has no such model), when the results name models (``llm/em``, ``slm/em/<tenant>``)."""
    table = results["table"]
    if not any("slm/em" in row["metrics"] for row in table):
        return []
    tenants = sorted(
        {k.split("/", 2)[2] for row in table for k in row["metrics"] if k.startswith("slm/em/")}
    )
    keys = ["llm/em", "slm/em", "slm/local_em", *(f"slm/em/{t}" for t in tenants)]
    lines = [
        "",
        "Per model: the LLM (the benchmark's model) and the tenants' small models, each scored "
        "on the test set; SLM = mean over tenants, SLM local = each on its own tenant's task mix.",
        "",
        "| method | LLM EM | SLM EM | SLM local EM | " + " | ".join(f"SLM EM {t}" for t in tenants) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in table:
        metrics = row["metrics"]
        cells = [_pm(metrics[k]) if k in metrics else "-" for k in keys]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    return lines


def _synthetic(metrics: Mapping[str, Mapping[str, float]]) -> str:
    """``passed / kept`` synthetic examples per run (means over seeds), ``-`` if none made."""
    if _CANDIDATES not in metrics:
        return "-"
    kept = metrics[_KEPT]["mean"] if _KEPT in metrics else 0.0
    return f"{metrics[_CANDIDATES]['mean']:.0f} / {kept:.0f}"


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
    peer = results.get("peer")
    if peer:
        job = peer["job"]
        lines += [
            (
                f"**Peer job vs a bare sequential PyTorch + PEFT loop** (FedAvg, {job['rounds']} "
                f"rounds x {job['tenants']} tenants x {job['steps']} steps, batch "
                f"{job['batch_size']}, length {job['max_seq_len']}, model {job['model']}; whole-"
                f"process wall time, best of alternating runs, {peer['cores']} cores, one torch "
                "thread per process):"
            ),
            "",
            "| run | seconds | / bare |",
            "|---|---:|---:|",
            *[f"| {r['run']} | {r['seconds']:.1f} | {r['ratio']:.3f} |" for r in peer["rows"]],
            "",
            f"Aim for fedtune with N workers: <= {peer['aim']} x the bare loop.",
            "",
        ]
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
    for note in results.get("notes", []):
        lines.append(f"- {note}")
    return "\n".join(lines) + "\n"
