"""FewFedPIT (paper 004): few-shot tenants grow their data synthetically and leak less."""

from fedtune.algorithms.fewfedpit import algorithm  # noqa: F401  (registers "fewfedpit")
