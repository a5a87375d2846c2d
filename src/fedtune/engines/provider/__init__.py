"""The provider's side of the engines that no tenant may import: the secure-aggregation
provider steps and the multi-rank launch of the provider's heavy steps (pyproject.toml's
import-linter contract keeps tenant code from them)."""
