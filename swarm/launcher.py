"""No orphans, the launcher's side: processes we start by command line stop when their starter dies.

LocalSwarm's DHT nodes and peers, the demo's monitor and the gateway are started by another of our
processes (the demo, a benchmark, a test) with LAUNCHER_ENV, the starter's pid, in their environment
(launched_env), and call exit_with_launcher at start. When the starter dies, even by kill -9, which
gives it no chance to stop them, they stop as on SIGTERM and are gone within ORPHAN_GRACE_S; their
own helpers (DHT child, p2pd) follow them (swarm/lifeline.py). Before, a demo or a test run killed
outright left its peers serving under pid 1 for a minute or more. A peer a user starts from a shell
has no LAUNCHER_ENV and lives on as it should (under nohup, systemd or its own supervisor).

Polling the parent pid, not PR_SET_PDEATHSIG: that signal fires when the *thread* that forked the
child exits, and our processes are started from short-lived threads too. No hivemind here: every
CLI calls this before it parses its arguments.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

PARENT_POLL_SECONDS = 0.25
# The starter's pid, in the environment of a process that must not outlive it (launched_env).
LAUNCHER_ENV = "LAYERSWARM_LAUNCHER_PID"
# An orphaned process gets SIGTERM (a peer starts its drain and announces OFFLINE on the way out) and
# at most this long before it exits regardless: nobody is left to wait for it.
ORPHAN_GRACE_S = 5.0


def watch_parent(parent_pid: int, on_orphaned: Callable[[], None] | None = None,
                 poll: float = PARENT_POLL_SECONDS) -> threading.Thread:
    """Start a daemon thread that calls `on_orphaned()` and then exits the process, once the parent is gone."""

    def run() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll)
        if on_orphaned is not None:
            on_orphaned()
        os._exit(0)  # the parent is gone: nobody can use or stop us any more

    thread = threading.Thread(target=run, name="parent-watch", daemon=True)
    thread.start()
    return thread


def launched_env() -> dict[str, str]:
    """Environment entries for a child process that must stop when this process dies (exit_with_launcher)."""
    return {LAUNCHER_ENV: str(os.getpid())}


def exit_with_launcher(grace: float = ORPHAN_GRACE_S) -> threading.Thread | None:
    """In a process started with launched_env(): once its starter is gone, SIGTERM ourselves and exit
    within `grace` s. Returns the watching thread, or None when this process was not started so (from
    a user's shell; or a grandchild, which inherited another process's pid and whose parent watches)."""
    launcher = os.environ.get(LAUNCHER_ENV, "")
    if not launcher.isdigit() or int(launcher) != os.getppid():
        return None

    def stop_as_on_sigterm() -> None:
        logger.warning("the process that started us (pid %s) is gone: stopping", launcher)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace)  # a clean stop ends the process first; otherwise watch_parent exits after this

    return watch_parent(int(launcher), on_orphaned=stop_as_on_sigterm)
