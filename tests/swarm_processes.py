"""The `local_swarm` fixture: real peer processes on 127.0.0.1, killed by pid at teardown;
`wait_until`, the bounded wait for what those processes announce."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm

__all__ = ["local_swarm", "log_tails", "wait_until"]

# Peers of a test run with one torch thread each: several share the 2-core CI machine.
TEST_ENV = {"OMP_NUM_THREADS": "1"}


def new_test_swarm(log_dir: Path) -> LocalSwarm:
    return LocalSwarm(log_dir, TEST_ENV)


@pytest.fixture
def local_swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with new_test_swarm(tmp_path) as swarm:
        yield swarm


# A failing test's report ends with this many lines of each of its processes' logs (tests/conftest.py):
# a flake seen once in CI is then diagnosable from its report alone.
LOG_TAIL_LINES = 60


def log_tails(swarm: LocalSwarm) -> str:
    """The last LOG_TAIL_LINES lines of every log of `swarm`'s processes, each under its file name."""
    parts = []
    for process in swarm.processes:
        lines = [line for line in process.log_text().splitlines() if "it/s]" not in line]  # no progress bars
        parts.append(f"== {process.log_path.name}\n" + "\n".join(lines[-LOG_TAIL_LINES:]))
    return "\n".join(parts)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.3) -> None:
    """Poll `predicate` every `poll` s until it holds; fail the test after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll)
