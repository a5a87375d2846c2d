"""fedtune: federated fine-tuning of large language models, from a laptop to Kubernetes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedtune")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

__all__ = ["__version__"]
