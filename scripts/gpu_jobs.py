"""Write GPU variants of example jobs beside the examples (so their relative data paths
hold), for a lent GPU machine: ``python scripts/gpu_jobs.py [PRECISION]`` prints their paths.

Each copy changes only ``training.device`` (cuda), ``training.precision`` and
``tracking.backend`` (``none``: a bare GPU machine has no MLflow server). Git ignores the
copies; on a machine without CUDA they are config errors, so ``tests/integration/test_cli.py``
(which validates every ``examples/*.yaml``) fails while they lie there: delete them after use.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
JOBS = ("quickstart", "fedbiot", "fedpt", "fedmkt", "fewfedpit")


def main(argv: list[str]) -> int:
    precision = argv[0] if argv else "bf16"
    for name in JOBS:
        job = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
        job.setdefault("training", {}).update(device="cuda", precision=precision)
        job["tracking"] = {"backend": "none"}
        target = EXAMPLES / f"{name}-cuda-{precision}.yaml"
        target.write_text(yaml.safe_dump(job, sort_keys=False))
        print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
