"""A tiny pipeline whose loop iterations log when they start and end (kfp.local order test).

No ``from __future__ import annotations``: kfp reads the parameter annotations as types.
"""

from kfp import dsl


@dsl.component(install_kfp_package=False)
def stamp(item: int, log: str) -> None:
    """Append ``start ITEM`` and, 0.2 s later, ``end ITEM`` to ``log``."""
    import time

    with open(log, "a") as out:
        out.write(f"start {item} {time.time()}\n")
    time.sleep(0.2)
    with open(log, "a") as out:
        out.write(f"end {item} {time.time()}\n")


@dsl.pipeline(name="ordered-loop")
def ordered(log: str) -> None:
    """Four iterations, one at a time."""
    with dsl.ParallelFor([1, 2, 3, 4], parallelism=1) as item:
        stamp(item=item, log=log).set_caching_options(False)
