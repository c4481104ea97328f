"""server.py with an injected engine-thread death: once the file named by
$LLAMASERVE_KILL_ENGINE exists, the scheduler raises inside the engine loop (not inside a
step, which would only fail that step's requests), so the thread dies mid-generation."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.scheduler import Scheduler  # noqa: E402

TRIGGER = os.environ["LLAMASERVE_KILL_ENGINE"]
_schedule = Scheduler.schedule


def schedule(self: Scheduler) -> Any:
    if os.path.exists(TRIGGER):
        raise RuntimeError("injected engine thread death")
    return _schedule(self)


Scheduler.schedule = schedule  # type: ignore[method-assign]

if __name__ == "__main__":
    import server

    sys.exit(server.main())
