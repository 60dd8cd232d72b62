"""`swarm-peer drain --pid`: signals only a `swarm-peer serve`, waits for it to exit, one-line errors.

The stand-in peers are real processes whose command line looks like `swarm-peer serve` and
whose SIGTERM handling is scripted (a drain of a second; or one that only a second signal
ends). The full drain of a real peer through this command is in tests/test_drain.py.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from peer.drain_cli import is_serving_peer

STAND_IN = """
import signal, sys, time
mode = sys.argv[2]
hits = []
def on_term(*_):
    hits.append(time.monotonic())
    if mode == "drains" or len(hits) >= 2:
        time.sleep(1.0 if mode == "drains" else 0.0)  # the drain: serve on a while, then leave
        sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.05)
sys.exit(3)
"""


def stand_in(tmp_path: Path, mode: str) -> subprocess.Popen:
    """A process whose argv is `python .../swarm-peer serve MODE`, ready for signals."""
    script = tmp_path / "swarm-peer"
    script.write_text(STAND_IN)
    proc = subprocess.Popen([sys.executable, str(script), "serve", mode], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def drain_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peer.cli", "drain", *args], capture_output=True, text=True,
                          timeout=60)


def test_recognises_serving_peers_only() -> None:
    assert is_serving_peer(["/venv/bin/python", "/venv/bin/swarm-peer", "serve", "--model", "m"])
    assert is_serving_peer(["/venv/bin/swarm-peer", "serve"])
    assert is_serving_peer(["python", "-m", "peer.cli", "serve", "--layers", "0:4"])
    assert not is_serving_peer(["python", "-m", "peer.cli", "dht"])
    assert not is_serving_peer(["sleep", "30"])
    assert not is_serving_peer(["python", "serve.py", "serve"])


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to read command lines")
def test_drains_a_peer_and_waits_until_it_exits(tmp_path: Path) -> None:
    peer = stand_in(tmp_path, "drains")
    try:
        started = time.monotonic()
        done = drain_command("--pid", str(peer.pid))
        assert done.returncode == 0, done.stderr
        assert peer.wait(5) == 0  # it left by its own drain, not killed
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"draining peer {peer.pid}")
        assert lines[-1].startswith(f"peer {peer.pid} exited after")
        assert time.monotonic() - started >= 1.0  # the command waited for the drain to finish
    finally:
        peer.kill()
        peer.wait()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to read command lines")
def test_force_after_sends_the_second_signal(tmp_path: Path) -> None:
    peer = stand_in(tmp_path, "needs-two")
    try:
        done = drain_command("--pid", str(peer.pid), "--force-after", "0.5")
        assert done.returncode == 0, done.stderr
        assert peer.wait(5) == 0
        assert "stopping it now (second SIGTERM)" in done.stdout
    finally:
        peer.kill()
        peer.wait()


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc to read command lines")
def test_refuses_other_processes_and_gives_up_after_timeout(tmp_path: Path) -> None:
    other = subprocess.Popen(["sleep", "30"])
    peer = stand_in(tmp_path, "needs-two")
    try:
        refused = drain_command("--pid", str(other.pid))
        assert refused.returncode == 1
        assert refused.stderr.strip().splitlines() == [
            f"swarm-peer drain: error: process {other.pid} is not a `swarm-peer serve` (sleep 30); check the pid"]
        assert other.poll() is None  # not signalled

        gone = drain_command("--pid", "999999999")
        assert gone.returncode == 1 and len(gone.stderr.strip().splitlines()) == 1
        assert "no process with pid 999999999" in gone.stderr

        stuck = drain_command("--pid", str(peer.pid), "--timeout", "0.6")
        assert stuck.returncode == 1 and "still running after" in stuck.stderr
        assert len(stuck.stderr.strip().splitlines()) == 1 and "Traceback" not in stuck.stderr
        assert peer.poll() is None  # one SIGTERM: still draining
    finally:
        for proc in (other, peer):
            proc.kill()
            proc.wait()
