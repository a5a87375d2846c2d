"""Route the chatter of DeepSpeed and MLflow into fedtune's log at DEBUG level.

Both libraries give their loggers handlers of their own (DeepSpeed's writes to stdout, so
its "Setting accelerator to CPU" notice lands in the middle of the result table). Their
loggers are made here, before the libraries import, of a class that ignores the handlers a
library adds and passes each record on at DEBUG: ``fedtune -v`` shows them, nothing else does.
Progress bars of the libraries are switched off the same way, through their settings.
"""

from __future__ import annotations

import logging
import os
import warnings

#: Library loggers whose records go to the log at DEBUG.
LIBRARY_LOGGERS = ("DeepSpeed", "mlflow")
#: Environment settings that turn library progress bars off (unless the user set them).
QUIET_ENV = {
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    # MLflow 3 reports usage to config.mlflow-telemetry.io unless told not to.
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}
_TARGET = "fedtune.library"


class _ToDebug(logging.Handler):
    """Passes a library's record on to fedtune's log, demoted to DEBUG."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger(_TARGET)
        if target.isEnabledFor(logging.DEBUG):
            demoted = logging.makeLogRecord(record.__dict__)
            demoted.levelno, demoted.levelname = logging.DEBUG, "DEBUG"
            target.handle(demoted)


_ROUTER = _ToDebug()


class _DebugOnly(logging.Logger):
    """A library's logger whose only handler is :data:`_ROUTER`, whatever the library sets.

    Its children's records (``mlflow.store...``) stop here too: it never propagates.
    """

    @property
    def handlers(self) -> list[logging.Handler]:
        return [_ROUTER]

    @handlers.setter
    def handlers(self, value: list[logging.Handler]) -> None:
        pass

    @property
    def propagate(self) -> bool:
        return False

    @propagate.setter
    def propagate(self, value: bool) -> None:
        pass

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 (logging's name)
        """Ignore the library's own handler."""

    def removeHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802
        """Keep the router."""


#: Warnings one library raises about another's use of it, which no fedtune user can act on.
LIBRARY_WARNINGS = (
    # peft 0.21 reads transformers 5's deprecated attribute on every get_peft_model.
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)


def quiet_libraries() -> None:
    """Install the DEBUG routing for :data:`LIBRARY_LOGGERS` and switch library bars off."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    for category, message in LIBRARY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    for name in LIBRARY_LOGGERS:
        existing = logging.Logger.manager.loggerDict.get(name)
        if isinstance(existing, logging.Logger):
            if not isinstance(existing, _DebugOnly):
                existing.__dict__.pop("handlers", None)
                existing.__dict__.pop("propagate", None)
                existing.__class__ = _DebugOnly
            continue
        previous = logging.getLoggerClass()
        logging.setLoggerClass(_DebugOnly)
        try:
            logging.getLogger(name)
        finally:
            logging.setLoggerClass(previous)
    logging.getLogger(_TARGET).setLevel(logging.NOTSET)
