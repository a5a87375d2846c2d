"""The one exception root of fedtune and its domain subclasses.

Every error a user can meet is a :class:`FedtuneError`: its message says what happened and
shows the offending value, ``fix`` says what to do, and ``exit_code`` is what the CLI and the
entrypoints exit with. A test checks that no subclass lacks a fix or shares an exit code.
"""

from __future__ import annotations


class FedtuneError(Exception):
    """Root of all user-facing fedtune errors."""

    exit_code: int = 1
    fix: str = "See the message above; run with --verbose for details."

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        if fix is not None:
            self.fix = fix

    def render(self) -> str:
        """Message and fix as one block of text for a terminal."""
        return f"error: {self}\nfix: {self.fix}"


class ConfigError(FedtuneError):
    """The job description is malformed or inconsistent."""

    exit_code = 2
    fix = "Correct the job file; `fedtune validate JOB.yaml` lists every problem at once."


class DataError(FedtuneError):
    """A dataset file or record cannot be read or is missing a field."""

    exit_code = 3
    fix = "Correct the named record or point the tenant's data_uri at a valid JSONL file."


class StoreError(FedtuneError):
    """An object store cannot be reached, or a key is missing or not allowed."""

    exit_code = 4
    fix = "Check the store URI, the endpoint and the credentials in the environment."


class IntegrityError(StoreError):
    """A blob does not match the sha256 stored beside it."""

    exit_code = 5
    fix = "The object was altered or half-written; delete it and re-run the step that wrote it."


class UpdateRejected(FedtuneError):
    """A tenant's update failed validation (keys, shapes, finiteness, size)."""

    exit_code = 6
    fix = "Inspect the tenant's client step; the update was left out of aggregation."


class QuorumError(FedtuneError):
    """Fewer valid updates than ``min_clients`` arrived for a round."""

    exit_code = 7
    fix = "Fix the rejected tenants and re-run with --resume, or lower min_clients."


class ModelError(FedtuneError):
    """A model or adapter cannot be built, loaded or mapped."""

    exit_code = 8
    fix = "Check the model section of the job file and the model directory's contents."


class RegistryError(FedtuneError):
    """An algorithm name is unknown or registered twice."""

    exit_code = 9
    fix = "Use one of the registered algorithm names (`fedtune algorithms` lists them)."
