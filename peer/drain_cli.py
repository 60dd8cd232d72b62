"""`swarm-peer drain --pid PID`: planned leaving of a running `swarm-peer serve`.

It sends the peer SIGTERM, which starts its graceful departure (peer/drain.py: announce
DRAINING, serve on until other peers cover its layers or its `--drain-timeout` runs out, then
hand open sessions over), and waits until the process has exited, printing progress. With
`--force-after` it sends a second SIGTERM (stop at once) when the drain takes longer.

Only a process whose command line is a `swarm-peer serve` is signalled: a mistyped pid must
not stop something else. Every problem is one line on stderr, exit code 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

# Seconds between two checks whether the peer has exited: a drain lasts seconds to minutes.
POLL_S = 0.2
# Seconds between two progress lines while the peer drains.
PROGRESS_S = 5.0


class DrainError(Exception):
    """A problem the user can fix; its text is the one line printed."""


def is_serving_peer(cmdline: list[str]) -> bool:
    """Is this argv a `swarm-peer serve` (the installed script or `python -m peer.cli`)?"""
    launcher = any(Path(arg).name == "swarm-peer" or arg == "peer.cli" for arg in cmdline[:4])
    return launcher and "serve" in cmdline


def _cmdline(pid: int) -> list[str] | None:
    """The process' argv from /proc, or None where /proc is not available (then it is not checked)."""
    path = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self/cmdline").exists():
        return None
    try:
        return path.read_bytes().decode(errors="replace").rstrip("\0").split("\0")
    except FileNotFoundError:
        raise DrainError(f"no process with pid {pid}; is the peer running? (`pgrep -af 'swarm-peer serve'`)") from None
    except PermissionError:
        raise DrainError(f"cannot read process {pid}; run as the user that runs the peer") from None


def _alive(pid: int) -> bool:
    """Is the process still there (a zombie, exited but not yet reaped by its parent, counts as gone)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _signal(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise DrainError(f"no process with pid {pid}; is the peer running?") from None
    except PermissionError:
        raise DrainError(f"not allowed to signal process {pid}; run as the user that runs the peer") from None


def drain_peer(pid: int, timeout: float, force_after: float | None, say=print) -> float:
    """Signal the peer, wait until it exits; returns the seconds it took. Raises DrainError."""
    if pid <= 0:
        raise DrainError(f"--pid must be a process id (> 0), got {pid}")
    cmdline = _cmdline(pid)
    if cmdline is not None and not is_serving_peer(cmdline):
        shown = " ".join(cmdline)[:80] or "(no command line)"
        raise DrainError(f"process {pid} is not a `swarm-peer serve` ({shown}); check the pid")
    _signal(pid)
    say(f"draining peer {pid}: it serves until other peers cover its layers, then exits")
    started = time.monotonic()
    next_line = started + PROGRESS_S
    forced = False
    while _alive(pid):
        now = time.monotonic()
        waited = now - started
        if waited >= timeout:
            raise DrainError(f"peer {pid} still running after {timeout:.0f} s; "
                             f"running `swarm-peer drain --pid {pid}` again stops it at once (a second SIGTERM)")
        if force_after is not None and waited >= force_after and not forced:
            say(f"peer {pid} still draining after {waited:.0f} s: stopping it now (second SIGTERM)")
            _signal(pid)
            forced = True
        if now >= next_line:
            say(f"peer {pid} still draining ({waited:.0f} s)")
            next_line += PROGRESS_S
        time.sleep(POLL_S)
    took = time.monotonic() - started
    say(f"peer {pid} exited after {took:.1f} s")
    return took


def drain(
    pid: Annotated[int, typer.Option("--pid", help="Process id of the `swarm-peer serve` to drain (e.g. `pgrep -f 'swarm-peer serve'`).")],
    timeout: Annotated[float, typer.Option("--timeout", help="Give up waiting (exit 1, the peer keeps draining) after this many seconds.")] = 600.0,
    force_after: Annotated[float | None, typer.Option("--force-after", help="Send a second SIGTERM (the peer stops at once, its sessions fail over) after this many seconds of draining. Default: let the peer's own --drain-timeout decide.")] = None,
) -> None:
    """Leave the swarm gracefully: the peer announces DRAINING, waits until others cover its layers, exits."""
    if timeout <= 0:
        raise typer.BadParameter("must be more than 0 seconds", param_hint="--timeout")
    if force_after is not None and force_after < 0:
        raise typer.BadParameter("must be 0 (at once) or more seconds", param_hint="--force-after")
    try:
        drain_peer(pid, timeout, force_after, say=lambda line: print(line, flush=True))
    except DrainError as e:
        print(f"swarm-peer drain: error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
