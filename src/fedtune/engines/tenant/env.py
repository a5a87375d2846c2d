"""A tenant's side of a job in this process: its env (view, context, stores, data).

:class:`TenantEnv` is what every tenant step receives; it is built from the tenant's view of
the job (:class:`~fedtune.config.tenant_view.TenantJob`) and holds nothing else of the job.
:class:`TenantEnvs` is the local engine's set of simulated tenants. Importing this module
imports no torch.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.algorithms.registry import get_algorithm
from fedtune.config.job import JobConfig, TenantConfig
from fedtune.core.errors import ConfigError, FedtuneError, StoreError
from fedtune.data.loader import read_examples
from fedtune.engines import layout
from fedtune.storage.base import Store
from fedtune.training.context import SharedBase, TenantContext, TenantData, split_examples
from fedtune.training.progress import ProgressHook

if TYPE_CHECKING:
    from fedtune.algorithms.base import Algorithm
    from fedtune.config.tenant_view import TenantJob

log = logging.getLogger(__name__)


@dataclass
class TenantEnv:
    """One tenant's side of a job: its view, context, exchange prefix, own store and data.

    ``job`` is the tenant's view (:class:`~fedtune.config.tenant_view.TenantJob`), never the
    provider's job: nothing here reaches the provider's model, stores or other tenants. The
    exchange store is confined to the tenant's prefix.
    """

    job: TenantJob
    algorithm: Algorithm[Any]
    tenant: TenantConfig
    ctx: TenantContext
    exchange: Store
    own: Store
    _data: TenantData | None = field(default=None, repr=False)

    @classmethod
    def create(
        cls,
        source: TenantJob | JobConfig,
        tenant_name: str | None = None,
        *,
        exchange: Store | None = None,
        shared: SharedBase | None = None,
    ) -> TenantEnv:
        """The env of the tenant whose view ``source`` is; ``exchange`` replaces its exchange
        prefix (a launched pod's mirror).

        Given the provider's job instead (the engines that simulate tenants in this process),
        the provider first builds ``tenant_name``'s view (:func:`layout.view_for`), and the
        env holds only that.

        Raises:
            ConfigError: No tenant of that name, or a view without an exchange prefix and
                no ``exchange`` given.
        """
        from fedtune.config.tenant_view import TenantJob
        from fedtune.storage import open_store
        from fedtune.storage.s3 import S3Bounds

        if isinstance(source, TenantJob):
            view = source
        else:
            view = layout.view_for(source, tenant_name or "")
        bounds = S3Bounds.of(view.limits)
        if exchange is None:
            if view.exchange_uri is None:
                raise ConfigError(
                    f"tenant {view.name!r}: its view names no exchange prefix",
                    fix="A launched pod reaches the exchange through pre-signed URLs (--presigned).",
                )
            exchange = open_store(view.exchange_uri, bounds=bounds)
        algorithm = get_algorithm(view.algorithm.name)(view.algorithm)
        return cls(
            job=view,
            algorithm=algorithm,
            tenant=view.tenant,
            ctx=TenantContext.of_view(view, shared),
            exchange=exchange,
            own=open_store(view.store_uri, bounds=bounds).child(f"jobs/{view.job_name}"),
        )

    def data(self) -> TenantData:
        """The tenant's examples, read from its own data URI and split (cached)."""
        if self._data is None:
            fmt = None if self.tenant.data_format == "auto" else self.tenant.data_format
            examples = read_examples(
                self.tenant.data_uri, fmt, limits=self.job.limits, named="data_uri"
            )
            self._data = split_examples(
                examples, self.job.training.eval_fraction, self.job.seed, self.tenant.name
            )
        return self._data


class TenantEnvs:
    """The env of whichever tenant one process serves now (the local engine's simulated
    tenants, in the engine itself or in a worker).

    The provider builds each tenant's view; an env holds only its own. One tenant at a time:
    looking up another tenant drops the previous tenant's env (its data, its encodings, its
    context) and has the shared things wipe what that tenant left in them
    (:meth:`SharedBase.serve`). What is shared across tenants is only what every tenant may
    read anyway: the tenant-readable frozen base model, its tokenizer, its LoRA wrapper reset
    to the seeded initial adapter, and a public set the algorithm shares with tenants.
    """

    def __init__(self, source: JobConfig | Mapping[str, TenantJob]) -> None:
        if isinstance(source, JobConfig):
            self.views = {t.name: layout.view_for(source, t.name) for t in source.tenants}
        else:
            self.views = dict(source)
        self._shared = SharedBase()
        self._env: TenantEnv | None = None
        self._progress: ProgressHook | None = None

    @property
    def names(self) -> list[str]:
        """The tenants, in the job's order."""
        return list(self.views)

    def __getitem__(self, name: str) -> TenantEnv:
        if self._env is None or self._env.tenant.name != name:
            if name not in self.views:
                raise ConfigError(
                    f"no tenant named {name!r} in this job",
                    fix=f"Use one of {sorted(self.views)}.",
                )
            self._env = None  # the previous tenant's env goes before the next one's is built
            self._shared.serve(name)
            self._env = TenantEnv.create(self.views[name], shared=self._shared)
            if self._progress is not None:
                self._env.ctx.progress = self._progress
        return self._env

    def release(self) -> None:
        """Keep nothing of the tenant served last (a step ended) that its next step does not
        need: drop its env, reset the adapters it trained (its own model, FedMKT's, stays
        until another tenant is served). The next lookup builds its env anew; results do not
        change."""
        self._env = None
        self._shared.serve(None)

    def show_progress(self, hook: ProgressHook) -> None:
        """Show long work inside every tenant's step with ``hook`` (the engine's bars)."""
        self._progress = hook
        if self._env is not None:
            self._env.ctx.progress = hook


def keep_failure_details(env: TenantEnv, tag: str, exc: FedtuneError) -> str:
    """Store the full error (which may quote records) in the tenant's private store.

    The tenant reads it there; the provider gets only ``exc.redacted()``. Returns its URI.
    """
    key = f"errors/{tag}.txt"
    try:
        env.own.put_bytes(key, exc.render().encode("utf-8"))
    except StoreError:
        # The tenant's store is what failed (an outage). The details stay on the tenant's
        # side: a file only this process's user can read (in a launched pod, the pod's
        # scratch), never a log line, which an in-process provider step would read.
        return _keep_locally(env.tenant.name, tag, exc)
    return f"{env.own.uri.rstrip('/')}/{key}"


def _keep_locally(tenant: str, tag: str, exc: FedtuneError) -> str:
    """Write the full error to ``$TMPDIR/fedtune-tenant-errors/<tenant>/<tag>.txt`` (0600)."""
    folder = Path(tempfile.gettempdir()) / "fedtune-tenant-errors" / tenant
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = folder / f"{tag}.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(exc.render())
    return f"the tenant's local file {path} (its store did not take them)"
