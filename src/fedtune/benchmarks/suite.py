"""The benchmark task suite: non-IID tenants, a drifted public set and held-out test sets.

Built from :mod:`fedtune.data.synthetic`, so every answer is exactly checkable:

- a private pool drawn with the ``tenant_mixture`` of categories, split among the tenants
  non-IID by category (Dirichlet, as FedPT and FewFedPIT do, or McMahan's pathological
  shards); ``central.jsonl`` is the pool itself, the data of the Centralized baseline;
- ``public.jsonl``: the provider's data, with another category mixture (the distribution
  drift FedBiOT is about); the algorithms that use public data (FedBiOT's alignment,
  FedPT's and FedMKT's distillation) read it;
- ``pretrain.jsonl``: the corpus the base models are pretrained on: the public set plus
  ``pretrain_records`` more records of the public mixture, so that tiny models learn the
  tasks instead of memorising a few hundred records, then ``self_instruct_records``
  self-instruct demonstrations built from those records
  (:mod:`fedtune.benchmarks.self_instruct`: FewFedPIT's generator must write new tasks);
- ``test.jsonl``: ``test_per_category`` records per category that repeat no training,
  public or pretraining record;
- ``validation.jsonl``: ``validation_per_category`` more such records, repeating no other
  set: tuned baselines select their setting on it and report on the test set. A tenant's *local* score weighs the per-category scores by the tenant's own
  category shares, so no second test set is needed.

Every set comes from its own seed derived from ``SuiteSpec.seed``; the same spec always
writes byte-identical files. The classify category has only 180 distinct records, so its
weight stays small in every mixture (the sizes are checked when the suite is built), and the
pretraining corpus repeats the public set's classify records instead of drawing new ones.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.self_instruct import demonstrations
from fedtune.core.errors import ConfigError, DataError
from fedtune.data.jsonl import read_jsonl, write_jsonl
from fedtune.data.partition import partition
from fedtune.data.synthetic import CATEGORIES, generate, generate_mixture

__all__ = [
    "MANIFEST",
    "SCARCE_CATEGORIES",
    "PUBLIC_MIXTURE",
    "TENANT_MIXTURE",
    "Suite",
    "SuiteSpec",
    "build_suite",
    "category_shares",
    "constant_answer_em",
    "ensure_drawn",
    "describe_set",
    "digests",
    "load_manifest",
    "read_set",
    "recorded_constant_answers",
    "recorded_public_categories",
    "write_files",
    "write_suite",
]

logger = logging.getLogger(__name__)

Record = dict[str, str]

MANIFEST: Final = "suite.json"
# Categories with too few distinct records to draw a pretraining corpus from (see above).
SCARCE_CATEGORIES: Final = ("classify",)
# The tenants together see every category about equally (classify is small: see above).
TENANT_MIXTURE: Final[dict[str, float]] = {
    "arithmetic": 0.225,
    "reverse": 0.225,
    "lookup": 0.225,
    "count": 0.225,
    "classify": 0.1,
}
# The provider's data leans on arithmetic and look-up and never asks to count letters: a
# model pretrained on it knows some of the tenants' tasks and not others, so fine-tuning on
# the tenants' data has something to teach (and a tenant without counting data cannot learn
# it alone).
PUBLIC_MIXTURE: Final[dict[str, float]] = {
    "arithmetic": 0.45,
    "lookup": 0.3,
    "reverse": 0.15,
    "classify": 0.1,
    "count": 0.0,
}


@dataclass(frozen=True)
class SuiteSpec:
    """What the suite holds; the files are a pure function of these fields."""

    seed: int = 0
    tenants: int = 4
    private_records: int = 800  # the pool split among tenants (and the Centralized set)
    partition: str = "dirichlet"  # or "pathological"
    alpha: float = 0.5  # Dirichlet concentration (FedPT: 0.5)
    k: int = 2  # categories per tenant for "pathological"
    public_records: int = 600
    # Beyond the public set: 40,000, so that the larger bases learn the tasks rather than
    # the records (with 12,000, FedBiOT's corpus, a 5,000-step "large" saw each record ten
    # times: train loss 0.24, test loss 1.25, look-up at chance).
    pretrain_records: int = 40000
    # FewFedPIT's two prompts, demonstrated (7 % of the default corpus; 19 % with 12,000).
    self_instruct_records: int = 3000
    test_per_category: int = 30
    # Model selection (tuned baselines' grids) scores on this, never on test. Ten per
    # category: the classify category has 10 distinct records left after the default sets.
    validation_per_category: int = 10
    tenant_mixture: Mapping[str, float] = field(default_factory=lambda: dict(TENANT_MIXTURE))
    public_mixture: Mapping[str, float] = field(default_factory=lambda: dict(PUBLIC_MIXTURE))

    def to_json(self) -> dict[str, Any]:
        """Plain JSON form (for the manifest)."""
        data = asdict(self)
        data["tenant_mixture"] = dict(self.tenant_mixture)
        data["public_mixture"] = dict(self.public_mixture)
        return data

    @property
    def tenant_names(self) -> list[str]:
        """DNS-1123 tenant names: tenant-1, tenant-2, ..."""
        return [f"tenant-{i + 1}" for i in range(self.tenants)]


@dataclass(frozen=True)
class Suite:
    """The records of every set, by set name."""

    spec: SuiteSpec
    tenants: dict[str, list[Record]]
    central: list[Record]
    public: list[Record]
    test: list[Record]
    pretrain: list[Record]
    validation: list[Record] = field(default_factory=list)

    def files(self) -> dict[str, bytes]:
        """File name -> JSON Lines content."""
        files = {f"{name}.jsonl": write_jsonl(records) for name, records in self.tenants.items()}
        files["central.jsonl"] = write_jsonl(self.central)
        files["public.jsonl"] = write_jsonl(self.public)
        files["test.jsonl"] = write_jsonl(self.test)
        files["pretrain.jsonl"] = write_jsonl(self.pretrain)
        if self.validation:
            files["validation.jsonl"] = write_jsonl(self.validation)
        return files

    def manifest(self) -> dict[str, Any]:
        """What the suite is: spec, per-tenant category shares and a sha256 per file."""
        return {
            "spec": self.spec.to_json(),
            "categories": list(CATEGORIES),
            "tenants": {
                name: describe_set(records) for name, records in self.tenants.items()
            },
            "public": describe_set(self.public),
            "test": describe_set(self.test) | {"constant_answer_em": constant_answer_em(self.test)},
            "pretrain": describe_set(self.pretrain),
            "validation": describe_set(self.validation),
            "files": digests(self.files()),
        }


def digests(files: Mapping[str, bytes]) -> dict[str, str]:
    """File name -> sha256 of its content, sorted by name (a manifest's ``files``)."""
    return {name: hashlib.sha256(data).hexdigest() for name, data in sorted(files.items())}


def describe_set(records: list[Record]) -> dict[str, Any]:
    """A set's manifest entry: ``records`` and ``category_counts`` (every category listed)."""
    counts = Counter(r["category"] for r in records)
    return {"records": len(records), "category_counts": {c: counts.get(c, 0) for c in CATEGORIES}}


def constant_answer_em(records: list[Record]) -> dict[str, float]:
    """Per category of ``records``, the EM of always giving its most common reference
    answer (that answer's share): what a model with no skill at the task can score. On the
    default test set always answering "fruit" gets 14 of 30 classify records (0.467)."""
    answers: dict[str, Counter[str]] = {}
    for record in records:
        answers.setdefault(record["category"], Counter())[record["response"]] += 1
    return {
        category: count.most_common(1)[0][1] / count.total()
        for category, count in sorted(answers.items())
    }


def recorded_constant_answers(results: Mapping[str, Any]) -> dict[str, float] | None:
    """The test set's :func:`constant_answer_em` as a quality results file records it
    (``suite.test``); for results recorded before it did, computed from the test set rebuilt
    from the recorded suite spec, if that is the recorded set (the sha256 of ``test.jsonl``
    its ``split`` names). None when neither is possible."""
    suite = results.get("suite") or {}
    entry = suite.get("test") or {}
    if "constant_answer_em" in entry:
        return {c: float(v) for c, v in entry["constant_answer_em"].items()}
    digest = ((results.get("split") or {}).get("files") or {}).get("test.jsonl")
    if not digest or not suite.get("spec"):
        return None
    return _rebuilt_constant_answers(json.dumps(suite["spec"], sort_keys=True), digest)


def recorded_public_categories(results: Mapping[str, Any]) -> list[str] | None:
    """The categories the public set holds records of, as a quality results file records it
    (``suite.public.category_counts``); None when not recorded."""
    counts = ((results.get("suite") or {}).get("public") or {}).get("category_counts")
    if counts is None:
        return None
    return sorted(c for c, n in counts.items() if n > 0)


@functools.lru_cache(maxsize=8)
def _rebuilt_constant_answers(spec_json: str, digest: str) -> dict[str, float] | None:
    try:
        test = build_suite(SuiteSpec(**json.loads(spec_json))).test
    except (TypeError, ValueError, ConfigError, DataError):
        return None  # a spec this code no longer reads
    if hashlib.sha256(write_jsonl(test)).hexdigest() != digest:
        return None
    return constant_answer_em(test)


def _check_spec(spec: SuiteSpec) -> None:
    problems = []
    if spec.tenants < 1:
        problems.append(f"tenants={spec.tenants} must be >= 1")
    if spec.private_records < spec.tenants:
        problems.append(f"private_records={spec.private_records} is fewer than the tenants")
    if spec.pretrain_records < 0 or spec.self_instruct_records < 0:
        problems.append(
            f"pretrain_records={spec.pretrain_records} and self_instruct_records="
            f"{spec.self_instruct_records} must be >= 0"
        )
    if spec.public_records < 1 or spec.test_per_category < 1:
        problems.append(
            f"public_records={spec.public_records} and test_per_category="
            f"{spec.test_per_category} must be >= 1"
        )
    if spec.validation_per_category < 0:
        problems.append(f"validation_per_category={spec.validation_per_category} must be >= 0")
    if spec.partition not in ("dirichlet", "pathological"):
        problems.append(f"partition={spec.partition!r} is not 'dirichlet' or 'pathological'")
    if problems:
        raise ConfigError(
            "invalid task suite: " + "; ".join(problems),
            fix="Correct the suite settings (fedtune bench pretrain --help lists them).",
        )


def build_suite(spec: SuiteSpec) -> Suite:
    """Generate every set of the suite (deterministic in ``spec``).

    Raises:
        ConfigError: On inconsistent sizes or an unknown partition method or category.
        DataError: If a category cannot supply enough distinct records, or the split would
            leave a tenant empty.
    """
    _check_spec(spec)
    pool = generate_mixture(spec.private_records, spec.tenant_mixture, seed=spec.seed)
    names = spec.tenant_names
    try:
        parts = partition(
            spec.partition,
            pool,
            names,
            seed=spec.seed,
            field="category",
            k=spec.k,
            alpha=spec.alpha,
        )
    except DataError as exc:
        raise DataError(
            f"cannot split {len(pool)} private records among {spec.tenants} tenants: {exc}",
            fix="Use more private records, fewer tenants or a larger alpha.",
        ) from exc
    public = generate_mixture(
        spec.public_records, spec.public_mixture, seed=spec.seed + 1, exclude=pool
    )
    test = generate(spec.test_per_category, seed=spec.seed + 2, exclude=pool + public)
    extra_mixture = {c: w for c, w in spec.public_mixture.items() if c not in SCARCE_CATEGORIES}
    extra = (
        generate_mixture(
            spec.pretrain_records, extra_mixture, seed=spec.seed + 3, exclude=pool + public + test
        )
        if spec.pretrain_records and extra_mixture
        else []
    )
    # Drawn last, so adding it left every other set (and the pretrained models) unchanged.
    validation = (
        generate(
            spec.validation_per_category,
            seed=spec.seed + 4,
            exclude=pool + public + test + extra,
        )
        if spec.validation_per_category
        else []
    )
    # Built from the corpus itself, so it shows no test or validation record.
    shown = demonstrations(public + extra, spec.self_instruct_records, spec.seed)
    # A pathological split may leave records out; the Centralized set is what tenants hold.
    central = [r for name in names for r in parts[name]]
    logger.info(
        "task suite: %d tenants (%s records), %d public, %d test, %d pretraining",
        len(names),
        "/".join(str(len(parts[n])) for n in names),
        len(public),
        len(test),
        len(public) + len(extra) + len(shown),
    )
    return Suite(
        spec=spec,
        tenants=dict(parts),
        central=central,
        public=public,
        test=test,
        pretrain=public + extra + shown,
        validation=validation,
    )


def write_files(out_dir: str | Path, files: Mapping[str, bytes], manifest: Mapping[str, Any]) -> None:
    """Write ``files`` and, last, ``manifest`` as ``MANIFEST`` into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", "utf-8")


def ensure_drawn(
    out_dir: Path,
    same: Callable[[Mapping[str, Any]], bool],
    draw: Callable[[], tuple[dict[str, bytes], dict[str, Any]]],
    *,
    what: str,
    redraw_hint: str,
) -> tuple[dict[str, Any], bool]:
    """A set drawn from the suite into ``out_dir`` (the few-shot split, the tenants' public
    set): its manifest if one there is ``same`` (drawn with these settings from this pool),
    else ``draw()``'s files written, manifest last. The flag says whether it was drawn now.

    Raises:
        DataError: The manifest is the same but a file no longer matches it.
    """
    path = out_dir / MANIFEST
    if path.is_file() and same(json.loads(path.read_text("utf-8"))):
        try:
            return load_manifest(out_dir), False
        except DataError as exc:
            raise DataError(
                f"{what} in {str(out_dir)!r} is damaged: {exc}",
                fix=f"Delete {str(out_dir)!r}; {redraw_hint} draws it again (deterministically).",
            ) from exc
    files, manifest = draw()
    write_files(out_dir, files, manifest)
    return manifest, True


def write_suite(suite: Suite, out_dir: str | Path) -> dict[str, Any]:
    """Write the suite's files and its manifest into ``out_dir``; return the manifest."""
    manifest = suite.manifest()
    write_files(out_dir, suite.files(), manifest)
    return manifest


def load_manifest(suite_dir: str | Path) -> dict[str, Any]:
    """The manifest of a written suite, after checking every file against its sha256.

    Raises:
        ConfigError: The folder holds no suite.
        DataError: A file is missing or differs from the manifest.
    """
    root = Path(suite_dir)
    path = root / MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"no task suite in {str(root)!r} (no {MANIFEST})",
            fix="Create it with `fedtune bench pretrain --out DIR` (it writes DIR/suite).",
        )
    manifest: dict[str, Any] = json.loads(path.read_text("utf-8"))
    for name, digest in manifest["files"].items():
        file = root / name
        if not file.is_file() or hashlib.sha256(file.read_bytes()).hexdigest() != digest:
            raise DataError(
                f"suite file {str(file)!r} is missing or differs from {MANIFEST}",
                fix="Rebuild the suite with `fedtune bench pretrain --out DIR`.",
            )
    return manifest


def category_shares(manifest: Mapping[str, Any], tenant: str) -> dict[str, float]:
    """A tenant's share of each category in its training data (sums to 1)."""
    counts: dict[str, int] = manifest["tenants"][tenant]["category_counts"]
    total = sum(counts.values())
    return {c: n / total for c, n in counts.items()}


def read_set(suite_dir: str | Path, name: str) -> list[dict[str, Any]]:
    """The records of one suite file (``test``, ``public``, ``central`` or a tenant)."""
    return read_jsonl(Path(suite_dir) / f"{name}.jsonl")
