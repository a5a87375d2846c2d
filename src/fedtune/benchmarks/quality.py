"""``fedtune bench quality``: algorithms against their papers' baselines on the task suite.

Every method runs as a real job through the in-process engine (the same steps a cluster
runs), from the workspace's pretrained base model, once per seed. After a run the global
model of every evaluated round is read back from the exchange store and scored on the
suite's test set (greedy exact match per category, held-out loss). The seed changes the
LoRA initialisation, batch order and client sampling; the suite itself stays fixed.

Methods are registered algorithm names (so FedBiOT, FedOT, Offsite-tuning ... join by name
once registered) and the baselines of the papers:

- ``zero-shot``: the base model, untrained (FedMKT's Zero-Shot);
- ``standalone``: each tenant alone, FedAvg with one client (no one else's data), the same
  local steps per round; its scores are the tenants' mean (FedMKT's Standalone, the
  "local-only" training FedIT compares against);
- ``centralized``: all tenants' data pooled as one tenant, with as many steps per round as
  the whole federation takes (FedMKT's Centralized, the usual upper bound). Single-client
  algorithms (Offsite-tuning) run on the same pooled data;
- ``fedavg-small``: FedAvg on the workspace's ``small`` model (FedPT's "FedAvg (760M)";
  FedMKT's FedAvg of the tenants' homogeneous small models);
- ``standalone-small``: each tenant's ``small`` model trained alone (FedMKT's Standalone SLMs).

FedMKT (and its variants, e.g. ``fedmkt@llm_frozen=true``, the paper's LLM2SLM) runs the
benchmark's model as the provider's LLM and the workspace's ``small`` model as every tenant's
own small model. Its rows score each model on the suite's test set: ``llm/em`` (the LLM, also
``em``), ``slm/em/<tenant>`` (each tenant's final small model), ``slm/em`` and
``slm/local_em`` (their means; local: each on its own tenant's task mix) and
``slm/category_em/<category>`` (their mean per test category). With FedMKT among the
methods every row names the model it scored: ``llm/em`` for methods on the benchmark's model,
``slm/*`` for those on the small model (Zero-Shot gets both).

FedPT and FedAvg+PT federate the ``small`` model with the benchmark's model (``large`` by
default) as the provider's large model; their ``em`` is the proxy-tuned large model's (Eq. 3,
what the paper reports), and ``small/em``, ``small/test_loss`` score the federated small
model alone. FedAvg on the ``large`` model is the paper's "directly fine-tuning the large LM".

Per round it records ``em`` (mean of per-category exact match on the balanced test set),
``em/<category>``, ``local_em`` (each tenant's own task mix, averaged over tenants),
``test_loss`` and the clients' ``train_loss``.

Methods are labels (:mod:`fedtune.benchmarks.methods`): ``fewfedpit@beta=0`` runs FewFedPIT
with beta 0 under that name, beside other settings of the same algorithm. ``split:
fewshot`` runs on FewFedPIT's few-shot split of the suite
(:mod:`fedtune.benchmarks.fewshot_split`) instead of the suite's tenants, usually with
``clients_per_round`` sampled of them. With ``audit_records`` > 0 the final global model of
every run is also audited for discoverable memorization (:mod:`fedtune.benchmarks.leakage`):
``leakage`` is the mean Rouge-L of its greedy answers to training prompts of the tenants'
records (lower leaks less).
"""

from __future__ import annotations

import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from fedtune.algorithms.registry import algorithm_names
from fedtune.benchmarks.claims import evaluate_claims
from fedtune.benchmarks.fewshot_split import FewShotSpec, ensure_fewshot_split
from fedtune.benchmarks.jobs import ALL_LINEAR, bench_job
from fedtune.benchmarks.leakage import LeakageAudit
from fedtune.benchmarks.methods import Method, check_settings, parse_method
from fedtune.benchmarks.provenance import source_commit
from fedtune.benchmarks.scoring import EvalSet, evaluate_model, local_score
from fedtune.benchmarks.selection import select_tuned
from fedtune.benchmarks.suite import (
    category_shares,
    constant_answer_em,
    load_manifest,
    read_set,
    recorded_constant_answers,
    recorded_public_categories,
)
from fedtune.benchmarks.synthesis_steps import synthesis_steps
from fedtune.benchmarks.tenant_public import ensure_tenant_public_set
from fedtune.benchmarks.workspace import Workspace
from fedtune.config.job import JobConfig
from fedtune.core.errors import ConfigError
from fedtune.core.messages import ClientState, ServerState
from fedtune.engines import layout, steps
from fedtune.engines.local import RunOptions, run_job
from fedtune.models.loading import load_pretrained
from fedtune.tracking.base import NullTracker

__all__ = ["BASELINES", "FEDIT", "SPLITS", "QualitySpec", "merge_results", "run_quality", "summarize"]

logger = logging.getLogger(__name__)

Log = Callable[[str], None]
Metrics = dict[str, float]

