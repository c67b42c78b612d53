"""The drain on SIGTERM / SIGINT: stop taking requests, let the accepted ones finish for a while, end the rest cleanly.

Why: uvicorn's graceful shutdown waits for open connections up to its own
timeout and then cancels the request tasks: a non-streaming request then got
uvicorn's `500 text/plain`, a stream stopped mid-transfer without an error event
or `[DONE]`, and the log filled with `CancelledError` tracebacks. So the server
ends its own work first, through the scheduler, where every job has a clean
ending (`CancelledEvent`, which the routes turn into OpenAI's `shutting_down`
error), and gives uvicorn a deadline that comes only after that.

Invariants:
- from the first signal on, a new request is refused with 503 `shutting_down`
  (and `Retry-After`); requests already accepted, running or queued, go on;
- `timeout_s` after the signal every job still waiting or running is cancelled,
  so a non-streaming request gets a JSON 503 and a stream a final error event
  then `data: [DONE]`; uvicorn's own deadline (`uvicorn_timeout_s`) is
  DRAIN_GRACE_S later, so those replies are written before it cancels anything;
- the signal handler only flips a flag and starts a thread (nothing in it can
  block on a lock the interrupted code holds); a second signal is uvicorn's
  (SIGINT twice: force quit);
- a SIGTERM shutdown that went through ends the process with status 0.
"""

from __future__ import annotations

import logging
import threading
from types import FrameType
from typing import Any

import uvicorn

from specdec.serve.scheduler import Scheduler

log = logging.getLogger("specdec.server")
DRAIN_GRACE_S = 10.0  # after the cancellation: time for the last replies to be written


def uvicorn_timeout_s(timeout_s: float) -> int:
    """uvicorn's graceful-shutdown deadline for a drain of `timeout_s` (whole seconds, as it wants)."""
    return max(1, round(timeout_s + DRAIN_GRACE_S))


class Drain:
    """Started once (by the first signal): refuse new jobs, wait up to timeout_s, cancel what is left."""

    def __init__(self, scheduler: Scheduler, timeout_s: float) -> None:
        self.scheduler = scheduler
        self.timeout_s = timeout_s
        self.started = False
        self._thread = threading.Thread(target=self._run, name="specdec-drain", daemon=True)

    def start(self) -> None:
        if not self.started:
            self.started = True
            self._thread.start()

    def join(self, timeout_s: float) -> None:
        if self.started:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        self.scheduler.stop_accepting()
        if self.scheduler.wait_idle(self.timeout_s):
            return
        left = self.scheduler.cancel_all()
        if left:
            log.warning("shutting down: %d request(s) still running after %g s were ended", left, self.timeout_s)


class DrainingServer(uvicorn.Server):
    """uvicorn's server whose exit signal also starts the scheduler's drain."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.start()
        super().handle_exit(sig, frame)


def exit_cleanly(signum: int, frame: Any) -> None:
    """SIGTERM outside uvicorn's own handling: the server has shut down (or has not started): exit 0.

    uvicorn handles SIGTERM itself, then restores the handler it found and raises the signal again;
    with the default handler that ends the process with 143, which supervisors read as "killed".
    """
    raise SystemExit(0)
