"""Every user-facing error class has its own exit code and a one-line fix."""

from __future__ import annotations

import importlib
import pkgutil

import fedtune
from fedtune.core import errors

#: Modules whose import is an action, meant for one process only: the worker fork server's
#: guard starts a watch that ends the importing process once its engine is gone.
_ACTS_ON_IMPORT = frozenset({"fedtune.engines.forkserver_guard"})


def _import_every_module() -> None:
    """An error class defined anywhere in the package counts, not only the ones some earlier
    test happened to import (a subclass elsewhere once shared DataError's exit code)."""
    for module in pkgutil.walk_packages(fedtune.__path__, "fedtune."):
        if module.name in _ACTS_ON_IMPORT:
            continue
        try:
            importlib.import_module(module.name)
        except ImportError:  # an optional extra (deepspeed, liger-kernel) that is not installed
            continue


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_error_has_a_fix_and_its_own_exit_code() -> None:
    _import_every_module()
    classes = [errors.FedtuneError, *_subclasses(errors.FedtuneError)]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes), f"shared exit codes: {codes}"
    for cls in classes:
        assert cls.fix and cls.fix.endswith("."), cls
        assert cls.exit_code not in (0, 130)


def test_render_shows_message_and_fix() -> None:
    exc = errors.DataError("bad line 3", fix="Fix line 3.")
    assert exc.render() == "error: bad line 3\nfix: Fix line 3."
