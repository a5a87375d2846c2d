"""``fedtune bench``: measured ratios, printed side by side from one run (never timed tests).

Kinds: ``engine`` (overhead of one job), ``pretrain`` (task suite and base models),
``quality`` (algorithms against their papers' baselines), ``system`` (client step versus a
bare loop, engine overhead, bytes, server memory), ``token-mapping`` (FedMKT's vocabulary
mapping and alignment across tokenizer families). Adding a kind is one ``_add_*`` function
and one entry in :data:`BENCH_KINDS`; the library code lives in :mod:`fedtune.benchmarks`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from fedtune.config import load_job
from fedtune.core.errors import ConfigError

__all__ = ["BENCH_KINDS", "register_bench"]

out = Console(highlight=False)


# -- engine -----------------------------------------------------------------------------------
def _bench_engine(args: argparse.Namespace) -> int:
    from fedtune.benchmarks.engine import engine_report
    from fedtune.engines.local import RunOptions, run_job
    from fedtune.tracking.base import NullTracker

    job = load_job(args.job)
    with tempfile.TemporaryDirectory() as workdir:
        update: dict[str, Any] = {"workdir": workdir, "exchange_uri": None}
        if args.rounds:
            update["rounds"] = args.rounds
        job = job.model_copy(update=update)
        job = job.model_copy(
            update={"tenants": [t.model_copy(update={"store_uri": None}) for t in job.tenants]}
        )
        summary = run_job(job, NullTracker(), RunOptions(progress=not args.no_progress))
    report = engine_report(summary)
    table = Table(title=f"engine benchmark: {job.name} ({job.algorithm.name})")
    for column in ("round", "wall s", "train+agg s", "overhead", "w/ eval", "bytes/tenant", "raw", "bytes ratio"):
        table.add_column(column, justify="right")
    for row in report["rounds"]:
        table.add_row(
            str(row["round"]),
            f"{row['wall_seconds']:.2f}",
            f"{row['compute_seconds']:.2f}",
            f"{row['overhead']:.3f}",
            f"{row['overhead_with_eval']:.3f}",
            f"{row['bytes_per_tenant']:,.0f}",
            f"{row['raw_bytes_per_tenant']:,.0f}",
            f"{row['bytes_ratio']:.4f}",
        )
    out.print(table)
    out.print(
        f"steady-state overhead {report['steady_overhead']:.3f} (aim <= 1.10), "
        f"with eval as compute {report['steady_overhead_with_eval']:.3f}; "
        f"bytes {report['bytes_ratio']:.4f} x raw (aim <= 1.01)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


def _add_engine(kinds: Any) -> None:
    engine = kinds.add_parser(
        "engine",
        help="engine overhead and bytes per round versus raw tensor bytes",
        description="Run JOB.yaml in a temporary work directory (no tracking) and report, per "
        "round, wall time / (local training + aggregation compute) and the bytes each tenant's "
        "update takes in the store / its raw tensor bytes.",
    )
    engine.add_argument("job", help="path of the job YAML file")
    engine.add_argument("--rounds", type=int, help="override the number of rounds")
    engine.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    engine.add_argument("--no-progress", action="store_true", help="no progress bars")
    engine.set_defaults(handler=_bench_engine)


# -- shared options -----------------------------------------------------------------------------
def _names(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(n) for n in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _params(items: list[str] | None) -> dict[str, dict[str, Any]]:
    """``--param ALGORITHM.FIELD=VALUE`` options (values read as YAML scalars)."""
    params: dict[str, dict[str, Any]] = {}
    for item in items or []:
        target, sep, value = item.partition("=")
        algorithm, dot, key = target.partition(".")
        if not (sep and dot and algorithm and key):
            raise ConfigError(
                f"--param {item!r} is not ALGORITHM.FIELD=VALUE",
                fix="Write e.g. --param fedprox.mu=0.1 (one --param per field).",
            )
        params.setdefault(algorithm, {})[key] = yaml.safe_load(value)
    return params


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="benchmark workspace folder")
    parser.add_argument(
        "--preset",
        default="default",
        help="settings preset: default (documented), deep (6-layer large model), ci "
        "(seconds), or one per table: fedbiot, fedbiot-ablation (8-layer base), fedopt-tuned, "
        "fedprox-mu, scaffold-sgd",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the preset at the CI sizes (tiny suite and models, 2 seeds, 1 round): checks a "
        "table end to end in minutes; use its own --out, never for documented numbers",
    )
    parser.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads (default: torch's choice); 1 avoids OpenMP oversubscription "
        "on a machine shared with other jobs",
    )


def _workspace(args: argparse.Namespace) -> Any:
    from transformers.utils import logging as hf_logging

    from fedtune.benchmarks.workspace import Workspace

    # A benchmark loads and saves dozens of tiny models; their progress bars drown the report.
    hf_logging.disable_progress_bar()

    if args.threads is not None:
        import torch

        if args.threads < 1:
            raise ConfigError(f"--threads {args.threads} must be >= 1", fix="Use e.g. --threads 1.")
        torch.set_num_threads(args.threads)
    return Workspace(Path(args.out))


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# -- pretrain -----------------------------------------------------------------------------------
def _bench_pretrain(args: argparse.Namespace) -> int:
    from fedtune.benchmarks.bases import adopt_committed
    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.pretrain import cached_report, corpus_digest, pretrain
    from fedtune.benchmarks.suite import build_suite, write_suite

    preset = get_preset(args.preset, smoke_test=args.smoke)
    workspace = _workspace(args)
    suite_spec = (
        preset.suite if args.seed is None else dataclasses.replace(preset.suite, seed=args.seed)
    )
    suite = build_suite(suite_spec)
    write_suite(suite, workspace.suite_dir)
    out.print(
        f"task suite: {workspace.suite_dir} ({len(suite.tenants)} tenants, "
        f"{len(suite.public)} public, {len(suite.pretrain)} pretraining, {len(suite.test)} test "
        "records)"
    )
    names = _names(args.models) if args.models else tuple(preset.models)
    unknown = [n for n in names if n not in preset.models]
    if unknown:
        raise ConfigError(
            f"unknown base model(s) {unknown} in preset {args.preset!r}",
            fix=f"Use some of: {', '.join(preset.models)}.",
        )
    for name in names:
        spec = preset.models[name]
        changes: dict[str, Any] = {}
        if args.steps is not None:
            changes["steps"] = args.steps
            if spec.warmup_steps >= args.steps:  # a short trial run: warm up a tenth of it
                changes["warmup_steps"] = args.steps // 10
        if args.seed is not None:
            changes["seed"] = args.seed
        spec = dataclasses.replace(spec, **changes)
        corpus = corpus_digest(suite.pretrain)
        report = cached_report(workspace.model_dir(name), spec, corpus)
        if report is not None and not args.force:
            out.print(f"{name}: already pretrained with this spec ({report['spec_hash']}), kept")
        elif not args.force and (
            report := adopt_committed(name, spec, corpus, workspace.model_dir(name))
        ):
            out.print(f"{name}: the committed base of this spec ({report['spec_hash']}), copied")
        else:
            out.print(f"pretraining {name}: {spec.steps} steps ({spec.tokenizer} tokenizer) ...")
            report = pretrain(spec, suite.pretrain, suite.test, workspace.model_dir(name))
        test = report["test"]
        per_category = ", ".join(
            f"{c} {test[f'em/{c}']:.2f}" for c in suite.spec.tenant_mixture if f"em/{c}" in test
        )
        out.print(
            f"{name}: {report['parameters']:,} parameters, {spec.steps} steps in "
            f"{report['seconds']:.0f} s, final loss {report['final_loss']:.3f}, test EM "
            f"{test['em']:.3f} ({per_category})"
        )
    out.print(
        f"models: {workspace.root / 'models'} (use as model: {{source: pretrained, uri: DIR}})"
    )
    return 0


def _add_pretrain(kinds: Any) -> None:
    p = kinds.add_parser(
        "pretrain",
        help="build the task suite and pretrain the tiny base models (large, small, and the "
        "heterogeneous tenants' small models)",
        description="Write the synthetic task suite (non-IID tenants, a public set with "
        "another category mixture, a held-out test set) to DIR/suite and pretrain the base "
        "models from scratch on the public set into DIR/models/NAME (Hugging Face "
        "directories), each with its own tokenizer. Deterministic given the seed; a model "
        "already pretrained with the same spec and suite is kept.",
    )
    _common(p)
    p.add_argument("--models", help="comma-separated base models (default: all of the preset)")
    p.add_argument("--steps", type=int, help="override the pretraining steps of every model (a warm-up longer than that "
        "becomes a tenth of it)")
    p.add_argument("--seed", type=int, help="seed of the suite and the models (default 0)")
    p.add_argument(
        "--force",
        action="store_true",
        help="pretrain again even where the workspace holds a model of the same spec and "
        "corpus (by default such a model is kept: pretraining is deterministic)",
    )
    p.set_defaults(handler=_bench_pretrain)


# -- quality ------------------------------------------------------------------------------------
def _bench_quality(args: argparse.Namespace) -> int:
    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.provenance import provenance
    from fedtune.benchmarks.quality import run_quality
    from fedtune.benchmarks.report import plot_rounds, quality_markdown
    from fedtune.core.errors import ConfigError

    preset = get_preset(args.preset, smoke_test=args.smoke)
    if args.comparison != "fedit" and args.split == "fewshot":
        raise ConfigError(
            f"--comparison {args.comparison} runs on the suite's tenants, not --split fewshot",
            fix=f"Drop --split fewshot (or --comparison {args.comparison}).",
        )
    spec = preset.fewshot_quality if args.split == "fewshot" else preset.quality
    if args.comparison == "fedmkt":
        spec = preset.fedmkt_quality
    elif args.comparison == "dp":
        spec = preset.dp_quality
    elif args.comparison == "fedmkt-hetero":
        spec = preset.fedmkt_hetero_quality
    changes: dict[str, Any] = {}
    for option in (
        "algorithms",
        "baselines",
        "seeds",
        "rounds",
        "local_steps",
        "model",
        "eval_every",
        "lr",
        "optimizer",
        "clients_per_round",
        "audit_records",
    ):
        value = getattr(args, option)
        if value is not None:
            changes[option] = value
    if args.lora_targets is not None:
        changes["lora_targets"] = None if args.lora_targets == ("default",) else args.lora_targets
    spec = dataclasses.replace(spec, **changes)
    if args.algorithms is not None:
        # Only the preset's tuned methods whose whole grid still runs.
        running = set(spec.algorithms)
        spec = dataclasses.replace(
            spec, select={k: v for k, v in spec.select.items() if set(v) <= running}
        )
    spec = dataclasses.replace(spec, algorithm_params=_quality_params(spec, _params(args.param)))
    workspace = _workspace(args)
    # Taken before the run: the code that runs is the code checked out now.
    measured = provenance(
        f"fedtune bench quality --out {args.out} --preset {args.preset} --comparison "
        f"{args.comparison} --split {args.split}"
        + (f" --threads {args.threads}" if args.threads is not None else "")
        + (f" (changed: {sorted(changes)})" if changes or args.param else "")
    )
    results = run_quality(workspace, spec, log=out.print)
    results["provenance"] = measured
    results["preset"] = args.preset + (" --smoke" if args.smoke else "")
    # The commit the run started from, not the one checked out when it ends (hours later).
    results["commit"] = measured["measured_at_commit"]
    out_dir = workspace.quality_dir
    _write_json(out_dir / "results.json", results)
    markdown = quality_markdown(results)
    (out_dir / "results.md").write_text(markdown, encoding="utf-8")
    plots = plot_rounds(results, out_dir / "plots")
    out.print(markdown)
    out.print(
        f"results: {out_dir / 'results.json'}, {out_dir / 'results.md'}; plots: {', '.join(p.name for p in plots)}"
    )
    _record(results, args.record)
    return 0


def _quality_params(spec: Any, given: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The preset's settings of the algorithms that run, updated field by field with
    ``--param`` (which may name only algorithms that run: the benchmark checks)."""
    from fedtune.benchmarks.methods import parse_method

    running = {parse_method(label).algorithm for label in spec.algorithms}
    params = {a: dict(p) for a, p in spec.algorithm_params.items() if a in running}
    for algorithm, fields in given.items():
        params[algorithm] = params.get(algorithm, {}) | fields
    return params


