"""A public set drawn from the tenants' distribution, as FedMKT's paper draws its public data.

FedMKT (paper 003, Section 4.1) splits each task's training data into five equal parts: one
is the public set every party shares, four are the clients' private data. Its public set is
therefore the tenants' own distribution, and the LLM can learn there what the tenants know.
The suite's ``public.jsonl`` has another mixture on purpose (FedBiOT's distribution drift,
no counting records), so the FedMKT comparisons use this set instead
(``QualitySpec.tenant_public_records``):

```
DIR/suite/tenant-public/public.jsonl   new records in the tenants' category mixture
DIR/suite/tenant-public/suite.json     size, mixture, category counts, the sha256 of every
                                       suite file it was drawn against and of its own file
```

The records are drawn with the suite's generator and the suite's recorded tenant mixture
less its scarce categories (classify: every distinct record is in the suite already), none
equal to a record of the suite's files (pool, public, test, validation, pretraining corpus;
read from disk after their sha256 checks). A manifest for another size or another suite is
redrawn (the set is a pure function of both); one whose file no longer matches its sha256
is an error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Final

from fedtune.benchmarks.suite import (
    SCARCE_CATEGORIES,
    describe_set,
    digests,
    ensure_drawn,
    load_manifest,
    read_set,
)
from fedtune.core.errors import ConfigError
from fedtune.data.jsonl import write_jsonl
from fedtune.data.synthetic import generate_mixture

__all__ = ["TENANT_PUBLIC_DIR", "ensure_tenant_public_set"]

logger = logging.getLogger(__name__)

#: The set's folder inside the suite folder.
TENANT_PUBLIC_DIR: Final = "tenant-public"
# After the suite's own seeds (seed .. seed + 4).
_SEED_OFFSET: Final = 5
# The suite's sets a drawn record must differ from (public.jsonl is inside pretrain.jsonl).
_SUITE_SETS: Final = ("central", "public", "test", "validation", "pretrain")


def _build(suite_dir: Path, manifest: dict[str, Any], records: int) -> tuple[dict[str, bytes], dict[str, Any]]:
    # Every record the suite wrote (checked against its sha256 by load_manifest), read from
    # disk: the pretraining corpus on disk is exactly what the bases saw.
    seen = [r for name in _SUITE_SETS if f"{name}.jsonl" in manifest["files"] for r in read_set(suite_dir, name)]
    # The scarce categories' records are all in the suite already (classify: a few dozen).
    mixture = {c: w for c, w in manifest["spec"]["tenant_mixture"].items() if c not in SCARCE_CATEGORIES}
    public = generate_mixture(records, mixture, seed=manifest["spec"]["seed"] + _SEED_OFFSET, exclude=seen)
    files = {"public.jsonl": write_jsonl(public)}
    drawn = {
        "records": records,
        "tenant_mixture": mixture,
        "suite_files": manifest["files"],
        "public": describe_set(public),
        "files": digests(files),
    }
    return files, drawn


def ensure_tenant_public_set(suite_dir: str | Path, records: int) -> tuple[Path, dict[str, Any]]:
    """The set's ``public.jsonl`` and its manifest, drawn first if absent or drawn for another
    size or from another suite.

    Raises:
        ConfigError: The suite folder holds no suite, or ``records`` is below 1.
        DataError: A suite file or the set's file differs from its manifest, or the generator
            cannot supply ``records`` new records.
    """
    if records < 1:
        raise ConfigError(
            f"a public set of {records} records was asked for",
            fix="Ask for at least one record (tenant_public_records: 0 means the suite's public set).",
        )
    root = Path(suite_dir)
    manifest = load_manifest(root)
    out = root / TENANT_PUBLIC_DIR
    # Every suite file, not only the pool: the drawn records avoid all of them.
    drawn, new = ensure_drawn(
        out,
        lambda old: old.get("records") == records and old.get("suite_files") == manifest["files"],
        lambda: _build(root, manifest, records),
        what="the tenants' public set",
        redraw_hint="the next FedMKT comparison",
    )
    if not new:
        return out / "public.jsonl", drawn
    counts = drawn["public"]["category_counts"]
    logger.info(
        "tenants' public set: %d records in %s (%s)",
        records, out, ", ".join(f"{c} {n}" for c, n in counts.items()),
    )
    return out / "public.jsonl", drawn
