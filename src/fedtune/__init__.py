"""fedtune: federated fine-tuning of large language models, from a laptop to Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

from fedtune.core.cpu import prefer_passive_wait

# Before anything imports torch (and its OpenMP runtime, which reads this once).
prefer_passive_wait()

try:
    __version__ = version("fedtune")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
