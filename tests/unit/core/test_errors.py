"""Every user-facing error class has its own exit code and a one-line fix."""

from __future__ import annotations

from fedtune.core import errors


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def test_every_error_has_a_fix_and_its_own_exit_code() -> None:
    classes = [errors.FedtuneError, *_subclasses(errors.FedtuneError)]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes), f"shared exit codes: {codes}"
    for cls in classes:
        assert cls.fix and cls.fix.endswith("."), cls
        assert cls.exit_code not in (0, 130)


def test_render_shows_message_and_fix() -> None:
    exc = errors.DataError("bad line 3", fix="Fix line 3.")
    assert exc.render() == "error: bad line 3\nfix: Fix line 3."