FEDIT: Final[tuple[str, ...]] = (
    "fedavg",
    "fedprox",
    "scaffold",
    "fedadam",
    "fedyogi",
    "fedadagrad",
)
BASELINES: Final[tuple[str, ...]] = ("zero-shot", "standalone", "centralized")
# Run only when asked (FedPT's comparison): FedAvg on the workspace's small model.
EXTRA_BASELINES: Final[tuple[str, ...]] = ("fedavg-small", "standalone-small")
# Algorithms whose tenants each train their own small model (the workspace's ``small``).
TENANT_MODELS: Final[frozenset[str]] = frozenset({"fedmkt"})
# Algorithms that federate the small model and proxy-tune the benchmark's model with it.
PROXY_TUNED: Final[frozenset[str]] = frozenset({"fedpt", "fedavg-pt"})
SMALL_MODEL: Final = "small"
# Which exported model is scored when an algorithm exports several (FedBiOT's AdapFu is the
# provider's full model with the tenants' adapter, the one the papers report).
PRIMARY_ARTIFACTS: Final[tuple[str, ...]] = ("model", "adapfu")
# Other exported models scored on the test set at the final round, as ``<name>/em`` and
# ``<name>/test_loss`` (FedBiOT's AdapEmu: the tenants' emulator with their adapter).
SECONDARY_ARTIFACTS: Final[tuple[str, ...]] = ("adapemu",)
# Algorithms that are single-client by definition (Offsite-tuning: one data owner) run on the
# pooled data with the federation's steps per round, like Centralized.
POOLED_DATA: Final[frozenset[str]] = frozenset({"offsite-tuning"})
# The tenants' data: the suite's own tenants, or FewFedPIT's few-shot split of its pool.
SPLITS: Final[tuple[str, ...]] = ("suite", "fewshot")


@dataclass(frozen=True)
class QualitySpec:
    """Which methods run, how long, and with what training settings."""

    algorithms: tuple[str, ...] = FEDIT
    baselines: tuple[str, ...] = BASELINES
    seeds: tuple[int, ...] = (0, 1, 2)
    model: str = "large"
    rounds: int = 8
    local_steps: int = 10
    batch_size: int = 8
    lr: float = 1e-3  # 3e-3 made the pooled data forget arithmetic (measured)
    optimizer: str = "adamw"
    lora_r: int = 16
    lora_alpha: float = 32.0
    lora_targets: tuple[str, ...] | None = ALL_LINEAR
    max_seq_len: int = 160
    eval_every: int = 2
    eval_batch_size: int = 50
    algorithm_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    split: str = "suite"
    fewshot: FewShotSpec = field(default_factory=FewShotSpec)
    clients_per_round: int | None = None  # None: every tenant every round
    audit_records: int = 0  # records of the memorization audit per run (0: no audit)
    # The differential_privacy section of methods with dp.* settings (they override it).
    privacy: Mapping[str, Any] = field(default_factory=dict)
    # Each tenant's own small model by workspace model name (FedMKT's heterogeneous
    # comparison); empty: every tenant the ``small`` model.
    tenant_models: Mapping[str, str] = field(default_factory=dict)
    # Also score each run's final model on the suite's validation set (val/em, val/loss).
    validation: bool = False
    # Tuned methods: name -> the labels of its grid; the label whose mean final val/em over
    # the seeds is highest (ties: lower val/loss) is reported under the name, on test.
    select: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # 0: the jobs read the suite's public set; N: N records drawn from the tenants'
    # distribution instead (FedMKT's public data, benchmarks.tenant_public).
    tenant_public_records: int = 0

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form."""
        data = asdict(self)
        data["algorithm_params"] = {k: dict(v) for k, v in self.algorithm_params.items()}
        data["privacy"] = dict(self.privacy)
        data["tenant_models"] = dict(self.tenant_models)
        data["select"] = {k: list(v) for k, v in self.select.items()}
        return data

    def eval_rounds(self) -> list[int]:
        """Rounds whose global model is scored: 0, every ``eval_every``-th, and the last."""
        chosen = set(range(0, self.rounds + 1, self.eval_every)) | {self.rounds}
        return sorted(chosen)


def _methods(spec: QualitySpec) -> list[Method]:
    """The methods of ``spec.algorithms``, their settings validated.

    Raises:
        ConfigError: On a malformed label, a label given twice, or invalid settings.
    """
    methods = [parse_method(label) for label in spec.algorithms]
    twice = sorted({m.label for m in methods if spec.algorithms.count(m.label) > 1})
    if twice:
        raise ConfigError(
            f"method(s) {twice} listed more than once", fix="List each method label once."
        )
    registered = algorithm_names()
    for method in methods:
        if method.algorithm in registered:
            check_settings(method, spec.algorithm_params.get(method.algorithm, {}))
        if method.privacy:
            _check_privacy(method, spec)
    return methods


def _check_privacy(method: Method, spec: QualitySpec) -> None:
    """Validate a DP method's differential_privacy section before any run starts."""
    from pydantic import ValidationError

    from fedtune.config.loading import format_validation_errors
    from fedtune.config.privacy import DifferentialPrivacyConfig

    try:
        DifferentialPrivacyConfig.model_validate(_privacy(method, spec))
    except ValidationError as exc:
        raise ConfigError(
            f"method {method.label!r}: invalid differential_privacy settings "
            f"{_privacy(method, spec)}: " + "; ".join(format_validation_errors(exc)),
            fix="Correct the dp.* settings of the label (see fedtune.config.privacy).",
        ) from None


def _privacy(method: Method, spec: QualitySpec) -> dict[str, Any] | None:
    """The job's differential_privacy section for ``method`` (None: no DP)."""
    return {**spec.privacy, **method.privacy} if method.privacy else None


