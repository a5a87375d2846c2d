"""Which tenant-step failures the launched Job retries: outages and evictions, never errors
that a second pod would meet again (the cluster tests run this policy on the Job controller)."""

from __future__ import annotations

from fedtune.core.errors import (
    ConfigError,
    DataError,
    FedtuneError,
    IntegrityError,
    StopRequested,
    StoreUnavailable,
    error_classes,
)
from fedtune.engines.launcher_manifest import permanent_exit_codes, pod_failure_policy


def test_every_fedtune_error_but_crashes_outages_and_stops_fails_the_job_at_once() -> None:
    retried = {FedtuneError, StoreUnavailable, StopRequested}
    expected = {c.exit_code for c in error_classes().values() if c not in retried}
    assert set(permanent_exit_codes()) == expected - {c.exit_code for c in retried}
    assert {ConfigError.exit_code, DataError.exit_code, IntegrityError.exit_code} <= set(
        permanent_exit_codes()
    )
    for code in (FedtuneError.exit_code, StoreUnavailable.exit_code, 137, 143):
        assert code not in permanent_exit_codes()


def test_the_policy_names_the_container_and_ignores_disruptions() -> None:
    fail, ignore = pod_failure_policy("tenant-step")["rules"]
    assert fail["action"] == "FailJob" and fail["onExitCodes"]["containerName"] == "tenant-step"
    assert fail["onExitCodes"]["values"] == sorted(set(fail["onExitCodes"]["values"]))
    assert 0 not in fail["onExitCodes"]["values"]  # the API server refuses 0 with In
    disrupted = [{"type": "DisruptionTarget", "status": "True"}]
    assert ignore == {"action": "Ignore", "onPodConditions": disrupted}
