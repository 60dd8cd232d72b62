"""No orphans: the DHT child process and its p2pd die when the process that started them dies.

hivemind runs the DHT in a forked child (`hivemind.DHT` is a ForkProcess) that starts p2pd as
its own subprocess. When the parent is killed outright (SIGKILL, OOM) nothing tells them, and
both used to live on with parent 1, holding ~250 MB and the node's port. Two guards:

* the DHT child runs a watchdog thread that polls its parent pid and exits when it changes
  (polling, not PR_SET_PDEATHSIG: that signal fires when the *thread* that forked the child
  exits, and peers start their DHT node from short-lived executor threads; swarm/launcher.py);
* p2pd is started with PR_SET_PDEATHSIG = SIGKILL (Linux), so it dies with the DHT child,
  whether the child exits cleanly, by the watchdog, or is killed itself. p2pd is forked from the
  DHT child's event-loop thread, which lives as long as the child.

The other way round, a killed DHT child must not take the process that started it down: hivemind's
MPFuture shares multiprocessing locks between a process and every DHT child it forks. A child killed
while it held one (SIGKILL between its reply and the release, or hivemind's own `terminate()` after
a slow shutdown) left it held for ever, and every node started later in that process hung on its
first reply and never became ready (CI, 2026-12-03: 70 tests failed after one such kill). Before
each fork the locks are checked and a stale one is replaced.
"""

from __future__ import annotations

import asyncio.subprocess
import ctypes
import functools
import logging
import multiprocessing as mp
import os
import signal
import sys

import hivemind
from hivemind.utils.mpfuture import MPFuture, SharedBytes

from swarm.launcher import watch_parent

logger = logging.getLogger(__name__)

# A holder keeps these locks for one small pipe write or a dict update (microseconds); one not free
# after a second belongs to a process that died holding it.
STALE_LOCK_SECONDS = 1.0
# hivemind's process-shared locks, inherited by every DHT child: (class, attribute).
_SHARED_LOCKS = ((MPFuture, "_update_lock"), (MPFuture, "_initialization_lock"), (SharedBytes, "_lock"))
_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` to this process when its parent (thread) dies. No-op elsewhere.

    Safe as a `preexec_fn`: only a libc call, no allocation of Python objects that need locks.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def replace_stale_shared_locks(wait: float = STALE_LOCK_SECONDS) -> list[str]:
    """Give hivemind a fresh lock for each shared lock nobody releases within `wait` s; their names.

    Children forked afterwards inherit the fresh locks. A live child that still holds the old one is
    unaffected: it was stuck already if the old lock was.
    """
    replaced = []
    for owner, name in _SHARED_LOCKS:
        lock = getattr(owner, name)
        if lock.acquire(timeout=wait):
            lock.release()
            continue
        setattr(owner, name, mp.Lock())
        replaced.append(f"{owner.__name__}.{name}")
    if replaced:
        logger.warning("a DHT child died holding %s; replaced before starting the next node", ", ".join(replaced))
    return replaced


class GuardedDHT(hivemind.DHT):
    """hivemind.DHT whose child process (and p2pd) dies with the process that created it."""

    def __init__(self, *args, **kwargs) -> None:
        self._creator_pid = os.getpid()
        replace_stale_shared_locks()  # before hivemind makes its first MPFuture (its ready signal)
        super().__init__(*args, **kwargs)

    def run(self) -> None:  # runs in the forked child
        watch_parent(self._creator_pid)
        # Only this child's copy of asyncio is patched: every subprocess it starts (p2pd) gets
        # SIGKILL when the child dies. hivemind calls asyncio.subprocess.create_subprocess_exec.
        original = asyncio.subprocess.create_subprocess_exec
        asyncio.subprocess.create_subprocess_exec = functools.partial(original, preexec_fn=die_with_parent)
        super().run()
