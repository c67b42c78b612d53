"""Run `specdec serve` in a child process on a loopback port: start, wait until healthy, stop.

Why: tests and benchmarks must talk to a real server process (real sockets, real
uvicorn, real signal handling), and must never leave one behind. This is the
one place that knows how to start one and how to end it.

Invariants:
- the server listens on 127.0.0.1 (never another interface) on a port that was
  free when it was picked;
- every wait is bounded: `wait_ready` gives up after its timeout (or as soon as
  the child exits) with the tail of the child's log in the error;
- `stop` sends SIGTERM (graceful: uvicorn drains, the scheduler stops), then
  SIGKILL if the child is still alive after its timeout; it is idempotent;
- the child's output goes to a log file, never to a pipe that could fill up.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

LOOPBACK = "127.0.0.1"
POLL_S = 0.5
LOG_TAIL_CHARS = 3000


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """One `python -m specdec.cli serve ...` child process."""

    def __init__(self, serve_args: Sequence[str], log_path: str | Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log_path = Path(log_path)
        self.command = [
            sys.executable, "-m", "specdec.cli", "serve",
            "--host", LOOPBACK, "--port", str(self.port), *serve_args,
        ]  # fmt: skip
        self.process: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        return self

    def health(self, timeout_s: float = 5.0) -> dict | None:
        """The /health body, or None when the server does not answer."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=timeout_s) as response:
                return json.loads(response.read())
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def wait_ready(self, timeout_s: float = 300.0) -> ServerProcess:
        """Block until /health answers; raise (with the log's tail) on timeout or if the child exits."""
        if self.process is None:
            raise RuntimeError("start() the server first")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")
            if self.health() is not None:
                return self
            time.sleep(POLL_S)
        raise TimeoutError(f"the server was not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def terminate(self) -> None:
        """Ask for a graceful shutdown (SIGTERM) without waiting."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit status."""
        if self.process is None:
            return None
        self.terminate()
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout_s)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"


@contextmanager
def running_server(
    serve_args: Sequence[str], log_path: str | Path, ready_timeout_s: float = 300.0
) -> Iterator[ServerProcess]:
    """A started, healthy server that is stopped on exit, whatever happens inside."""
    server = ServerProcess(serve_args, log_path).start()
    try:
        yield server.wait_ready(ready_timeout_s)
    finally:
        server.stop()