def _add_quality(kinds: Any) -> None:
    p = kinds.add_parser(
        "quality",
        help="algorithms against their papers' baselines on the task suite, several seeds",
        description="Run each algorithm and baseline (zero-shot, standalone, centralized) on "
        "the workspace's suite from its pretrained base model, once per seed; write "
        "DIR/quality/results.json, results.md (mean and spread) and plots/*.png (per round).",
    )
    _common(p)
    _add_record(p, "docs/results/fedbiot-quality.json")
    p.add_argument(
        "--split",
        choices=["suite", "fewshot"],
        default="suite",
        help="the tenants' data: the suite's tenants (default), or FewFedPIT's few-shot split "
        "of its pool (DIR/suite/fewshot, drawn on first use) with FewFedPIT's comparison: "
        "FedIT's methods, Centralized, fewfedpit at beta 0/0.5/1, leakage audit",
    )
    p.add_argument(
        "--comparison",
        choices=["fedit", "fedmkt", "fedmkt-hetero", "dp"],
        default="fedit",
        help="the preset's methods: FedIT's (default), FedMKT's comparison (fedmkt, LLM2SLM "
        "as fedmkt@llm_frozen=true, zero-shot, standalone-small, centralized, fedavg-small; "
        "the LLM and every tenant's small model scored); fedmkt-hetero: the same with each "
        "tenant's own small model of another architecture and tokenizer (pretrained by "
        "`bench pretrain`), without FedAvg, which is undefined across different models; dp: utility and memorization "
        "against epsilon (FedAvg, DP-FedAvg at several fedavg@dp.noise_multiplier=Z)",
    )
    p.add_argument(
        "--algorithms",
        type=_names,
        help="comma-separated methods: registered algorithms, or variants "
        "ALGORITHM@FIELD=VALUE[@FIELD=VALUE...] (e.g. fewfedpit@beta=0) that run the "
        "algorithm with those settings under that label",
    )
    p.add_argument(
        "--baselines",
        type=_names,
        help="comma-separated: zero-shot,standalone,centralized, and on the small model "
        "fedavg-small,standalone-small (empty: none)",
    )
    p.add_argument("--seeds", type=_ints, help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--rounds", type=int, help="federated rounds")
    p.add_argument("--local-steps", type=int, help="client optimizer steps per round")
    p.add_argument("--lr", type=float, help="client learning rate")
    p.add_argument("--optimizer", choices=["adamw", "sgd"], help="client optimizer")
    p.add_argument("--model", help="base model of the workspace (large or small)")
    p.add_argument("--eval-every", type=int, help="score the global model every N rounds")
    p.add_argument(
        "--clients-per-round", type=int, help="tenants sampled per round (default: all)"
    )
    p.add_argument(
        "--audit-records",
        type=int,
        metavar="N",
        help="memorization audit of each run's final model on N of the tenants' records "
        "(leakage column; 0: none; the fewshot split's default: 100)",
    )
    p.add_argument(
        "--lora-targets",
        type=_names,
        help="comma-separated LoRA target modules, or 'default' for the architecture's "
        "(default: every linear layer of a Llama)",
    )
    p.add_argument(
        "--param",
        action="append",
        metavar="ALGO.FIELD=VALUE",
        help="algorithm setting, e.g. fedprox.mu=0.1, for every variant of the algorithm "
        "(repeatable)",
    )
    p.set_defaults(handler=_bench_quality)


# -- system -------------------------------------------------------------------------------------
def _steps_subset(spec: Any, args: argparse.Namespace) -> Any:
    """``--steps-kinds`` / ``--steps-precisions`` / ``--steps-devices``: a subset of the
    steps-memory cells."""
    from fedtune.benchmarks.step_memory import KINDS

    changes: dict[str, Any] = {}
    devices: tuple[str, ...] | None = None
    for option, field, known in (("steps_kinds", "kinds", KINDS),
                                 ("steps_precisions", "precisions", ("fp32", "bf16")),
                                 ("steps_devices", None, ("cpu", "cuda"))):
        raw = getattr(args, option)
        if raw is None:
            continue
        names = _names(raw)
        if not names or set(names) - set(known):
            raise ConfigError(
                f"unknown --{option.replace('_', '-')} {raw!r}",
                fix=f"Use some of: {','.join(known)} (comma-separated).",
            )
        picked = tuple(k for k in known if k in names)
        if field is None:
            devices = picked
        else:
            changes[field] = picked
    if devices is not None:
        if devices == ("cuda",) and not _cuda_available():
            raise ConfigError(
                "--steps-devices cuda asks for the GPU rows only, but CUDA reports no device",
                fix="Run it on a machine with a GPU, or add cpu (--steps-devices cpu,cuda).",
            )
        changes.update(cpu="cpu" in devices, gpu="cuda" in devices)
    if args.steps_variants is not None:
        from fedtune.benchmarks.step_memory import VARIANTS

        names = _names(args.steps_variants)
        if not names or set(names) - set(VARIANTS):
            raise ConfigError(
                f"unknown --steps-variants {args.steps_variants!r}",
                fix=f"Use some of: {','.join(VARIANTS)} (comma-separated).",
            )
        changes["speed_variants"] = tuple(dict.fromkeys(names))  # in the order asked
    changes.update(_steps_settings(spec.steps_memory, args.steps_set))
    if not changes:
        return spec
    return dataclasses.replace(
        spec, steps_memory=dataclasses.replace(spec.steps_memory, **changes)
    )


# The steps-memory sizes --steps-set may change (the GPU script's budget rows).
_STEPS_SETTABLE = ("speed_batch_size", "speed_seq_len", "speed_steps", "speed_reps",
                   "speed_compiled_bare", "speed_budget_s", "memory_cells", "timeout_s")


def _steps_settings(spec: Any, items: list[str] | None) -> dict[str, Any]:
    """``--steps-set FIELD=VALUE`` options, each of the field's type (YAML scalars)."""
    changes: dict[str, Any] = {}
    for item in items or []:
        field, sep, raw = item.partition("=")
        value: Any = yaml.safe_load(raw) if sep else None
        default = getattr(spec, field, None) if field in _STEPS_SETTABLE else None
        kind = type(default)
        if kind is bool:
            fits = isinstance(value, bool)
        else:  # a positive number of the field's type (an int where a float is asked)
            number = isinstance(value, (int, float) if kind is float else kind)
            fits = number and not isinstance(value, bool) and value > 0
        if default is None or not fits:
            raise ConfigError(
                f"--steps-set {item!r} is not FIELD=VALUE with a known field and a value of "
                "its type",
                fix=f"Write e.g. --steps-set speed_steps=10; fields: {', '.join(_STEPS_SETTABLE)} "
                "(positive numbers; true/false for speed_compiled_bare and memory_cells).",
            )
        changes[field] = value
    return changes


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _bench_system(args: argparse.Namespace) -> int:
    from fedtune.benchmarks.presets import get_preset
    from fedtune.benchmarks.provenance import source_commit
    from fedtune.benchmarks.report import system_markdown
    from fedtune.benchmarks.system import run_system

    spec = get_preset(args.preset, smoke_test=args.smoke).system
    changes: dict[str, Any] = {}
    for option in ("algorithms", "reps", "steps", "model", "batch_size"):
        value = getattr(args, option)
        if value is not None:
            changes[option] = value
    if args.no_deepspeed:
        changes["deepspeed"] = False
    params = _params(args.param)
    if params:
        changes["algorithm_params"] = params
    spec = dataclasses.replace(spec, **changes)
    if args.steps_shape is not None:
        from fedtune.benchmarks.step_memory import SHAPES

        if args.steps_shape not in SHAPES:
            raise ConfigError(
                f"unknown --steps-shape {args.steps_shape!r}",
                fix=f"Use one of: {', '.join(SHAPES)}.",
            )
        spec = dataclasses.replace(
            spec, steps_memory=dataclasses.replace(spec.steps_memory, shape=args.steps_shape)
        )
    spec = _steps_subset(spec, args)
    parts = _names(args.parts)
    known = ("client", "engine", "bytes", "memory", "steps-memory", "peer", "secagg")
    unknown = sorted(set(parts) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown system benchmark part(s) {unknown}",
            fix=f"Use some of: {', '.join(known)}.",
        )
    workspace = _workspace(args)
    commit = source_commit()  # before the run: the code that runs is the code checked out now
    results = run_system(workspace, spec, log=out.print, parts=parts)
    results["commit"] = commit
    out_dir = workspace.system_dir
    _write_json(out_dir / "results.json", results)
    markdown = system_markdown(results)
    (out_dir / "results.md").write_text(markdown, encoding="utf-8")
    out.print(markdown)
    out.print(f"results: {out_dir / 'results.json'}, {out_dir / 'results.md'}")
    _record(results, args.record)
    return 0


def _record(results: dict[str, Any], path: str | None) -> None:
    """``--record``: the results into ``path`` (docs/results), the docs generated from it."""
    if not path:
        return
    from fedtune.benchmarks.report import record

    rewritten = record(results, Path(path))
    out.print(f"recorded: {path}; regenerated: {', '.join(map(str, rewritten)) or 'nothing'}")


def _add_record(p: argparse.ArgumentParser, example: str) -> None:
    p.add_argument(
        "--record",
        metavar="JSON",
        help=f"also write the results to JSON (e.g. {example}) and regenerate the tables of "
        "the docs generated from it (a new file needs its block in the page first: "
        "<!-- generated: KIND docs/results/NAME.json --> ... <!-- end generated -->)",
    )


def _add_system(kinds: Any) -> None:
    p = kinds.add_parser(
        "system",
        help="client step vs bare PyTorch+PEFT, engine overhead, bytes, server memory",
        description="Measure, side by side in one run, the engine's client step against a "
        "bare PyTorch + PEFT loop (interleaved repetitions, medians), the engine's overhead, "
        "bytes per round per algorithm against raw tensor bytes, and the server step's peak "
        "memory with and without DeepSpeed ZeRO-3, and (part steps-memory) peak memory per step "
        "kind of a 1B-class model; write DIR/system/results.json and results.md.",
    )
    _common(p)
    p.add_argument("--algorithms", type=_names, help="algorithms of the bytes table")
    p.add_argument("--reps", type=int, help="interleaved repetitions of the client-step pair")
    p.add_argument("--steps", type=int, help="training steps per client step")
    p.add_argument("--batch-size", type=int, help="examples per step")
    p.add_argument("--model", help="base model of the workspace (large or small)")
    p.add_argument(
        "--parts",
        default="client,engine,bytes,memory",
        help="what to measure: client, engine, bytes, memory, peer (whole jobs, a small and "
        "a 5-round one, against a bare sequential PyTorch+PEFT loop, fedtune with 1 and 2 "
        "workers; minutes), secagg (bytes and time of a secure-aggregation round vs plain, "
        "3-40 tenants), and steps-memory (peak memory and tokens/s per step kind of a "
        "1B-class Llama, fp32 vs bf16, with and without gradient checkpointing, one fresh "
        "process per cell; on CUDA also the client step's MFU vs a bare PEFT loop; about an "
        "hour on one CPU thread at the 1b shape)",
    )
    p.add_argument(
        "--steps-shape",
        metavar="SHAPE",
        help="model shape of the steps-memory part: 1b (the default), 7b (Llama-2-7B's; a "
        "GPU's), 170m (the same family, for a busy CPU), tiny (tests)",
    )
    p.add_argument(
        "--steps-devices",
        metavar="DEVICES",
        help="devices of the steps-memory part: cpu, cuda or cpu,cuda (the default: the CPU, "
        "and CUDA where present); cuda alone measures only the GPU rows (minutes on a GPU, "
        "where the 1b CPU cells take an hour)",
    )
    p.add_argument(
        "--steps-kinds",
        metavar="KINDS",
        help="step kinds of the steps-memory part (default all): client, provider, generate, eval",
    )
    p.add_argument(
        "--steps-precisions",
        metavar="PRECISIONS",
        help="precisions of the steps-memory part (default both): fp32, bf16",
    )
    p.add_argument(
        "--steps-variants",
        metavar="VARIANTS",
        help="client-speed variants of the steps-memory part (default plain): plain, compile "
        "(training.compile), liger (training.kernels: liger), compile+liger; each in a fresh "
        "process against the bare eager PEFT loop; one the machine cannot run is recorded as "
        "skipped with the reason",
    )
    p.add_argument(
        "--steps-set",
        action="append",
        metavar="FIELD=VALUE",
        help="a steps-memory size (repeatable): speed_batch_size, speed_seq_len, speed_steps, "
        "speed_reps, timeout_s (per fresh process), speed_budget_s (seconds for all variants; "
        "those left when it is spent are recorded as skipped), speed_compiled_bare (true/false: the "
        "torch.compile'd bare reference), memory_cells (false: only the client speed, on "
        "every device asked for)",
    )
    p.add_argument("--no-deepspeed", action="store_true", help="skip the ZeRO-3 memory rows")
    _add_record(p, "docs/results/peer-system.json")
    p.add_argument(
        "--param",
        action="append",
        metavar="ALGO.FIELD=VALUE",
        help="algorithm setting (repeatable)",
    )
    p.set_defaults(handler=_bench_system)


# -- token-mapping ------------------------------------------------------------------------------
def _bench_token_mapping(args: argparse.Namespace) -> int:
    from fedtune.benchmarks.provenance import provenance
    from fedtune.benchmarks.system import device_info
    from fedtune.benchmarks.token_mapping import run_token_mapping, token_mapping_markdown

    results = run_token_mapping(log=out.print)
    results["device"] = device_info()
    results["provenance"] = provenance("fedtune bench token-mapping")
    results["commit"] = results["provenance"]["measured_at_commit"]
    out.print(token_mapping_markdown(results))
    if args.json:
        _write_json(Path(args.json), results)
    _record(results, args.record)
    return 0


def _add_token_mapping(kinds: Any) -> None:
    p = kinds.add_parser(
        "token-mapping",
        help="FedMKT's vocabulary mapping and token alignment across four tokenizer families",
        description="Map and align every ordered pair of MiniLM's WordPiece, a byte-level "
        "BPE, a SentencePiece-style BPE and the builtin tokenizer: identity on self-mapping, "
        "word tokens mapped onto byte fragments or special tokens, exact matches kept on "
        "fixed sentences, mapping and alignment time (seconds, one CPU).",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    _add_record(p, "docs/results/fedmkt-token-mapping.json")
    p.set_defaults(handler=_bench_token_mapping)


BENCH_KINDS: tuple[Callable[[Any], None], ...] = (
    _add_engine,
    _add_pretrain,
    _add_quality,
    _add_system,
    _add_token_mapping,
)


def register_bench(sub: Any) -> None:
    """Add ``fedtune bench`` and every kind of :data:`BENCH_KINDS` to the CLI."""
    p = sub.add_parser("bench", help="benchmarks that print measured ratios")
    kinds = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for add_kind in BENCH_KINDS:
        add_kind(kinds)