def _averaging_small(spec: QualitySpec) -> list[str]:
    """The methods that average the tenants' small models (FedAvg's parameter mean)."""
    found = [b for b in spec.baselines if b == "fedavg-small"]
    for label in spec.algorithms:
        method = parse_method(label)
        settings = {**spec.algorithm_params.get(method.algorithm, {}), **method.params}
        if method.algorithm in TENANT_MODELS and settings.get("fedavg_small"):
            found.append(label)
    return found


def _check(spec: QualitySpec) -> None:
    registered = algorithm_names()
    problems = []
    algorithms = [m.algorithm for m in _methods(spec)]
    unknown = [a for a in algorithms if a not in registered]
    if unknown:
        problems.append(f"unknown algorithm(s) {unknown}; registered: {registered}")
    known = [*BASELINES, *EXTRA_BASELINES]
    unknown_baselines = [b for b in spec.baselines if b not in known]
    if unknown_baselines:
        problems.append(f"unknown baseline(s) {unknown_baselines}; known: {known}")
    if not spec.algorithms and not spec.baselines:
        problems.append("no algorithm and no baseline to run")
    if not spec.seeds:
        problems.append("no seed given")
    if spec.rounds < 1 or spec.eval_every < 1:
        problems.append(f"rounds={spec.rounds} and eval_every={spec.eval_every} must be >= 1")
    stray = sorted(set(spec.algorithm_params) - set(algorithms))
    if stray:
        problems.append(f"parameters given for algorithm(s) {stray} that do not run")
    if spec.split not in SPLITS:
        problems.append(f"unknown split {spec.split!r}; known: {list(SPLITS)}")
    if spec.clients_per_round is not None and spec.clients_per_round < 1:
        problems.append(f"clients_per_round={spec.clients_per_round} must be >= 1")
    if spec.tenant_public_records < 0:
        problems.append(f"tenant_public_records={spec.tenant_public_records} must be >= 0")
    for name, grid in spec.select.items():
        stray_grid = [label for label in grid if label not in spec.algorithms]
        if stray_grid or not grid:
            problems.append(f"select {name!r}: grid labels {stray_grid or '(none)'} are not methods that run")
        if name in spec.algorithms or name in spec.baselines:
            problems.append(f"select {name!r}: the name of a tuned method must not be a method label")
    if spec.select and not spec.validation:
        problems.append("select needs validation: true (selection is on the validation split)")
    if spec.audit_records < 0:
        problems.append(f"audit_records={spec.audit_records} must be >= 0 (0: no audit)")
    averaged = _averaging_small(spec) if spec.tenant_models else []
    if averaged:
        problems.append(
            f"method(s) {averaged} average the tenants' small models, which is undefined when "
            "each tenant has its own model of another architecture or tokenizer (tenant_models)"
        )
    if problems:
        raise ConfigError(
            "invalid quality benchmark: " + "; ".join(problems),
            fix="Pick methods from `fedtune algorithms` and the baselines "
            f"{', '.join(known)}; set --param only for algorithms that run.",
        )


