"""What a person fills in when creating a pipeline run, and the job it yields.

A compiled family pipeline has no job inside its graph: rounds, tenants and sampling are
decided at run time by the ``server-init`` step from the run form (:class:`RunForm`):

- the job itself, as ``job_uri`` (a job file in the provider's bucket) or ``job_config``
  (JSON or YAML text), ``job_uri`` winning when both are given;
- typed overrides of what people change between runs (rounds, clients per round, learning
  rate, local steps, seed), where 0 (-1 for the seed, which may be 0) keeps the job's value;
- the run's state scope: a fresh run keeps its state under its own KFP run id, so "Create run"
  again trains again; ``resume_run_id`` continues an earlier run's state instead, and
  :data:`JOB_SCOPE` keeps state directly under the job's name as ``fedtune run`` does.

Scoping rewrites every store root of the job (exchange, provider store, each tenant's store)
to ``<root>/runs/<scope>``, so every later step, the tenant launcher and the tenant pods see
the run's own prefixes through the validated job they already read.

The job's ``provider:`` section is the exception: KFP fixes resources and images when the
pipeline is compiled, so a run must ask for what its pipeline was compiled with
(:func:`check_compiled_provider`).

This module does not import kfp: pods read it without paying for it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any

from fedtune.config.capabilities import families
from fedtune.config.job import JobConfig, ProviderResources
from fedtune.core.errors import ConfigError, StoreError

JOB_SCOPE = "job"
"""``resume_run_id`` value that keeps state under the job's name (the local engines' layout)."""

FAMILIES: dict[str, tuple[str, ...]] = families()
"""Which algorithms each family's compiled pipeline runs (one pipeline per family), from each
algorithm's declared ``capabilities.family``."""

PROVIDER_ENV = "FEDTUNE_PIPELINE_PROVIDER"
"""Variable of the compiled ``server-init`` task: the ``provider:`` section the pipeline was
compiled with, as JSON (absent: the default, no provider resources)."""

_SCOPE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def family_of(algorithm: str) -> str:
    """The family whose pipeline runs ``algorithm``.

    Raises:
        ConfigError: No family pipeline runs it.
    """
    for family, names in FAMILIES.items():
        if algorithm in names:
            return family
    raise ConfigError(
        f"no compiled pipeline family runs algorithm {algorithm!r}",
        fix=f"Use one of the families {sorted(FAMILIES)} or the local engine.",
    )


@dataclass(frozen=True)
class RunForm:
    """The pipeline parameters of one run (see the family pipeline's docstring for each)."""

    job_uri: str = ""
    job_config: str = ""
    rounds: int = 0
    clients_per_round: int = 0
    lr: float = 0.0
    local_steps: int = 0
    seed: int = -1
    run_label: str = ""
    resume_run_id: str = ""
    kfp_run_id: str = ""
    stop_after_round: int = 0

    @property
    def scope(self) -> str:
        """The prefix this run's state lives under (``JOB_SCOPE``: none).

        Raises:
            ConfigError: Neither a resume id nor the KFP run id is a usable prefix.
        """
        scope = self.resume_run_id.strip() or self.kfp_run_id.strip()
        if not _SCOPE.match(scope):
            raise ConfigError(
                f"resume_run_id {self.resume_run_id!r} (KFP run id {self.kfp_run_id!r}) is not "
                "a run id: 1-64 letters, digits, '.', '_' or '-'",
                fix="Leave resume_run_id empty for a new training, or paste the id of the run "
                "to resume from its run page.",
            )
        return scope

    def overrides(self) -> dict[str, Any]:
        """The job fields the form sets (its sentinels left out)."""
        out: dict[str, Any] = {}
        if self.rounds:
            out["rounds"] = int(self.rounds)
        if self.clients_per_round:
            out["clients_per_round"] = int(self.clients_per_round)
        if self.seed != -1:
            out["seed"] = int(self.seed)
        training: dict[str, Any] = {}
        if self.lr:
            training["lr"] = float(self.lr)
        if self.local_steps:
            training["local_steps"] = int(self.local_steps)
            training["local_epochs"] = None  # exactly one of the two may be set
        if training:
            out["training"] = training
        return out


