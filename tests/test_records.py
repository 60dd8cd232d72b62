"""Signed, bounded DHT records against real hivemind nodes on 127.0.0.1, attacked as a stranger would.

Each attack is written with the project's own DHT wrapper by a node that joined the swarm; the
victim's view must keep working and keep the victim's true record.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest
from hivemind.utils import get_dht_time

from swarm.auth import SwarmKey
from swarm.dht import SwarmNode, model_key, reports_key, suspects_key
from swarm.identity import IdentityError, peer_id_of
from swarm.records import MAX_TTL, owner_of
from swarm.types import LayerRange, PeerRecord, PeerState


def unique_model() -> str:
    return f"rec-model-{uuid.uuid4().hex[:8]}"


def settle(fetch, check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.fixture(scope="module")
def trio(swarm_trio):
    """(bootstrap, victim peer, attacker node)."""
    return swarm_trio


def announce_victim(victim: SwarmNode, model: str) -> None:
    assert victim.announce(PeerRecord(victim.peer_id, model, LayerRange(0, 4), num_layers=8, throughput=5.0), ttl=30)


def test_subkey_owner_is_the_nodes_peer_id(trio) -> None:
    _, victim, attacker = trio
    assert owner_of(victim.signer.owned("x")) == ("x", victim.peer_id)
    assert owner_of(attacker.signer.owned(victim.peer_id)) == (victim.peer_id, attacker.peer_id)
    assert owner_of("plain-subkey") is None and owner_of(b"bytes") is None
    assert owner_of("x[owner:ssh-rsa AAAAnotakey]") is None
    assert peer_id_of(b"garbage") is None


def test_record_with_infinite_layers_is_dropped_and_view_works(trio) -> None:
    bootstrap, victim, attacker = trio
    model = unique_model()
    announce_victim(victim, model)
    bad = PeerRecord(attacker.peer_id, model, LayerRange(0, 4), num_layers=8).to_dict()
    bad["layers"] = [0, float("inf")]
    # Before: int(inf) raised OverflowError out of fetch_view, for every reader of the model.
    assert attacker.dht.store(model_key(model), bad, get_dht_time() + 30, subkey=attacker.signer.owned(attacker.peer_id))
    for reader in (bootstrap, attacker):
        view = settle(lambda r=reader: r.fetch_view(model), lambda v: v.records)
        assert set(view.records) == {victim.peer_id}
        assert view.records[victim.peer_id].layers == LayerRange(0, 4)


@pytest.mark.parametrize("claim", [
    {"throughput": 1e9}, {"throughput": float("nan")}, {"layers": [0, 30]}, {"num_layers": 10**9},
    {"public_name": "x" * 10_000}, {"addrs": ["/ip4/1.2.3.4/tcp/1"] * 1000}, {"free_pages": -1},
    {"moving_to": [4, 30]}, {"moving_to": [6, 5]}, {"standby": "yes"},
    {"loading_order": [3, 4]}, {"loading_order": [5, 5]}, {"loading_order": [4.5]},
])
def test_out_of_range_claims_are_dropped_alone(trio, claim) -> None:
    bootstrap, victim, attacker = trio
    model = unique_model()
    announce_victim(victim, model)
    honest = PeerRecord(attacker.peer_id, model, LayerRange(4, 8), num_layers=8).to_dict()
    lie = {**honest, **claim}
    assert attacker.dht.store(model_key(model), lie, get_dht_time() + 30, subkey=attacker.signer.owned(attacker.peer_id))
    view = settle(lambda: bootstrap.fetch_view(model, num_layers=8), lambda v: v.records)
    assert set(view.records) == {victim.peer_id}, f"{claim} was accepted"
    assert view.uncovered_layers() == [4, 5, 6, 7]


def test_far_future_offline_record_under_victims_subkey_is_refused(trio) -> None:
    bootstrap, victim, attacker = trio
    model = unique_model()
    announce_victim(victim, model)
    offline = PeerRecord(victim.peer_id, model, LayerRange(0, 4), num_layers=8, state=PeerState.OFFLINE).to_dict()
    key = model_key(model)
    # Before: stored under the victim's plain subkey with expiration +1 year, it hid the victim
    # and hivemind then refused the victim's own re-announcements (earlier expiration).
    assert not attacker.dht.store(key, offline, get_dht_time() + 86400 * 365, subkey=victim.signer.owned(victim.peer_id))
    assert not attacker.dht.store(key, offline, get_dht_time() + 60, subkey=victim.signer.owned(victim.peer_id))
    attacker.dht.store(key, offline, get_dht_time() + 60, subkey=victim.peer_id)  # unowned: ignored by readers
    # its own subkey, far future: refused by every honest node (beyond MAX_TTL)
    assert not attacker.dht.store(key, offline, get_dht_time() + MAX_TTL * 10, subkey=attacker.signer.owned(victim.peer_id))
    view = settle(lambda: bootstrap.fetch_view(model), lambda v: v.records)
    assert set(view.records) == {victim.peer_id}
    assert view.records[victim.peer_id].state is PeerState.ONLINE
    # and the victim's next announcement still replaces its record
    time.sleep(0.05)
    victim.announce(PeerRecord(victim.peer_id, model, LayerRange(0, 4), num_layers=8, throughput=7.0), ttl=30)
    view = settle(lambda: bootstrap.fetch_view(model), lambda v: v.records[victim.peer_id].throughput == 7.0)
    assert view.records[victim.peer_id].throughput == 7.0


def test_announce_refuses_ttl_beyond_max(trio) -> None:
    _, victim, _ = trio
    with pytest.raises(ValueError, match="ttl"):
        victim.announce(PeerRecord(victim.peer_id, unique_model(), LayerRange(0, 1)), ttl=MAX_TTL * 2)


def test_reports_only_count_as_the_reporters_own_word(trio) -> None:
    bootstrap, victim, attacker = trio
    model = unique_model()
    assert asyncio.run(attacker.report_async(model, victim.peer_id, "wrong output"))
    forged = {"peer_id": victim.peer_id, "reporter": bootstrap.peer_id, "reason": "forged", "time": time.time()}
    attacker.dht.store(reports_key(model), forged, get_dht_time() + 60, subkey=attacker.signer.owned(victim.peer_id + "x"))
    attacker.dht.store(reports_key(model), forged, get_dht_time() + 60, subkey=f"{victim.peer_id}|{bootstrap.peer_id}")
    reports = settle(lambda: asyncio.run(bootstrap.fetch_reports_async(model)), bool)
    assert list(reports) == [victim.peer_id]
    assert [r["reporter"] for r in reports[victim.peer_id]] == [attacker.peer_id]


def test_suspects_are_the_reporters_own_word_and_the_newest_announcement_wins(trio) -> None:
    """Two reporters suspect the victim about two announcements: the newer counts. A value under
    another node's name, an unowned subkey, or a non-finite `announced` is dropped."""
    bootstrap, victim, attacker = trio
    model = unique_model()
    assert asyncio.run(attacker.report_unreachable_async(model, victim.peer_id, 100.0))
    assert asyncio.run(bootstrap.report_unreachable_async(model, victim.peer_id, 250.0))
    forged = {"peer_id": attacker.peer_id, "reporter": bootstrap.peer_id, "announced": 1.0, "time": time.time()}
    attacker.dht.store(suspects_key(model), forged, get_dht_time() + 60, subkey=attacker.signer.owned(attacker.peer_id))
    attacker.dht.store(suspects_key(model), forged, get_dht_time() + 60, subkey=f"{attacker.peer_id}|x")
    nan = {"peer_id": bootstrap.peer_id, "reporter": attacker.peer_id, "announced": float("nan"), "time": time.time()}
    attacker.dht.store(suspects_key(model), nan, get_dht_time() + 60, subkey=attacker.signer.owned(bootstrap.peer_id))
    suspects = settle(lambda: asyncio.run(victim.fetch_suspects_async(model)), lambda s: s.get(victim.peer_id) == 250.0)
    assert suspects == {victim.peer_id: 250.0}