class _Bench:
    """One quality benchmark in progress: the workspace, the test set and the base model."""

    def __init__(self, workspace: Workspace, spec: QualitySpec, log: Log) -> None:
        self.workspace = workspace
        self.spec = spec
        self.log = log
        # FewFedPIT's synthesis counts per client step of the last run (synthesis_steps).
        self.synthesis: list[dict[str, Any]] = []
        self.manifest = load_manifest(workspace.suite_dir)
        self.model_dir = workspace.require_model(spec.model)
        # Where the tenants' files (and the Centralized pool) are, and what they hold.
        self.data_dir = workspace.suite_dir
        self.split_manifest = self.manifest
        if spec.split == "fewshot":
            self.data_dir, self.split_manifest = ensure_fewshot_split(
                workspace.suite_dir, spec.fewshot
            )
        # The public set the jobs read, and what it holds (recorded with the results).
        self.public_path = workspace.suite_dir / "public.jsonl"
        self.public: dict[str, Any] = dict(self.manifest["public"])
        if spec.tenant_public_records:
            self.public_path, drawn = ensure_tenant_public_set(
                workspace.suite_dir, spec.tenant_public_records
            )
            self.public = {**drawn["public"], "drawn_from": "tenant_mixture"}
        self.tenants = sorted(self.split_manifest["tenants"])
        unknown = sorted(set(spec.tenant_models) - set(self.tenants))
        if unknown:
            raise ConfigError(
                f"tenant_models names tenant(s) {unknown} that the {spec.split!r} split does "
                f"not have (its tenants: {self.tenants})",
                fix="Name the split's tenants in the preset's tenant_models.",
            )
        self.participants = self._participants()
        self.shares = {t: category_shares(self.split_manifest, t) for t in self.tenants}
        base, tokenizer = load_pretrained(str(self.model_dir))
        self.test_records = read_set(workspace.suite_dir, "test")
        self.eval_set = EvalSet(
            self.test_records,
            tokenizer,
            max_seq_len=spec.max_seq_len,
            batch_size=spec.eval_batch_size,
        )
        self.val_set = None
        if spec.validation:
            if "validation.jsonl" not in self.manifest["files"]:
                raise ConfigError(
                    f"the suite in {str(workspace.suite_dir)!r} has no validation split",
                    fix=f"Rebuild it with `fedtune bench pretrain --out {workspace.root}` "
                    "(the same --preset; pretrained models are kept).",
                )
            self.val_set = EvalSet(
                read_set(workspace.suite_dir, "validation"),
                tokenizer,
                max_seq_len=spec.max_seq_len,
                batch_size=spec.eval_batch_size,
            )
        self.audit = (
            LeakageAudit(
                read_set(self.data_dir, "central"), tokenizer, max_records=spec.audit_records
            )
            if spec.audit_records
            else None
        )
        self.zero_shot = evaluate_model(base, self.eval_set)
        self.zero_shot["local_em"] = self.local_em(self.zero_shot)
        if self.audit is not None:
            self.zero_shot.update(self.audit(base, tokenizer))
        self._zero_shots: dict[Path, Metrics] = {}
        # Rows name the model they score (LLM or SLM) when FedMKT is compared.
        self.per_model = any(parse_method(a).algorithm in TENANT_MODELS for a in spec.algorithms)
        self._eval_sets: dict[str, EvalSet] = {}

    def _participants(self) -> int:
        """Tenants training per round (what Centralized's steps per round are matched to)."""
        per_round = self.spec.clients_per_round
        if per_round is not None and per_round > len(self.tenants):
            raise ConfigError(
                f"clients_per_round={per_round} exceeds the {len(self.tenants)} tenants of "
                f"the {self.spec.split!r} split",
                fix=f"Use --clients-per-round {len(self.tenants)} or fewer.",
            )
        return per_round or len(self.tenants)

    @property
    def small_dir(self) -> Path:
        return self.workspace.require_model(SMALL_MODEL)

    def slm_dir(self, tenant: str) -> Path:
        """The tenant's own small model: ``tenant_models[tenant]``, else the ``small`` one."""
        return self.workspace.require_model(self.spec.tenant_models.get(tenant, SMALL_MODEL))

    def slm_dirs(self) -> set[Path]:
        """Every tenant's small model folder (resolved)."""
        return {self.small_dir.resolve(), *(self.slm_dir(t).resolve() for t in self.tenants)}

    def small_zero_shot(self, model_dir: Path | None = None) -> Metrics:
        """An untrained small model's scores (round 0 of the small-model methods); default:
        the ``small`` model."""
        key = (model_dir or self.small_dir).resolve()
        if key not in self._zero_shots:
            base, tokenizer = load_pretrained(str(key))
            scores = evaluate_model(base, self.eval_set_for(tokenizer), tokenizer)
            scores["local_em"] = self.local_em(scores)
            self._zero_shots[key] = scores
        return dict(self._zero_shots[key])

    def local_em(self, metrics: Metrics) -> float:
        """The global model's EM on each tenant's own task mix, averaged over tenants."""
        return statistics.fmean(local_score(metrics, self.shares[t]) for t in self.tenants)

    # -- jobs ---------------------------------------------------------------------------
    def job(
        self,
        *,
        name: str,
        algorithm: str,
        tenants: Sequence[str],
        seed: int,
        workdir: Path,
        local_steps: int,
        model_dir: Path | None = None,
        variant: Mapping[str, Any] | None = None,
        privacy: Mapping[str, Any] | None = None,
    ) -> JobConfig:
        tenant_model = (
            {t: self.slm_dir(t) for t in tenants} if algorithm in TENANT_MODELS else None
        )
        overrides: dict[str, Any] | None = dict(variant) if variant else None
        if algorithm in PROXY_TUNED:
            # Tenants federate the small model; the benchmark's model is the large black box.
            overrides = (overrides or {}) | {
                "large_model": {"source": "pretrained", "uri": str(self.model_dir.resolve())}
            }
            if "eval_every" not in {**self.spec.algorithm_params.get(algorithm, {}), **overrides}:
                # The benchmark scores every evaluated round itself; skip the provider's own
                # per-round generation metrics (they decode with three models).
                overrides["eval_every"] = self.spec.rounds + 1
            model_dir = self.small_dir
        return bench_job(
            self.spec,
            name=name,
            algorithm=algorithm,
            model_dir=model_dir or self.model_dir,
            suite_dir=self.workspace.suite_dir,
            tenants=tenants,
            workdir=workdir,
            seed=seed,
            rounds=self.spec.rounds,
            local_steps=local_steps,
            algorithm_overrides=overrides,
            data_dir=self.data_dir,
            # One pooled tenant trains every round.
            clients_per_round=self.spec.clients_per_round if len(tenants) > 1 else None,
            tenant_model_dir=tenant_model,
            differential_privacy=privacy,
            public_path=self.public_path,
        )

    def run(self, job: JobConfig) -> list[Metrics]:
        """Run ``job``; score the global model of every evaluated round."""
        summary = run_job(job, NullTracker(), RunOptions(progress=False))
        train_loss = {r["round"]: r["train_loss"] for r in summary["rounds"]}
        env = steps.ProviderEnv.create(job)
        store = env.store()
        rows = []
        final = self.spec.eval_rounds()[-1]
        for round_index in self.spec.eval_rounds():
            state = ServerState.load(store, layout.state_key(round_index))
            metrics = self.score_state(env, state, job.workdir, round_index)
            if round_index == final:
                metrics.update(self.score_secondary(env, state, job.workdir, round_index))
                if self.val_set is not None:
                    metrics.update(self.score_validation(env, state, job.workdir, round_index))
            metrics["round"] = float(round_index)
            if train_loss.get(round_index) is not None:
                metrics["train_loss"] = float(train_loss[round_index])
            rows.append(metrics)
        rows[-1].update(_client_totals(summary["rounds"]))
        self.synthesis = synthesis_steps(summary["rounds"])
        if "privacy" in summary:  # epsilon at delta after the last round
            rows[-1]["dp/epsilon"] = float(summary["privacy"]["epsilon"])
        if job.algorithm.name in TENANT_MODELS:
            rows[-1].update(self.score_tenant_models(job))
        if self.per_model:
            on_small = Path(str(getattr(job.model, "uri", ""))).resolve() in self.slm_dirs()
            for row in rows:
                row.update(_as_model(row, "slm" if on_small else "llm", [t.name for t in job.tenants]))
        if self.audit is not None:
            # The final global model, prompted with the tenants' training prompts.
            rows[-1].update(self.audit(*self.model_of(env, state, job.workdir, round_index)))
        return rows

    def eval_set_for(self, tokenizer: Any) -> EvalSet:
        """The test set encoded with ``tokenizer`` (one per distinct vocabulary)."""
        from fedtune.algorithms.fedmkt.vocab import content_hash

        key = content_hash(tokenizer)
        if key not in self._eval_sets:
            self._eval_sets[key] = EvalSet(
                self.test_records, tokenizer,
                max_seq_len=self.spec.max_seq_len, batch_size=self.spec.eval_batch_size,
            )
        return self._eval_sets[key]

    def score_tenant_models(self, job: JobConfig) -> Metrics:
        """Each tenant's final small model (its kept state, the last round finished) on the test set:
        ``slm/em/<tenant>``, and over tenants ``slm/em``, ``slm/local_em``, ``slm/test_loss``."""
        per_tenant: dict[str, Metrics] = {}
        for tenant in (t.name for t in job.tenants):
            env = steps.TenantEnv.create(job, tenant)
            state = ClientState.load(env.own, layout.final_client_state_key(job.rounds))
            adapter = {k.removeprefix("adapter/"): v for k, v in state.tensors.items() if k.startswith("adapter/")}
            tokenizer = env.ctx.tokenizer()
            per_tenant[tenant] = evaluate_model(env.ctx.peft_model(adapter), self.eval_set_for(tokenizer), tokenizer)
        return _tenant_means(per_tenant, self.shares)

    def score_secondary(
        self, env: steps.ProviderEnv, state: ServerState, workdir: str, round_index: int
    ) -> Metrics:
        """Scores of the exported models of :data:`SECONDARY_ARTIFACTS` (none for LoRA-family
        and proxy-tuned algorithms, which export one model)."""
        from fedtune.algorithms.fedavg import LoraFedAlgorithm
        from fedtune.algorithms.fedpt import FedPT

        if isinstance(env.algorithm, LoraFedAlgorithm | FedPT):
            return {}
        out = Path(workdir) / "bench-export" / f"secondary-{round_index}"
        artifacts = env.algorithm.export(env.ctx, state, out)
        metrics: Metrics = {}
        for name in SECONDARY_ARTIFACTS:
            if name in artifacts:
                model, tokenizer = load_pretrained(str(artifacts[name].path))
                scores = evaluate_model(model, self.eval_set, tokenizer)
                metrics[f"{name}/em"] = scores["em"]
                metrics[f"{name}/test_loss"] = scores["test_loss"]
        return metrics

    def model_of(
        self, env: steps.ProviderEnv, state: ServerState, workdir: str, round_index: int
    ) -> tuple[Any, Any]:
        """The model a server state stands for, as the benchmark scores it, and its tokenizer."""
        from fedtune.algorithms.fedavg import LoraFedAlgorithm
        from fedtune.algorithms.fedpt import FedPT
        from fedtune.algorithms.fedpt.proxy import ProxyTunedLM

        algorithm = env.algorithm
        if isinstance(algorithm, FedPT):
            small = env.ctx.peft_model(state.group("adapter"))
            large = algorithm.large(env.ctx).local_model
            pre = algorithm.small_pre(env.ctx).model
            # The benchmark's large model is always local (never the http source).
            return ProxyTunedLM(large, pre, small, algorithm.config.alpha), env.ctx.tokenizer()  # type: ignore[arg-type]
        if isinstance(algorithm, LoraFedAlgorithm):
            return env.ctx.peft_model(state.group("adapter")), env.ctx.tokenizer()
        # Any other algorithm: what it exports (as a user would get it).
        out = Path(workdir) / "bench-export" / f"round-{round_index}"
        artifacts = algorithm.export(env.ctx, state, out)
        registered = [n for n, a in artifacts.items() if a.register] or list(artifacts)
        chosen = next((n for n in PRIMARY_ARTIFACTS if n in artifacts), registered[0])
        return load_pretrained(str(artifacts[chosen].path))

    def score_state(
        self, env: steps.ProviderEnv, state: ServerState, workdir: str, round_index: int
    ) -> Metrics:
        """Exact match and loss of the model a server state stands for."""
        from fedtune.algorithms.fedavg import LoraFedAlgorithm
        from fedtune.algorithms.fedpt import FedPT

        uri = getattr(env.ctx.model_config, "uri", None)
        small_dirs = {self.workspace.model_dir(SMALL_MODEL).resolve()}
        if self.spec.tenant_models:
            small_dirs = self.slm_dirs()
        on_small = uri is not None and Path(uri).resolve() in small_dirs
        if isinstance(env.algorithm, FedPT):
            return self.score_proxy(env, state, workdir, round_index)
        if isinstance(env.algorithm, LoraFedAlgorithm) and round_index == 0:
            # LoRA's B starts at zero, so the initial global model is the base model.
            scores = self.small_zero_shot(Path(uri)) if on_small else dict(self.zero_shot)  # type: ignore[arg-type]  # on_small: uri set
            return {k: v for k, v in scores.items() if not k.startswith("leakage")}
        model, tokenizer = self.model_of(env, state, workdir, round_index)
        metrics = evaluate_model(model, self.eval_set_for(tokenizer), tokenizer)
        metrics["local_em"] = self.local_em(metrics)
        return metrics

    def score_validation(
        self, env: steps.ProviderEnv, state: ServerState, workdir: str, round_index: int
    ) -> Metrics:
        """``val/em`` and ``val/loss`` of the model a server state stands for, on the suite's
        validation split (what tuned methods are selected on)."""
        assert self.val_set is not None
        model, tokenizer = self.model_of(env, state, workdir, round_index)
        scores = evaluate_model(model, self.val_set, tokenizer)
        return {"val/em": scores["em"], "val/loss": scores["test_loss"]}

    def score_proxy(
        self, env: steps.ProviderEnv, state: ServerState, workdir: str, round_index: int
    ) -> Metrics:
        """The proxy-tuned large model's scores (``em`` ...) and the small model's
        (``small/em``, ``small/test_loss``)."""
        small_scores = self.small_zero_shot()
        if round_index == 0:
            # A zero LoRA update: Eq. 3 gives exactly the large model.
            metrics = {k: v for k, v in self.zero_shot.items() if not k.startswith("leakage")}
        else:
            small = env.ctx.peft_model(state.group("adapter"))
            small_scores = evaluate_model(small, self.eval_set, env.ctx.tokenizer())
            proxied, tokenizer = self.model_of(env, state, workdir, round_index)
            metrics = evaluate_model(proxied, self.eval_set, tokenizer)
            metrics["local_em"] = self.local_em(metrics)
        metrics["small/em"] = small_scores["em"]
        metrics["small/test_loss"] = small_scores["test_loss"]
        return metrics

    # -- methods ------------------------------------------------------------------------
    def algorithm(self, method: Method, seed: int) -> list[Metrics]:
        if method.algorithm in POOLED_DATA:
            return self.pooled(method.algorithm, seed, method.params)
        with tempfile.TemporaryDirectory(prefix="fedtune-quality-") as tmp:
            job = self.job(
                name=f"q-{method.algorithm}-s{seed}",
                algorithm=method.algorithm,
                tenants=self.tenants,
                seed=seed,
                workdir=Path(tmp),
                local_steps=self.spec.local_steps,
                variant=method.params,
                privacy=_privacy(method, self.spec),
            )
            return self.run(job)

    def pooled(
        self, algorithm: str, seed: int, variant: Mapping[str, Any] | None = None
    ) -> list[Metrics]:
        """One tenant holding all the data, with as many steps per round as the federation
        takes (the tenants sampled per round times the local steps)."""
        label = "centralized" if algorithm == "fedavg" else algorithm
        with tempfile.TemporaryDirectory(prefix="fedtune-quality-") as tmp:
            job = self.job(
                name=f"q-{label}-s{seed}",
                algorithm=algorithm,
                tenants=["central"],
                seed=seed,
                workdir=Path(tmp),
                local_steps=self.spec.local_steps * self.participants,
                variant=variant,
            )
            return self.run(job)

    def standalone_small(self, seed: int) -> list[Metrics]:
        """Each tenant's small model trained alone (FedMKT's Standalone SLMs)."""
        return self.standalone(seed, {t: self.slm_dir(t) for t in self.tenants})

    def fedavg_small(self, seed: int) -> list[Metrics]:
        """FedAvg on the small model (FedPT's small-model baseline)."""
        with tempfile.TemporaryDirectory(prefix="fedtune-quality-") as tmp:
            job = self.job(
                name=f"q-fedavg-small-s{seed}",
                algorithm="fedavg",
                tenants=self.tenants,
                seed=seed,
                workdir=Path(tmp),
                local_steps=self.spec.local_steps,
                model_dir=self.small_dir,
            )
            return self.run(job)

    def standalone(
        self, seed: int, model_dirs: Mapping[str, Path] | None = None
    ) -> list[Metrics]:
        """Each tenant alone (FedAvg with one client), on the benchmark's model or on its
        own small model (``model_dirs``)."""
        per_tenant: dict[str, list[Metrics]] = {}
        for tenant in self.tenants:
            with tempfile.TemporaryDirectory(prefix="fedtune-quality-") as tmp:
                job = self.job(
                    name=f"q-standalone-{tenant}-s{seed}",
                    algorithm="fedavg",
                    tenants=[tenant],
                    seed=seed,
                    workdir=Path(tmp),
                    local_steps=self.spec.local_steps,
                    model_dir=model_dirs[tenant] if model_dirs else None,
                )
                per_tenant[tenant] = self.run(job)
        rows = []
        for index, round_rows in enumerate(zip(*per_tenant.values(), strict=True)):
            keys = set.intersection(*(set(r) for r in round_rows)) - {"local_em"}
            row = {k: statistics.fmean(r[k] for r in round_rows) for k in keys}
            # Each tenant's own model on its own task mix (the personalised score).
            row["local_em"] = statistics.fmean(
                local_score(r, self.shares[t])
                for t, r in zip(self.tenants, round_rows, strict=True)
            )
            row["round"] = float(self.spec.eval_rounds()[index])
            if self.per_model and model_dirs is not None:
                # Each tenant's own model, as FedMKT's rows report them.
                row.update({f"slm/em/{t}": r["em"] for t, r in zip(self.tenants, round_rows, strict=True)})
                row["slm/local_em"] = row["local_em"]
            rows.append(row)
        return rows

    def zero_shot_rows(self) -> list[Metrics]:
        row = dict(self.zero_shot)
        if self.per_model:
            row |= _as_model(row, "llm", self.tenants) | self.slm_zero_shot()
        return [{**row, "round": float(r)} for r in self.spec.eval_rounds()]

    def slm_zero_shot(self) -> Metrics:
        """Every tenant's untrained small model under its ``slm/*`` names."""
        if not self.spec.tenant_models:
            return _as_model(self.small_zero_shot(), "slm", self.tenants)
        per_tenant = {t: self.small_zero_shot(self.slm_dir(t)) for t in self.tenants}
        return _tenant_means(per_tenant, self.shares)

    def tenant_model_info(self) -> dict[str, dict[str, Any]]:
        """Each tenant's small model: workspace name, architecture, tokenizer, sizes (from
        its pretraining report)."""
        from fedtune.benchmarks.pretrain import REPORT_FILE

        info = {}
        for tenant in self.tenants:
            folder = self.slm_dir(tenant)
            report = json.loads((folder / REPORT_FILE).read_text(encoding="utf-8"))
            spec = report["spec"]
            info[tenant] = {
                "model": folder.name,
                "arch": spec["shape"]["arch"],
                "layers": spec["shape"]["num_layers"],
                "hidden": spec["shape"]["hidden_size"],
                "tokenizer": spec.get("tokenizer", "builtin"),
                "vocab_size": report.get("vocab_size", len(load_pretrained(str(folder))[1])),
                "parameters": report["parameters"],
            }
        return info


