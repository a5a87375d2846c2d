"""FewFedPIT's few-shot split of the task suite: many tenants with a handful of records each.

The suite's private pool (``central.jsonl``) goes through
:func:`fedtune.data.fewshot.fewshot_clusters` (embed instructions, KMeans, ``per_cluster``
records per cluster, Dirichlet over cluster labels), as ``fedtune partition --strategy
fewshot-clusters`` does. The split lives beside the suite:

```
DIR/suite/fewshot/tenant-01.jsonl ... tenant-NN.jsonl   each tenant's few records
DIR/suite/fewshot/central.jsonl                         their union (the Centralized data)
DIR/suite/fewshot/suite.json                            spec, category counts, sha256 per file
```

The manifest has the suite manifest's shape (``tenants``, ``files``), so the benchmark reads
both alike. It records the sha256 of the pool it was drawn from: a manifest for another spec
or another pool is rebuilt (the split is a pure function of both); a manifest whose files no
longer match their sha256 is an error.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.suite import describe_set, digests, ensure_drawn, load_manifest
from fedtune.data.fewshot import fewshot_clusters
from fedtune.data.jsonl import read_jsonl, write_jsonl

__all__ = ["FEWSHOT_DIR", "FewShotSpec", "ensure_fewshot_split"]

logger = logging.getLogger(__name__)

#: The split's folder inside the suite folder.
FEWSHOT_DIR: Final = "fewshot"
_POOL: Final = "central.jsonl"


@dataclass(frozen=True)
class FewShotSpec:
    """How the few-shot split is drawn (defaults: 10 tenants, 20 clusters x 8 records)."""

    tenants: int = 10
    clusters: int = 20
    per_cluster: int = 8
    alpha: float = 1.0  # Dirichlet over cluster labels (FewFedPIT: 1.0)
    embedding: str = "tfidf"  # the same vectors on every machine (see fedtune.data.embed)
    seed: int = 0

    @property
    def tenant_names(self) -> list[str]:
        """Zero-padded DNS-1123 names: tenant-01, tenant-02, ..."""
        width = max(2, len(str(self.tenants)))
        return [f"tenant-{i + 1:0{width}d}" for i in range(self.tenants)]


def _build(
    suite_dir: Path, spec: FewShotSpec, pool_sha256: str
) -> tuple[dict[str, bytes], dict[str, Any]]:
    pool = read_jsonl(suite_dir / _POOL)
    split = fewshot_clusters(
        pool,
        spec.tenant_names,
        clusters=spec.clusters,
        per_cluster=spec.per_cluster,
        alpha=spec.alpha,
        embedding=spec.embedding,
        seed=spec.seed,
        source=str(suite_dir / _POOL),
    )
    files = {f"{name}.jsonl": write_jsonl(records) for name, records in split.parts.items()}
    central = [r for name in spec.tenant_names for r in split.parts[name]]
    files["central.jsonl"] = write_jsonl(central)
    manifest = {
        "spec": asdict(spec),
        "pool_sha256": pool_sha256,
        "embedding": split.embedding,
        "kept": split.kept,
        "pool_records": split.total,
        "tenants": {name: describe_set(records) for name, records in split.parts.items()},
        "files": digests(files),
    }
    return files, manifest


def ensure_fewshot_split(suite_dir: str | Path, spec: FewShotSpec) -> tuple[Path, dict[str, Any]]:
    """The split's folder and manifest, written first if absent or drawn with other settings.

    Raises:
        ConfigError: The suite folder holds no suite.
        DataError: A file of the split differs from its manifest, or the split cannot be
            drawn (too few records, a tenant left empty).
    """
    root = Path(suite_dir)
    pool_sha256 = load_manifest(root)["files"][_POOL]
    out = root / FEWSHOT_DIR
    manifest, new = ensure_drawn(
        out,
        lambda old: old.get("spec") == asdict(spec) and old.get("pool_sha256") == pool_sha256,
        lambda: _build(root, spec, pool_sha256),
        what="the few-shot split",
        redraw_hint="the next `fedtune bench quality --split fewshot`",
    )
    if not new:
        return out, manifest
    sizes = [manifest["tenants"][n]["records"] for n in spec.tenant_names]
    logger.info(
        "few-shot split: %d of %d pool records in %s (%s per tenant; %s embedding)",
        manifest["kept"],
        manifest["pool_records"],
        out,
        "/".join(map(str, sizes)),
        manifest["embedding"],
    )
    return out, manifest

