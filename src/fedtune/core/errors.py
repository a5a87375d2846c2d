"""The one exception root of fedtune and its domain subclasses.

Every error a user can meet is a :class:`FedtuneError`: its message says what happened and
shows the offending value, ``fix`` says what to do, and ``exit_code`` is what the CLI and the
entrypoints exit with. A test checks that no subclass lacks a fix or shares an exit code.

A tenant's error message may quote its own records. What leaves a tenant for the provider is
only :meth:`FedtuneError.redacted`: the error kind, the record's line number, and a fixed
text of the kind that holds no runtime values (:class:`TenantFailure`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class FedtuneError(Exception):
    """Root of all user-facing fedtune errors."""

    exit_code: int = 1
    fix: str = "See the message above; run with --verbose for details."
    #: What the provider sees of this error when a tenant meets it: fixed, no runtime values.
    redacted_message: str = "the tenant's step failed"

    def __init__(self, message: str, *, fix: str | None = None, record: int | None = None) -> None:
        super().__init__(message)
        if fix is not None:
            self.fix = fix
        self.record = record

    def render(self) -> str:
        """Message and fix as one block of text for a terminal."""
        return f"error: {self}\nfix: {self.fix}"

    def redacted(self) -> TenantFailure:
        """The form of this error that may cross from a tenant to the provider."""
        return TenantFailure(kind=type(self).__name__, record=self.record)


class ConfigError(FedtuneError):
    """The job description is malformed or inconsistent."""

    exit_code = 2
    fix = "Correct the job file; `fedtune validate JOB.yaml` lists every problem at once."
    redacted_message = "the job config is invalid in the tenant's step"


class DataError(FedtuneError):
    """A dataset file or record cannot be read or is missing a field."""

    exit_code = 3
    fix = "Correct the named record or point the tenant's data_uri at a valid JSONL file."
    redacted_message = "the tenant's dataset or one of its records cannot be used"


class PublicSetMismatch(DataError):
    """A party's copy of the shared public set differs from the provider's (FedMKT)."""

    exit_code = 13
    fix = "Give every party the same public_data_uri content (and the same algorithm.public_size)."
    redacted_message = (
        "the tenant's copy of the public set differs from the provider's (its content hash "
        "does not match the broadcast's)"
    )


class ExampleTooLong(DataError):
    """An example leaves no trained token within ``max_seq_len``: skipped where a dataset is
    encoded; an error only when no example fits."""

    exit_code = 16
    fix = "Raise training.max_seq_len or drop records with long instructions or turns."
    redacted_message = "an example of the tenant's dataset does not fit max_seq_len"


class StoreError(FedtuneError):
    """An object store cannot be reached, or a key is missing or not allowed."""

    exit_code = 4
    fix = "Check the store URI, the endpoint and the credentials in the environment."
    redacted_message = "a store the tenant's step uses cannot be read or written"


class StoreUnavailable(StoreError):
    """A store's server cannot be reached or did not answer within the job's bounds: an outage."""

    exit_code = 12
    fix = "Check that the store's server is up and reachable; then run again with --resume."
    redacted_message = "a store the tenant's step uses did not answer (a store outage)"


class IntegrityError(StoreError):
    """A blob does not match the sha256 stored beside it."""

    exit_code = 5
    fix = "The object was altered or half-written; delete it and re-run the step that wrote it."
    redacted_message = "an object the tenant's step read failed its checksum"


class UpdateRejected(FedtuneError):
    """A tenant's update failed validation (keys, shapes, finiteness, size)."""

    exit_code = 6
    fix = "Inspect the tenant's client step; the update was left out of aggregation."
    redacted_message = "the tenant's update failed validation"


class QuorumError(FedtuneError):
    """Fewer valid updates than ``min_clients`` arrived for a round."""

    exit_code = 7
    fix = "Fix the rejected tenants and re-run with --resume, or lower min_clients."
    redacted_message = "too few valid updates"


class ModelError(FedtuneError):
    """A model or adapter cannot be built, loaded or mapped."""

    exit_code = 8
    fix = "Check the model section of the job file and the model directory's contents."
    redacted_message = "the tenant's model or adapter cannot be built or loaded"


