"""Tenant, secure-aggregation round: answer the round's unmasking request (a seed share or a key share per dealer).

``python -m fedtune.entrypoints.secagg_unmask --job JOB.yaml --round N --tenant NAME`` runs it
in this process; a launched tenant pod adds ``--presigned`` (see
:mod:`fedtune.entrypoints.client_step`, whose command line it shares). The step itself is
:func:`fedtune.engines.tenant.secagg.unmask_step`.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedtune.entrypoints import client_step, common


def main(argv: Sequence[str] | None = None) -> None:
    """Command line of the step."""
    common.run_main(
        lambda a: client_step.parse(a, __doc__.splitlines()[0], "secagg_unmask"),
        lambda args: client_step.body(args, "secagg-unmask"),
        argv,
    )


if __name__ == "__main__":
    main()
