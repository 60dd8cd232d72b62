"""Fixtures that start real hivemind DHT nodes on 127.0.0.1 and always stop them.

`swarm_node_factory(**kwargs)` starts a SwarmNode; at teardown every node it started is shut
down and the processes it spawned (the DHT child and its p2pd) are checked to be gone.
`swarm_trio` is a module-scoped bootstrap + server + client-mode trio for read/write tests
(use a unique model name per test so tests do not see each other's records).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from swarm.dht import SwarmNode


def _node_processes(node: SwarmNode) -> set[int]:
    """The DHT child process and everything it started (its p2pd daemon)."""
    proc = psutil.Process(node.dht.pid)
    return {proc.pid, *(p.pid for p in proc.children(recursive=True))}


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _assert_gone(pids: set[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    alive = set(pids)
    while alive and time.monotonic() < deadline:
        alive = {pid for pid in alive if _running(pid)}
        if alive:
            time.sleep(0.05)
    names = []
    for pid in alive:
        try:
            names.append(f"{pid}:{psutil.Process(pid).name()}")
        except psutil.Error:
            pass
    assert not names, f"processes left running after SwarmNode.shutdown: {names}"


class _NodeTracker:
    def __init__(self) -> None:
        self.nodes: list[tuple[SwarmNode, set[int]]] = []

    def start(self, **kwargs: Any) -> SwarmNode:
        node = SwarmNode(**kwargs)
        self.nodes.append((node, _node_processes(node)))
        return node

    def stop_all(self) -> None:
        spawned: set[int] = set()
        for node, pids in reversed(self.nodes):
            node.shutdown()
            spawned |= pids
        self.nodes.clear()
        _assert_gone(spawned)


@pytest.fixture
def swarm_node_factory() -> Iterator[Callable[..., SwarmNode]]:
    tracker = _NodeTracker()
    try:
        yield tracker.start
    finally:
        tracker.stop_all()


@pytest.fixture(scope="module")
def swarm_trio() -> Iterator[tuple[SwarmNode, SwarmNode, SwarmNode]]:
    """(bootstrap, server, client): the server and client joined through the bootstrap node."""
    tracker = _NodeTracker()
    try:
        bootstrap = tracker.start()
        server = tracker.start(initial_peers=bootstrap.visible_maddrs())
        client = tracker.start(initial_peers=bootstrap.visible_maddrs(), client_mode=True)
        yield bootstrap, server, client
    finally:
        tracker.stop_all()
