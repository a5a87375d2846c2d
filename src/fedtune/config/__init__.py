"""Job description: the one validated, frozen configuration every phase reads from."""

from fedtune.config.algorithms import AlgorithmConfig
from fedtune.config.job import JobConfig, TenantConfig
from fedtune.config.loading import format_validation_errors, load_job, parse_job

__all__ = [
    "AlgorithmConfig",
    "JobConfig",
    "TenantConfig",
    "format_validation_errors",
    "load_job",
    "parse_job",
]
