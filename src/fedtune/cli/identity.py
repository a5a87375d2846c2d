"""``fedtune identity``: a tenant's long-term secure-aggregation identity key.

Run by (or for) the tenant: it keeps the private key in the tenant's own store and prints the
public key, which the platform registers out of band as ``tenants[].identity_key``.
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console

from fedtune.config import load_job
from fedtune.core.errors import ConfigError

out = Console(highlight=False)


def _identity(args: argparse.Namespace) -> int:
    from fedtune.engines import layout
    from fedtune.secagg import identity

    job = load_job(args.job)
    tenant = next((t for t in job.tenants if t.name == args.tenant), None)
    if tenant is None:
        raise ConfigError(
            f"no tenant named {args.tenant!r} in job {job.name!r}",
            fix=f"Use one of {sorted(t.name for t in job.tenants)}.",
        )
    store = layout.JobStores(job).tenant(tenant)
    if store.exists(identity.STORE_KEY):
        public = identity.public_of(bytes.fromhex(store.get_json(identity.STORE_KEY)["private"]))
        made = "kept"
    else:
        private, public = identity.generate()
        store.put_json(identity.STORE_KEY, {"private": private.hex()})
        made = "created"
    if tenant.identity_key not in (None, public.hex()):
        raise ConfigError(
            f"tenant {tenant.name!r}'s key in its store ({public.hex()}) is not the registered "
            f"identity_key ({tenant.identity_key})",
            fix="Register the printed key in the tenant's entry, or restore the tenant's key file "
            f"{identity.STORE_KEY} in its store.",
        )
    out.print(f"{made} {store.uri}/{identity.STORE_KEY} (private; stays in the tenant's store)")
    out.print(f"register in the tenant entry of {tenant.name}:\n  identity_key: {public.hex()}")
    return 0


def register_identity(sub: Any) -> None:
    p = sub.add_parser(
        "identity",
        help="create or show a tenant's secure-aggregation identity key",
        description="Make sure TENANT has an Ed25519 identity key in its own store (created "
        "once, kept after) and print the public key to register as tenants[].identity_key: "
        "with it every tenant verifies the signed keys the provider routes.",
    )
    p.add_argument("job", help="path of the job YAML file")
    p.add_argument("--tenant", required=True, help="the tenant's name")
    p.set_defaults(handler=_identity)
