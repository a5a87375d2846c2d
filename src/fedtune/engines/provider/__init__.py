"""The provider's side of the engines that no tenant may import: the secure-aggregation
provider steps, the multi-rank launch of the provider's heavy steps and the audit's pooling
and tagging (pyproject.toml's import-linter contract keeps tenant code from them)."""