def _tenant_means(per_tenant: Mapping[str, Metrics], shares: Mapping[str, Mapping[str, float]]) -> Metrics:
    """``slm/em/<tenant>``, and over tenants ``slm/em``, ``slm/local_em``, ``slm/test_loss``."""
    metrics = {f"slm/em/{t}": m["em"] for t, m in per_tenant.items()}
    metrics["slm/em"] = statistics.fmean(m["em"] for m in per_tenant.values())
    metrics["slm/test_loss"] = statistics.fmean(m["test_loss"] for m in per_tenant.values())
    metrics["slm/local_em"] = statistics.fmean(local_score(m, shares[t]) for t, m in per_tenant.items())
    return metrics | _category_means(per_tenant.values())


def _category_means(scores: Iterable[Metrics]) -> Metrics:
    """``slm/category_em/<category>``: the small models' mean EM per test category (its own
    prefix: ``slm/em/<name>`` names tenants)."""
    rows = list(scores)
    categories = set.intersection(*({k for k in r if k.startswith("em/")} for r in rows)) if rows else set()
    return {
        f"slm/category_em/{key.removeprefix('em/')}": statistics.fmean(r[key] for r in rows)
        for key in sorted(categories)
    }


def _as_model(row: Metrics, model: str, tenants: Sequence[str]) -> Metrics:
    """``row``'s scores under the model's name: ``llm/em``, or ``slm/em``, ``slm/local_em``,
    ``slm/test_loss`` and ``slm/em/<tenant>`` (one shared small model), unless already there."""
    if model == "llm" or "em" not in row:
        return {"llm/em": row["em"]} if "em" in row else {}
    found = {"slm/em": row["em"], "slm/test_loss": row["test_loss"], "slm/local_em": row.get("local_em", 0.0)}
    found |= {f"slm/em/{t}": row["em"] for t in tenants} | _category_means([row])
    return {k: v for k, v in found.items() if k not in row}


