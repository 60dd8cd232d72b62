"""`GatewayProcess`: `swarm-api` as a child process (make chat, benchmarks, tests).

Started from this interpreter (`python -m client.api.cli`, no PATH lookup) on `--port 0` by
default; the URL comes from its machine-readable stdout line. `stop()` sends SIGTERM (the
clean path exits 0), kills it after a timeout, and kills any helper it left (its DHT child, p2pd).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from swarm.launcher import launched_env

START_TIMEOUT = 180.0  # seconds: loading the head, joining the DHT (slow on a busy machine)


class GatewayProcess:
    def __init__(self, model: Path, initial_peer: str, log_path: Path, *extra: str, port: int = 0,
                 env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "client.api.cli", "--model", str(model), "--initial-peers", initial_peer,
             "--port", str(port), *extra],
            stdout=subprocess.PIPE, stderr=open(log_path, "w"), stdin=subprocess.DEVNULL,  # noqa: SIM115
            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1", **launched_env(), **(env or {})),
            start_new_session=True,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        try:
            line = lines.get(timeout=START_TIMEOUT)
        except queue.Empty:
            line = None
        if not line or not line.startswith("api: http://"):
            self.stop()
            raise RuntimeError(f"swarm-api did not start (stdout: {line!r}); its log:\n{self.log_tail()}")
        self.url = line.split()[1].rstrip("/")

    def _pump(self, lines: queue.Queue[str | None]) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            lines.put(line)
        lines.put(None)  # it exited

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait; the exit code, or None when it had to be killed."""
        try:
            helpers = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            helpers = []
        code: int | None = None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for helper in helpers:
            with contextlib.suppress(psutil.NoSuchProcess):
                helper.kill()
        return code
