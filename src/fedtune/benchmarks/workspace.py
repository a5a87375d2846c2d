"""Where the benchmarks keep their files: one folder per benchmark workspace.

```
DIR/suite/         the task suite (tenant-*.jsonl, central, public, test, suite.json)
DIR/models/NAME/   pretrained base models ("large", "small") as Hugging Face directories
DIR/quality/       results.json, results.md, plots/*.png
DIR/system/        results.json, results.md
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedtune.core.errors import ConfigError, ModelError
from fedtune.models.loading import check_model_dir

__all__ = ["Workspace"]


@dataclass(frozen=True)
class Workspace:
    """The folders of one benchmark workspace."""

    root: Path

    @property
    def suite_dir(self) -> Path:
        """The task suite."""
        return self.root / "suite"

    def model_dir(self, name: str) -> Path:
        """A pretrained base model's Hugging Face directory."""
        return self.root / "models" / name

    @property
    def quality_dir(self) -> Path:
        """Outputs of ``fedtune bench quality``."""
        return self.root / "quality"

    @property
    def system_dir(self) -> Path:
        """Outputs of ``fedtune bench system``."""
        return self.root / "system"

    def require_model(self, name: str) -> Path:
        """The model directory, checked to hold a loadable model.

        Raises:
            ConfigError: The model has not been pretrained in this workspace.
        """
        path = self.model_dir(name)
        try:
            check_model_dir(path)
        except ModelError as exc:
            raise ConfigError(
                f"no pretrained {name!r} base model in the workspace {str(self.root)!r}: {exc}",
                fix=f"Run `fedtune bench pretrain --out {self.root}` first (same --preset).",
            ) from exc
        return path