def _client_totals(rounds: Sequence[Mapping[str, Any]]) -> Metrics:
    """Over a run's client steps: ``clients/steps``, ``clients/notes`` (steps that reported
    something, e.g. FewFedPIT skipping synthesis) and ``clients/<metric>`` summed (e.g.
    ``clients/fewfedpit/kept``, the synthetic examples kept over the run)."""
    steps_ = [t for r in rounds for t in r["tenants"].values()]
    totals: Metrics = {
        "clients/steps": float(len(steps_)),
        "clients/notes": float(sum(bool(t.get("notes")) for t in steps_)),
    }
    for step in steps_:
        for key, value in (step.get("metrics") or {}).items():
            if isinstance(value, int | float):
                totals[f"clients/{key}"] = totals.get(f"clients/{key}", 0.0) + float(value)
    return totals


def run_quality(workspace: Workspace, spec: QualitySpec, log: Log | None = None) -> dict[str, Any]:
    """Run every method of ``spec`` with every seed; return the results document.

    Raises:
        ConfigError: On unknown methods or settings, or a workspace without a suite or base
            model.
    """
    say: Log = log or logger.info
    _check(spec)
    methods = _methods(spec)
    bench = _Bench(workspace, spec, say)
    runs: list[dict[str, Any]] = []

    def record(method: str, kind: str, seed: int | None, fn: Callable[[], list[Metrics]]) -> None:
        started = time.perf_counter()
        bench.synthesis = []
        rows = fn()
        seconds = time.perf_counter() - started
        runs.append(
            {"method": method, "kind": kind, "seed": seed, "seconds": seconds, "rounds": rows}
            | ({"synthesis_steps": bench.synthesis} if bench.synthesis else {})
        )
        leaked = f", leakage {rows[-1]['leakage']:.3f}" if "leakage" in rows[-1] else ""
        say(
            f"{method} (seed {seed}): EM {rows[-1]['em']:.3f} after round "
            f"{int(rows[-1]['round'])}{leaked}, {seconds:.0f} s"
        )

    if "zero-shot" in spec.baselines:
        # Deterministic: one run stands for every seed.
        record("zero-shot", "baseline", None, bench.zero_shot_rows)
    for seed in spec.seeds:
        for method in methods:
            record(method.label, "algorithm", seed, partial(bench.algorithm, method, seed))
        if "standalone" in spec.baselines:
            record("standalone", "baseline", seed, partial(bench.standalone, seed))
        if "centralized" in spec.baselines:
            record("centralized", "baseline", seed, partial(bench.pooled, "fedavg", seed))
        if "fedavg-small" in spec.baselines:
            record("fedavg-small", "baseline", seed, partial(bench.fedavg_small, seed))
        if "standalone-small" in spec.baselines:
            record("standalone-small", "baseline", seed, partial(bench.standalone_small, seed))
    tuned, selection = select_tuned(runs, spec.select)
    runs += tuned
    table = summarize(runs)
    suite = {k: bench.manifest[k] for k in ("spec", "tenants", "test")} | {"public": bench.public}
    # What a model with no skill scores per category, which the premises read (workspaces
    # made before the manifest recorded it get it from the test set they evaluate on).
    suite["test"] = {**suite["test"], "constant_answer_em": constant_answer_em(bench.test_records)}
    return {
        "commit": source_commit(),
        "spec": spec.to_json(),
        "suite": suite,
        "split": {
            "name": spec.split,
            "tenants": bench.split_manifest["tenants"],
            "files": bench.split_manifest["files"],
        },
        "base_model": str(bench.model_dir),
        **({"tenant_models": bench.tenant_model_info()} if spec.tenant_models else {}),
        "categories": sorted(k.split("/", 1)[1] for k in bench.zero_shot if k.startswith("em/")),
        "runs": runs,
        "table": table,
        "claims": evaluate_claims(
            runs,
            constant_em=suite["test"]["constant_answer_em"],
            public_categories=recorded_public_categories({"suite": suite}),
        ),
        "selection": selection,
    }


