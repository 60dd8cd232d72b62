"""A swarm of real `swarm-peer` processes on this machine, for `make demo`, benchmarks and tests.

`LocalSwarm` starts a bootstrap DHT (`swarm-peer dht`) and peers (`swarm-peer serve`), waits for
their machine-readable stdout lines, and kills every process it started when closed. Each
process's stderr goes to a log file in `log_dir`; failures print its tail. Processes are stopped
by their pid (and their helper processes by pid too), never by name, and the unix sockets a killed
one leaves in the temp folder (hivemind's, multiprocessing's, torch's) are removed after it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from swarm.launcher import launched_env

__all__ = ["LocalSwarm", "SwarmProcess"]

START_TIMEOUT = 90.0  # seconds; a peer loads weights, joins the DHT and measures itself
# Unix sockets a process and its helpers listen on in the temp folder, which their own exit removes and a kill
# leaves behind: p2pd's and hivemind's control sockets, multiprocessing's and torch's listeners (in folders).
LEFT_BY_A_KILL = re.compile(r"hivemind-p2p(d|client)-[\w-]+\.sock|pymp-\w+/listener-\w+|torch-shm-dir-\w+/manager\.sock")


def listening_sockets(processes: list[psutil.Process]) -> list[Path]:
    """The unix sockets in the temp folder that `processes` listen on and a kill would leave (LEFT_BY_A_KILL)."""
    temp = Path(tempfile.gettempdir())
    sockets = set()
    for process in processes:
        try:
            listening = process.net_connections(kind="unix")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for connection in listening:
            path = Path(connection.laddr) if isinstance(connection.laddr, str) and connection.laddr else None
            if path is not None and path.is_relative_to(temp) and \
                    LEFT_BY_A_KILL.fullmatch(path.relative_to(temp).as_posix()):
                sockets.add(path)
    return sorted(sockets)


@dataclass
class Remains:
    """What a stopped process may leave: its helper processes (DHT child, p2pd) and unix sockets."""

    helpers: list[psutil.Process]
    sockets: list[Path]

    def clear(self) -> None:
        """Kill the helpers still alive and remove the sockets (and their folder, once empty)."""
        for helper in self.helpers:
            with contextlib.suppress(psutil.Error):
                helper.kill()
        temp = Path(tempfile.gettempdir())
        for socket in self.sockets:
            with contextlib.suppress(OSError):
                socket.unlink()
            if socket.parent != temp:
                with contextlib.suppress(OSError):
                    socket.parent.rmdir()  # only when empty


@dataclass
class SwarmProcess:
    proc: subprocess.Popen
    log_path: Path
    lines: list[str] = field(default_factory=list)
    peer_id: str = ""
    _queue: queue.Queue = field(default_factory=queue.Queue)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def maddrs(self) -> list[str]:
        return [line for line in self.lines if line.startswith("/")]

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for_line(self, prefix: str, timeout: float = START_TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=min(1.0, max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if line is None:
                raise RuntimeError(f"process exited (code {self.proc.wait()}) before printing {prefix!r}:\n{self.log_tail()}")
            self.lines.append(line)
            if line.startswith(prefix):
                return line
        raise TimeoutError(f"no {prefix!r} line within {timeout} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-n:]) or "(no log)"

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        remains = self.remains()
        self.terminate()
        return self._reap(remains, timeout)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: a peer drains, announces OFFLINE and exits) without waiting."""
        if self.proc.poll() is None:
            self.signal(signal.SIGCONT)  # a paused process cannot handle SIGTERM
            self.signal(signal.SIGTERM)

    def _reap(self, remains: Remains, timeout: float) -> int:
        """Wait up to `timeout` s for the exit (SIGKILL after), then clear what it left behind."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        remains.clear()  # whatever the clean exit did not take down
        return code

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def remains(self) -> Remains:
        """Its helpers and the sockets they all listen on, read while they live (a kill leaves them)."""
        helpers = self.descendants()
        processes = list(helpers)
        with contextlib.suppress(psutil.NoSuchProcess):  # our child: its pid stays ours until we wait on it
            processes.insert(0, psutil.Process(self.proc.pid))
        return Remains(helpers, listening_sockets(processes))

    def kill(self) -> None:
        """kill -9 the peer and its helpers (DHT child, p2pd): a machine that vanished."""
        remains = self.remains()
        self.signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        remains.clear()


class LocalSwarm:
    def __init__(self, log_dir: Path, extra_env: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.extra_env = extra_env or {}
        self.processes: list[SwarmProcess] = []
        self.initial_peers: list[str] = []

    def spawn(self, args: list[str], name: str) -> SwarmProcess:
        log_path = self.log_dir / f"{name}-{len(self.processes)}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", **launched_env(), **self.extra_env)
        proc = subprocess.Popen(
            [sys.executable, "-m", "peer.cli", *args],
            stdout=subprocess.PIPE,
            stderr=open(log_path, "w"),  # noqa: SIM115 - the child owns it
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches only our parent, which stops us by pid in order
        )
        process = SwarmProcess(proc, log_path)
        threading.Thread(target=process._pump, daemon=True).start()
        self.processes.append(process)
        return process

    def start_dht(self) -> SwarmProcess:
        process = self.spawn(["dht"], "dht")
        process.wait_for_line("/")
        self.initial_peers = process.maddrs[:1]
        return process

    def start_peer(self, model: Path, layers: str | None, *extra: str, wait: bool = True) -> SwarmProcess:
        """A `swarm-peer serve` of `layers` ("START:END"; None lets the peer choose, see --num-layers)."""
        args = ["serve", "--model", str(model), *(["--layers", layers] if layers else []), *extra]
        if self.initial_peers:
            args += ["--initial-peers", self.initial_peers[0]]
        process = self.spawn(args, f"peer-{(layers or 'auto').replace(':', '-')}")
        if wait:
            self.wait_online(process)
        return process

    def wait_online(self, process: SwarmProcess, timeout: float = START_TIMEOUT) -> None:
        line = process.wait_for_line("online", timeout)
        process.peer_id = line.split()[1]

    def close(self, graceful: bool = False, timeout: float = 15.0) -> None:
        """Stop every process: kill -9 by default; `graceful` sends all of them SIGTERM at once
        (their drains and OFFLINE announcements overlap) and waits up to `timeout` s in total."""
        processes = list(reversed(self.processes))
        if graceful:
            remains = [p.remains() for p in processes]
            for process in processes:
                process.terminate()
            deadline = time.monotonic() + timeout
            for process, its_remains in zip(processes, remains):
                process._reap(its_remains, max(0.1, deadline - time.monotonic()))
        else:
            for process in processes:
                process.kill()
        self.processes.clear()

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