def test_private_swarm_stranger_cannot_erase_or_read_members(swarm_node_factory, tmp_path) -> None:
    SwarmKey.generate(tmp_path / "swarm.key")
    key = SwarmKey.load(tmp_path / "swarm.key")
    member = swarm_node_factory(swarm_key=key)
    reader = swarm_node_factory(swarm_key=key, initial_peers=member.visible_maddrs(), client_mode=True)
    stranger = swarm_node_factory(initial_peers=member.visible_maddrs())
    model = unique_model()
    assert member.announce(PeerRecord(member.peer_id, model, LayerRange(0, 2), num_layers=2), ttl=30)
    dht_key = key.dht_key(model_key(model))
    # The stranger sees the derived key's subkeys only as owner markers: no model name, and the
    # registry's subkey is a hash of the model name.
    found = settle(lambda: stranger.dht.get(key.dht_key("layerswarm/v1/models"), latest=True), bool)
    assert found is not None and all(model not in subkey for subkey in found.value)
    # Overwriting the member's subkey needs its key; its own or unowned subkeys are dropped.
    offline = PeerRecord(member.peer_id, model, LayerRange(0, 2), num_layers=2, state=PeerState.OFFLINE).to_dict()
    assert not stranger.dht.store(dht_key, b"x" * 40, get_dht_time() + 60, subkey=member.signer.owned(member.peer_id))
    stranger.dht.store(dht_key, offline, get_dht_time() + 60, subkey=stranger.signer.owned(member.peer_id))
    stranger.dht.store(dht_key, offline, get_dht_time() + 60, subkey=member.peer_id)
    view = settle(lambda: reader.fetch_view(model), lambda v: v.records)
    assert set(view.records) == {member.peer_id} and view.records[member.peer_id].state is PeerState.ONLINE
    assert reader.list_models().get(model) == 2


def test_world_readable_identity_is_refused(swarm_node_factory, tmp_path) -> None:
    path = str(tmp_path / "peer.key")
    swarm_node_factory(identity_path=path).shutdown()
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        SwarmNode(identity_path=path)
