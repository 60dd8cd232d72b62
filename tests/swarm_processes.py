"""The `local_swarm` fixture: real peer processes on 127.0.0.1, killed by pid at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from client.local_swarm import LocalSwarm

__all__ = ["local_swarm"]

# Peers of a test run with one torch thread each: several share the 2-core CI machine.
TEST_ENV = {"OMP_NUM_THREADS": "1"}


def new_test_swarm(log_dir: Path) -> LocalSwarm:
    return LocalSwarm(log_dir, TEST_ENV)


@pytest.fixture
def local_swarm(tmp_path: Path) -> Iterator[LocalSwarm]:
    with new_test_swarm(tmp_path) as swarm:
        yield swarm
