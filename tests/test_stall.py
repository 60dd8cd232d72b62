"""client/stall.py: a silent hop is probed; a gone one raises PeerUnreachable at once, a busy one is waited for."""

from __future__ import annotations

import asyncio

import pytest

from client.config import ClientConfig
from client.errors import is_hop_failure
from client.measured import MeasuredThroughput
from client.stall import STALL_STEP_FACTOR, stall_wait, unless_gone
from swarm.errors import PeerUnreachable


class Probes:
    def __init__(self, alive: bool) -> None:
        self.alive, self.count = alive, 0

    async def __call__(self) -> bool:
        self.count += 1
        return self.alive


async def later(seconds: float, value: str = "result") -> str:
    await asyncio.sleep(seconds)
    return value


def test_a_prompt_answer_needs_no_probe() -> None:
    probes = Probes(alive=False)
    assert asyncio.run(unless_gone(later(0.0), probes, "p", stall_probe_s=1.0, timeout=30)) == "result"
    assert probes.count == 0


def test_a_busy_peer_that_answers_probes_is_waited_for() -> None:
    probes = Probes(alive=True)
    assert asyncio.run(unless_gone(later(0.35), probes, "p", stall_probe_s=0.1, timeout=30)) == "result"
    assert probes.count >= 2


def test_a_silent_peer_that_fails_its_probe_is_unreachable_and_its_wait_cancelled() -> None:
    probes = Probes(alive=False)

    async def run() -> asyncio.Task[str]:
        waiting = asyncio.ensure_future(later(30.0))
        with pytest.raises(PeerUnreachable, match="does not answer a probe") as caught:
            await unless_gone(waiting, probes, "peer-x", stall_probe_s=0.05, timeout=30)
        assert is_hop_failure(caught.value), "the session fails over on it"
        return waiting

    waiting = asyncio.run(asyncio.wait_for(run(), 5))
    assert waiting.cancelled()
    assert probes.count == 1


def test_the_results_own_timeout_still_ends_the_wait() -> None:
    async def times_out() -> str:
        await asyncio.sleep(0.2)
        raise asyncio.TimeoutError

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(unless_gone(times_out(), Probes(alive=True), "p", stall_probe_s=0.05, timeout=0.2))


def test_the_stall_probe_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stall_probe_s"):
        ClientConfig(stall_probe_s=0)
    with pytest.raises(ValueError, match="stall_probe_min_s"):
        ClientConfig(stall_probe_min_s=3.0)  # above stall_probe_s (2 s)
    with pytest.raises(ValueError, match="stall_probe_min_s"):
        ClientConfig(stall_probe_min_s=0)


def test_a_hop_that_answers_fast_is_probed_sooner_than_one_not_timed_yet() -> None:
    """Four of the hop's usual decode steps, within [floor, ceiling]; the ceiling before any was timed."""
    assert stall_wait(None, 1.0, 2.0) == 2.0
    assert stall_wait(0.02, 1.0, 2.0) == 1.0  # a GPU hop: the floor
    assert stall_wait(0.4, 1.0, 2.0) == pytest.approx(STALL_STEP_FACTOR * 0.4)  # between
    assert stall_wait(3.0, 1.0, 2.0) == 2.0  # a slow CPU hop: never later than the ceiling


def test_a_peers_usual_decode_step_comes_from_the_clients_own_measure() -> None:
    measured = MeasuredThroughput()
    assert measured.expected_seconds("p", 4, 1) is None
    measured.observe("p", layers=4, tokens=1, seconds=0.05)
    assert measured.expected_seconds("p", 4, 1) == pytest.approx(0.05)
    measured.observe("p", layers=4, tokens=1, seconds=1.05)  # one slow step moves it, but does not set it
    assert 0.05 < measured.expected_seconds("p", 4, 1) < 0.5