def _read_source(form: RunForm) -> tuple[str, str]:
    """The job's text and where it came from."""
    if form.job_uri.strip():
        from fedtune.storage import read_object

        uri = form.job_uri.strip()
        if not uri.startswith("s3://") and "://" in uri:
            raise ConfigError(
                f"job_uri {uri!r} is not an s3:// URI or a path",
                fix="Upload the job file to the provider's bucket and give its s3:// URI.",
            )
        try:
            return read_object(uri).decode("utf-8"), f"job_uri {uri}"
        except UnicodeDecodeError:
            raise ConfigError(f"job_uri {uri}: the job file is not UTF-8 text") from None
        except StoreError as exc:
            raise ConfigError(
                f"job_uri {uri}: cannot read the job file: {exc}",
                fix="Upload the job file there (`aws s3 cp JOB.yaml URI`), or correct job_uri.",
            ) from None
    if form.job_config.strip():
        return form.job_config, "job_config parameter"
    raise ConfigError(
        "the run form gives no job: both job_uri and job_config are empty",
        fix="Set job_uri to the s3:// URI of a job file in the provider's bucket, or paste the "
        "job as JSON into job_config (`fedtune compile JOB.yaml` fills it in as a default).",
    )


def _merge(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(raw)
    for key, value in overrides.items():
        out[key] = _merge(dict(out.get(key) or {}), value) if isinstance(value, dict) else value
    return out


def scoped(job: JobConfig, scope: str) -> JobConfig:
    """``job`` with every store root moved under ``runs/<scope>`` (:data:`JOB_SCOPE`: as is)."""
    if scope == JOB_SCOPE:
        return job
    workdir = job.workdir.rstrip("/")

    def under(root: str | None, default: str) -> str:
        return f"{(root or default).rstrip('/')}/runs/{scope}"

    tenants = [
        t.model_copy(update={"store_uri": under(t.store_uri, f"{workdir}/tenants/{t.name}")})
        for t in job.tenants
    ]
    return job.model_copy(
        update={
            "exchange_uri": under(job.exchange_uri, f"{workdir}/exchange"),
            "provider_store_uri": under(job.provider_store_uri, f"{workdir}/provider"),
            "tenants": tenants,
        }
    )


def provider_marker(provider: ProviderResources) -> str:
    """The :data:`PROVIDER_ENV` value of a pipeline compiled with ``provider`` ("" for the
    default, which the compiled pipeline leaves unmarked)."""
    values = provider.model_dump(mode="json", exclude_defaults=True)
    return json.dumps(values, sort_keys=True) if values else ""


def compiled_provider(marker: str | None = None) -> ProviderResources:
    """The provider section this pipeline was compiled with (``marker`` defaults to
    :data:`PROVIDER_ENV` of this process, the ``server-init`` pod)."""
    marker = os.environ.get(PROVIDER_ENV, "") if marker is None else marker
    return ProviderResources.model_validate(json.loads(marker) if marker else {})


def check_compiled_provider(job: JobConfig, source: str, marker: str | None = None) -> None:
    """Refuse a job whose ``provider:`` section differs from the compiled pipeline's.

    ``marker`` defaults to :data:`PROVIDER_ENV` of this process (the ``server-init`` pod).

    Raises:
        ConfigError: The job asks for other provider resources than the pipeline gives.
    """
    compiled = compiled_provider(marker)
    if job.provider == compiled:
        return
    wanted = job.provider.model_dump(mode="json", exclude_defaults=True)
    given = compiled.model_dump(mode="json", exclude_defaults=True)
    raise ConfigError(
        f"{source}: the job's provider section {json.dumps(wanted, sort_keys=True)} differs "
        f"from the one this pipeline was compiled with ({json.dumps(given, sort_keys=True)}); "
        "provider resources, placement and image are fixed when a pipeline is compiled, so "
        "this run would not get what the job asks for",
        fix="Compile the pipeline from this job (`fedtune compile JOB.yaml -o PIPELINE.yaml`, "
        "or `fedtune submit JOB.yaml`) and run that, or give the job the compiled provider "
        "section.",
    )


def pipeline_name(family: str, secure: bool = False, gpu: bool = False) -> str:
    """The name of a family's compiled pipeline (``secure``: its secure-aggregation variant;
    ``gpu``: its heavy provider steps ask for GPUs)."""
    return f"fedtune-{family}" + ("-secure" if secure else "") + ("-gpu" if gpu else "")


def check_variant(job: JobConfig, family: str, secure: bool, source: str = "the job") -> None:
    """Refuse a job whose ``secure_aggregation.enabled`` does not match the pipeline variant.

    A secure round has more steps than a plain one, so each variant is its own compiled
    pipeline; the run form takes the job at run time, hence this check when the run starts.

    Raises:
        ConfigError: Naming the pipeline that runs the job.
    """
    wanted = job.secure_aggregation.enabled
    if wanted == secure:
        return
    has = "sets secure_aggregation.enabled: true" if wanted else "does not enable secure_aggregation"
    runs = "secure-aggregation rounds" if secure else "rounds without secure aggregation"
    gpu = compiled_provider().gpu > 0  # name the GPU variants on a GPU variant
    raise ConfigError(
        f"{source} {has}, but the {pipeline_name(family, secure, gpu)!r} pipeline runs {runs}",
        fix=f"Create the run with the {pipeline_name(family, wanted, gpu)!r} pipeline (`fedtune "
        "compile JOB.yaml` compiles the right one for a job), or change "
        "secure_aggregation.enabled in the job.",
    )


def resolve_job(form: RunForm, family: str, secure: bool = False) -> JobConfig:
    """The job a run trains: read, overridden, validated, checked against ``family``, the
    pipeline variant (``secure``) and the compiled provider section, scoped.

    Raises:
        ConfigError: No job, an unreadable or invalid one (every problem listed), an override
            the job refuses, a job of another family or of the other variant, or one whose
            provider resources differ from the compiled pipeline's.
    """
    from fedtune.config.loading import parse_job_text

    text, source = _read_source(form)
    base = parse_job_text(text, source=source)  # the job's own problems, reported as such
    overrides = form.overrides()
    job = base
    if overrides:
        raw = _merge(base.model_dump(mode="json", exclude_unset=True), overrides)
        from fedtune.config import parse_job

        job = parse_job(raw, source=f"{source} with the run form's overrides {json.dumps(overrides)}")
    if job.algorithm.name not in FAMILIES.get(family, ()):
        raise ConfigError(
            f"{source}: algorithm {job.algorithm.name!r} does not belong to the {family!r} "
            f"pipeline, which runs {list(FAMILIES.get(family, ()))}",
            fix=f"Run it with the {family_of(job.algorithm.name)!r} pipeline instead.",
        )
    check_variant(job, family, secure, source)
    check_compiled_provider(job, source)
    if form.stop_after_round < 0:
        raise ConfigError(
            f"stop_after_round is {form.stop_after_round}",
            fix="Leave it at 0 to train to the end, or give the round after which to stop.",
        )
    return scoped(job, form.scope)


def open_rounds(done: list[bool], stop_after: int) -> list[int]:
    """The rounds a run still has to train: from the first not done, up to ``stop_after``
    (0: the last). Never empty (kfp.local cannot loop over nothing): when every round is done
    it is the last one, whose steps then find their output stored and skip."""
    last = len(done) if not stop_after else min(stop_after, len(done))
    first = next((i + 1 for i, d in enumerate(done[:last]) if not d), last)
    return list(range(first, last + 1))
