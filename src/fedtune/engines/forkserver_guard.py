"""The worker fork server's first import: from then on it ends when the engine dies.

Imported only by the fork server (first in ``workers._PRELOAD``), so the watch starts
before the seconds it spends importing torch; see :mod:`fedtune.engines.parent_death`.
"""

from __future__ import annotations

from fedtune.engines.parent_death import exit_when_orphaned

exit_when_orphaned()
