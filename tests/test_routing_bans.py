"""BanList: exact backoff sequence, expiry, forgiveness, penalties for plan_route."""

from __future__ import annotations

import pytest

from routing import BanList, plan_route
from tests.routing_helpers import hops, rec, view


def test_backoff_doubles_from_one_second_up_to_the_cap() -> None:
    bans = BanList()
    durations = [bans.ban("p", now=0.0) for _ in range(12)]
    assert durations == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]


def test_ban_expires_but_failures_are_remembered_until_forgiven() -> None:
    bans = BanList()
    assert bans.ban("p", now=100.0) == 1.0
    assert bans.is_banned("p", 100.5) and bans.remaining("p", 100.5) == pytest.approx(0.5)
    assert not bans.is_banned("p", 101.0)
    assert bans.penalties(101.0) == {}
    assert bans.ban("p", now=200.0) == 2.0  # second failure in a row: longer
    bans.forgive("p")
    assert not bans.is_banned("p", 200.0) and bans.remaining("p", 200.0) == 0.0
    assert bans.ban("p", now=300.0) == 1.0  # fresh start after a success


def test_penalties_list_banned_peers_with_their_level() -> None:
    bans = BanList()
    bans.ban("b", 0.0)
    bans.ban("a", 0.0)
    bans.ban("a", 0.0)
    assert bans.penalties(0.5) == {"a": 2.0, "b": 1.0}
    assert list(bans.penalties(0.5)) == ["a", "b"]  # sorted, deterministic
    assert bans.penalties(1.5) == {"a": 2.0}
    assert bans.penalties(2.0) == {}


def test_custom_constants_and_validation() -> None:
    bans = BanList(base=0.5, factor=3.0, cap=5.0)
    assert [bans.ban("p", 0.0) for _ in range(4)] == [0.5, 1.5, 4.5, 5.0]
    with pytest.raises(ValueError):
        BanList(base=0.0)
    with pytest.raises(ValueError):
        BanList(base=10.0, cap=1.0)


def test_penalties_steer_plan_route() -> None:
    bans = BanList()
    v = view(4, rec("fast", "0:4", 100.0), rec("slow", "0:4", 1.0))
    bans.ban("fast", now=0.0)
    assert hops(plan_route(v, banned=bans.penalties(0.5))) == [("slow", "0:4")]
    assert hops(plan_route(v, banned=bans.penalties(1.0))) == [("fast", "0:4")]


def test_an_unreachable_peer_stays_banned_until_it_announces_again() -> None:
    bans = BanList()
    bans.ban("dead", now=0.0)
    bans.unreachable("dead", announced=50.0)
    assert bans.penalties(10.0) == {}, "without a view, only time bans are listed"
    assert bans.penalties(10.0, {"dead": 50.0}) == {"dead": 1.0}, "its 1 s ban is long over"
    assert bans.penalties(20.0, {"dead": 50.0}) == {"dead": 1.0}
    assert bans.penalties(21.0, {"dead": 61.0}) == {}, "a newer announcement: it is back"
    assert bans.penalties(22.0, {"dead": 50.0}) == {}, "and it stays forgiven as unreachable"


def test_an_unreachable_peer_ranks_below_every_merely_failing_peer() -> None:
    bans = BanList()
    for _ in range(3):
        bans.ban("flaky", now=0.0)  # refused three steps: level 3 until t = 4
    bans.ban("dead", now=0.0)
    bans.unreachable("dead", announced=7.0)
    assert bans.penalties(1.0, {"flaky": 5.0, "dead": 7.0}) == {"dead": 4.0, "flaky": 3.0}
    assert bans.penalties(5.0, {"flaky": 5.0, "dead": 7.0}) == {"dead": 1.0}
    v = view(4, rec("dead", "0:4", 100.0), rec("flaky", "0:4", 1.0))
    assert hops(plan_route(v, banned=bans.penalties(1.0, {"flaky": 5.0, "dead": 7.0}))) == [("flaky", "0:4")]


def test_an_unreachable_peer_is_forgotten_once_its_record_is_gone_or_it_is_forgiven() -> None:
    bans = BanList()
    bans.unreachable("gone", announced=1.0)
    bans.unreachable("fine", announced=1.0)
    assert bans.penalties(0.0, {"gone": 1.0, "fine": 1.0}) == {"fine": 1.0, "gone": 1.0}
    assert bans.penalties(0.0, {"fine": 1.0}) == {"fine": 1.0}
    assert bans.penalties(0.0, {"gone": 1.0, "fine": 1.0}) == {"fine": 1.0}, "'gone' left the view: forgotten"
    bans.forgive("fine")
    assert bans.penalties(0.0, {"gone": 1.0, "fine": 1.0}) == {}