class RegistryError(FedtuneError):
    """An algorithm name is unknown or registered twice."""

    exit_code = 9
    fix = "Use one of the registered algorithm names (`fedtune algorithms` lists them)."
    redacted_message = "the algorithm name is unknown to the tenant's fedtune"


class TenantStepFailed(FedtuneError):
    """A tenant's step failed in its own pod; the provider knows only its redacted failure."""

    exit_code = 10
    fix = "The tenant reads the full error and its fix in its own pod log."
    redacted_message = "the tenant's step failed"

    def __init__(self, message: str, *, failure: TenantFailure, fix: str | None = None) -> None:
        super().__init__(message, fix=fix, record=failure.record)
        self.failure = failure

    def redacted(self) -> TenantFailure:
        return self.failure


class StopRequested(FedtuneError):
    """SIGTERM or SIGINT stopped the run at a safe point; what finished is stored."""

    exit_code = 143  # 128 + SIGTERM; a SIGINT stop exits 130 (128 + SIGINT)
    fix = "Run the same command with --resume to continue; finished steps are kept."
    redacted_message = "the step was stopped by a signal"

    @classmethod
    def for_signal(cls, signum: int, where: str) -> StopRequested:
        """The error for signal number ``signum``, stopped ``where``."""
        import signal

        name = signal.Signals(signum).name
        exc = cls(f"stopped by {name} {where}; finished steps are kept")
        exc.exit_code = 128 + signum
        return exc


class SecureAggregationError(FedtuneError):
    """A secure-aggregation round cannot go on: too few parties, bad shares, bad encoding."""

    exit_code = 11
    fix = "Read the listed reasons; fix the named tenants or lower secure_aggregation.threshold."
    redacted_message = "the tenant's secure-aggregation step failed"


class PrivacyBudgetError(FedtuneError):
    """Differential privacy cannot go on: the budget is spent, or a round lacks its plan."""

    exit_code = 14
    fix = "Raise differential_privacy.target_epsilon or noise_multiplier, or run fewer rounds."
    redacted_message = "the tenant's differential-privacy step failed"


class RankFailed(FedtuneError):
    """A rank of a multi-rank provider step failed (its error is not a FedtuneError)."""

    exit_code = 15
    fix = (
        "The step's log holds the failing rank's traceback; a rank killed by a signal was "
        "most often out of memory (lower align_batch_size, use ZeRO-3, or add GPUs)."
    )
    redacted_message = "a rank of the provider's step failed"


def error_classes() -> dict[str, type[FedtuneError]]:
    """Every FedtuneError class by name (the kinds a TenantFailure may carry)."""
    found: dict[str, type[FedtuneError]] = {}
    pending: list[type[FedtuneError]] = [FedtuneError]
    while pending:
        cls = pending.pop()
        found[cls.__name__] = cls
        pending.extend(cls.__subclasses__())
    return found


_MAX_FAILURE_BYTES = 4096


@dataclass(frozen=True)
class TenantFailure:
    """What the provider learns of a tenant's failed step: a kind, a record, a fixed text."""

    kind: str
    record: int | None = None

    @property
    def message(self) -> str:
        """The fixed text of the kind (never anything the tenant's step produced)."""
        cls = error_classes().get(self.kind, FedtuneError)
        return cls.redacted_message

    def render(self) -> str:
        """One line for summaries, logs and the KFP UI."""
        where = f" at line {self.record}" if self.record is not None else ""
        return f"{self.kind}{where}: {self.message} (details are in the tenant's own logs)"

    def to_json(self) -> str:
        """The termination message a tenant pod leaves for the launcher."""
        return json.dumps({"kind": self.kind, "record": self.record}, sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> TenantFailure:
        """Strictly parse a termination message; anything unexpected becomes a bare failure.

        Only a known kind and an integer record survive; free text never does.
        """
        try:
            if not text or len(text) > _MAX_FAILURE_BYTES:
                raise ValueError
            data: Any = json.loads(text)
            kind, record = data["kind"], data.get("record")
            if kind not in error_classes() or not (
                record is None or (isinstance(record, int) and not isinstance(record, bool) and record >= 0)
            ):
                raise ValueError
            return cls(kind=kind, record=record)
        except (ValueError, TypeError, KeyError):
            return cls(kind="FedtuneError")
