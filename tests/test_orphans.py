"""No orphans: `kill -9` of a peer, a DHT node or the monitor leaves no DHT child or p2pd behind, and
`kill -9` of what started them (a demo, a test run) leaves none of them.

Before (2026-11-30) each kill left the DHT process (~250 MB) and p2pd running under pid 1.
Real processes; their helpers are listed with psutil before the kill and must all be gone after.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from client.local_swarm import Remains, listening_sockets
from swarm.dht import SwarmNode
from swarm.launcher import LAUNCHER_ENV, ORPHAN_GRACE_S, exit_with_launcher, launched_env

ROOT = Path(__file__).resolve().parents[1]

GONE_WITHIN = 8.0  # seconds; the DHT child polls its parent every 0.25 s, p2pd dies with it


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _count_p2pd(procs: list[psutil.Process]) -> int:
    count = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):  # a process may exit between the listing and here
            count += proc.name() == "p2pd" and _alive(proc)
    return count


def _helpers_when_up(pid: int, timeout: float = 90.0) -> list[psutil.Process]:
    """Descendants of `pid` once its p2pd runs and listens (the DHT node is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        helpers = psutil.Process(pid).children(recursive=True)
        if any(h.name() == "p2pd" and listening_sockets([h]) for h in helpers):
            return helpers
        time.sleep(0.2)
    raise TimeoutError(f"process {pid} started no p2pd within {timeout} s")


def _kill_and_check(pid: int, helpers: list[psutil.Process]) -> None:
    assert {h.name() for h in helpers} >= {"p2pd"}, helpers
    remains = Remains(helpers, listening_sockets([psutil.Process(pid), *helpers]))
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_WITHIN
    while any(_alive(h) for h in helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [f"{h.pid}:{h.name()}" for h in helpers if _alive(h)]
    remains.clear()  # never leave them to the next test, whatever the outcome
    assert not left, f"still running {GONE_WITHIN} s after kill -9 of their parent: {left}"


def _spawn(args: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=log,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)


def _run_and_kill(args: list[str], tmp_path) -> None:
    with open(tmp_path / "process.log", "w") as log:
        proc = _spawn(args, log)
        try:
            _kill_and_check(proc.pid, _helpers_when_up(proc.pid))
        finally:
            proc.kill()
            proc.wait()


def test_kill_9_of_swarm_peer_dht_leaves_nothing(tmp_path) -> None:
    _run_and_kill(["peer.cli", "dht"], tmp_path)


@pytest.mark.slow
def test_kill_9_of_swarm_peer_serve_leaves_nothing(local_swarm, tiny_model) -> None:
    peer = local_swarm.start_peer(tiny_model, "0:2")  # the first node of its own swarm: same helpers, no bootstrap
    _kill_and_check(peer.pid, peer.descendants())


@pytest.mark.slow
def test_local_swarm_removes_the_sockets_a_killed_peer_leaves(local_swarm, tiny_model) -> None:
    """A kill -9 leaves p2pd's and hivemind's unix sockets in the temp folder (their own exit removes
    them): LocalSwarm, which killed it, removes them, so test runs and demos do not pile them up."""
    peer = local_swarm.start_peer(tiny_model, "0:2")
    remains = peer.remains()
    names = [socket.name for socket in remains.sockets]
    assert any(n.startswith("hivemind-p2pd-") for n in names) and any(n.startswith("hivemind-p2pclient-") for n in names)
    assert all(socket.exists() for socket in remains.sockets)
    peer.kill()
    assert [socket for socket in remains.sockets if socket.exists()] == []


@pytest.mark.slow
def test_kill_9_of_swarm_monitor_leaves_nothing(swarm_node_factory, tmp_path) -> None:
    bootstrap = swarm_node_factory()
    _run_and_kill(["client.monitor.cli", "--initial-peers", bootstrap.visible_maddrs()[0], "--port", "0"], tmp_path)


def test_p2pd_dies_with_a_killed_dht_child(swarm_node_factory) -> None:
    node: SwarmNode = swarm_node_factory()
    helpers = _helpers_when_up(node.dht.pid, timeout=10)
    sockets = listening_sockets([psutil.Process(node.dht.pid), *helpers])
    os.kill(node.dht.pid, signal.SIGKILL)
    deadline = time.monotonic() + GONE_WITHIN
    while any(_alive(h) for h in helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [h for h in helpers if _alive(h)]
    Remains(helpers, sockets).clear()
    assert not left, "p2pd outlived its DHT process"


# A demo or test run in miniature: starts a DHT node and a peer through LocalSwarm, prints their pids
# and waits to be killed.
_LAUNCHER = """
import sys, time
from pathlib import Path
from client.local_swarm import LocalSwarm
swarm = LocalSwarm(Path(sys.argv[2]), {"OMP_NUM_THREADS": "1"})
swarm.start_dht()
swarm.start_peer(Path(sys.argv[1]), "0:2")
print(*(process.pid for process in swarm.processes), flush=True)
time.sleep(300)
"""


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """proc's first stdout line, waiting at most `timeout` s."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


@pytest.mark.slow
def test_processes_a_killed_launcher_started_stop_with_their_helpers(tiny_model, tmp_path) -> None:
    """kill -9 of a demo, benchmark or test run leaves none of the peers it started (swarm/launcher.py):
    before, they served on under pid 1 for a minute or more."""
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(tiny_model), str(tmp_path)], cwd=ROOT,
                                    stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, text=True,
                                    start_new_session=True)
        started: list[psutil.Process] = []
        sockets: list[Path] = []
        try:
            pids = _first_line(launcher, 120.0).split()
            assert len(pids) == 2, f"the launcher started no swarm: {(tmp_path / 'launcher.log').read_text()[-2000:]}"
            started = [psutil.Process(int(pid)) for pid in pids]
            started += [helper for process in started for helper in _helpers_when_up(process.pid)]
            sockets = listening_sockets(started)
            os.kill(launcher.pid, signal.SIGKILL)
            deadline = time.monotonic() + ORPHAN_GRACE_S + GONE_WITHIN
            while any(_alive(p) for p in started) and time.monotonic() < deadline:
                time.sleep(0.2)
            left = [f"{p.pid}:{p.name()}" for p in started if _alive(p)]
            assert not left, f"still running {ORPHAN_GRACE_S + GONE_WITHIN} s after kill -9 of their launcher: {left}"
        finally:
            Remains(started, sockets).clear()  # never leave them to the next test, whatever the outcome
            launcher.kill()
            launcher.wait()


def test_only_a_process_started_by_its_launcher_watches_it(monkeypatch) -> None:
    """A peer from a user's shell (no LAUNCHER_ENV) lives on; so does a grandchild, which inherits a pid
    that is not its parent's."""
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert exit_with_launcher() is None
    monkeypatch.setenv(LAUNCHER_ENV, str(os.getpid()))  # our own pid: not our parent's
    assert exit_with_launcher() is None
    assert launched_env() == {LAUNCHER_ENV: str(os.getpid())}


# Run in its own interpreter: if the guard regressed, the stuck lock would hang every later node of
# the process that ran it, here only this script's.
_KILLED_HOLDING_A_LOCK = """
import os, signal, time
import psutil
from hivemind.utils.mpfuture import MPFuture
from client.local_swarm import Remains, listening_sockets
from swarm.dht import SwarmNode

async def take_the_reply_lock(dht, node):
    MPFuture._update_lock.acquire()  # the child's own reply then waits on it: held until the kill

first = SwarmNode()
first.dht.run_coroutine(take_the_reply_lock, return_future=True)
deadline = time.monotonic() + 10
while time.monotonic() < deadline and MPFuture._update_lock.acquire(timeout=0.1):
    MPFuture._update_lock.release()  # not taken yet
assert time.monotonic() < deadline, "the DHT child never took the lock: nothing is tested"
child = psutil.Process(first.dht.pid)
sockets = listening_sockets([child, *child.children(recursive=True)])
os.kill(first.dht.pid, signal.SIGKILL)
first.dht.join(10)
Remains([], sockets).clear()  # the kill left them
second = SwarmNode(start_timeout=20)
print("second node ready", second.peer_id != first.peer_id)
second.shutdown()
"""


def test_a_dht_child_killed_holding_a_shared_lock_does_not_stop_the_next_node() -> None:
    """hivemind's MPFuture locks are shared with every forked DHT child; one killed holding one used to
    leave every later node of that process unable to become ready (CI, 2026-12-03)."""
    result = subprocess.run([sys.executable, "-c", _KILLED_HOLDING_A_LOCK], capture_output=True, text=True,
                            timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "second node ready True" in result.stdout
    assert "died holding MPFuture._update_lock" in result.stderr


@pytest.mark.slow
def test_demo_stops_everything_on_sigterm(demo_model, tmp_path) -> None:
    """SIGTERM to `make demo` (client/demo.py --stay) stops its DHT node, peers and monitor, as Ctrl-C does."""
    with open(tmp_path / "demo.log", "w") as log:
        proc = _spawn(["client.demo", "--stay", "--max-new-tokens", "4", "--monitor-port", "0"], log)
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if "swarm running" in (tmp_path / "demo.log").read_text(errors="replace"):
                break
            time.sleep(0.5)
        assert proc.poll() is None, (tmp_path / "demo.log").read_text(errors="replace")[-3000:]
        # dht, 2 peers, monitor (+ the client's). The monitor is a separate process that may still be
        # importing when the banner prints (CI, 2 cores), so wait for its p2pd rather than look once.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            descendants = psutil.Process(proc.pid).children(recursive=True)
            if _count_p2pd(descendants) >= 4:
                break
            time.sleep(0.5)
        assert _count_p2pd(descendants) >= 4, descendants
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in descendants) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [f"{p.pid}:{p.name()}" for p in descendants if _alive(p)]
        assert not left, f"left running after SIGTERM to the demo: {left}"
    finally:
        for p in descendants:
            with contextlib.suppress(psutil.Error):
                p.kill()
        proc.kill()
        proc.wait()
