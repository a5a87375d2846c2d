"""Built-in algorithms; importing this package registers them by name."""

from fedtune.algorithms import fedavg, fedopt, fedprox, scaffold  # noqa: F401
from fedtune.algorithms import fedbiot, fedmkt, fedpt, fewfedpit  # noqa: F401
from fedtune.algorithms.base import Algorithm, Artifact

__all__ = ["Algorithm", "Artifact"]