def merge_results(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One results document from runs of the same benchmark split by seed (e.g. one process
    per seed on a machine with cores to spare): the runs pooled (a deterministic run such as
    Zero-Shot once), the table and the claims recomputed.

    Raises:
        ConfigError: The parts differ in anything but their seeds, or share a seed.
    """
    first = parts[0]
    fixed = ("suite", "split", "categories", "tenant_models")
    spec = {k: v for k, v in first["spec"].items() if k != "seeds"}

    def code(part: Mapping[str, Any]) -> Any:  # the commit, whatever the workspace copy
        return (part.get("provenance") or {}).get("measured_at_commit")

    for part in parts[1:]:
        other = {k: v for k, v in part["spec"].items() if k != "seeds"}
        differ = [k for k in fixed if part.get(k) != first.get(k)] + (["spec"] if other != spec else [])
        differ += ["base_model"] if Path(part["base_model"]).name != Path(first["base_model"]).name else []
        differ += ["provenance"] if code(part) != code(first) else []
        if differ:
            raise ConfigError(
                f"results to merge differ in {differ}", fix="Merge runs of one benchmark only."
            )
    seeds = [seed for part in parts for seed in part["spec"]["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"results to merge share seeds {seeds}", fix="Give each part other seeds.")
    runs: dict[tuple[str, Any], Mapping[str, Any]] = {}
    for part in parts:
        for run in part["runs"]:
            runs.setdefault((run["method"], run["seed"]), run)
    merged = dict(first)
    merged["spec"] = {**first["spec"], "seeds": sorted(seeds)}
    if "provenance" in first:
        merged["provenance"] = {
            "measured_at_commit": code(first),
            "commands": [(part.get("provenance") or {}).get("command") for part in parts],
        }
    merged["runs"] = sorted(runs.values(), key=lambda r: (r["seed"] is not None, r["seed"] or 0))
    merged["table"] = summarize(merged["runs"])
    merged["claims"] = evaluate_claims(
        merged["runs"],
        constant_em=recorded_constant_answers(merged),
        public_categories=recorded_public_categories(merged),
    )
    return merged


def _stats(values: Sequence[float]) -> dict[str, float]:
    return {
        "mean": statistics.fmean(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "min": min(values),
        "max": max(values),
        "n": float(len(values)),
    }


def summarize(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per method: final-round metrics over seeds (mean, std, min, max, n)."""
    methods: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        methods.setdefault(run["method"], []).append(run)
    rows = []
    for method, method_runs in methods.items():
        finals = [run["rounds"][-1] for run in method_runs]
        keys = sorted(set.intersection(*(set(f) for f in finals)) - {"round"})
        row: dict[str, Any] = {
            "method": method,
            "kind": method_runs[0]["kind"],
            "seeds": [run["seed"] for run in method_runs],
            "metrics": {k: _stats([float(f[k]) for f in finals]) for k in keys},
            "best_em": _stats([max(r["em"] for r in run["rounds"]) for run in method_runs]),
            "seconds": statistics.fmean(run["seconds"] for run in method_runs),
        }
        rows.append(row)
    return rows
