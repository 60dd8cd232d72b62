"""SwarmNode against real hivemind DHT nodes on 127.0.0.1."""

from __future__ import annotations

import os
import stat
import time
import uuid

import pytest
from hivemind.utils import get_dht_time

from swarm.dht import MODELS_KEY, model_key
from swarm.types import LayerRange, PeerRecord, PeerState


def unique_model() -> str:
    return f"test-model-{uuid.uuid4().hex[:8]}"


def wait_for(fetch, check=bool, timeout: float = 10.0):
    """Poll a DHT read until `check(value)` holds; return the last value read either way."""
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if check(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_announce_and_fetch_across_nodes(swarm_trio) -> None:
    bootstrap, server, client = swarm_trio
    model = unique_model()
    assert server.announce(
        PeerRecord(server.peer_id, model, LayerRange(0, 4), num_layers=8, throughput=3.5), ttl=30
    )
    assert bootstrap.announce(PeerRecord(bootstrap.peer_id, model, LayerRange(4, 8), num_layers=8), ttl=30)
    view = wait_for(lambda: client.fetch_view(model), lambda v: len(v.records) == 2)
    assert len(view.records) == 2, "client did not see both records"
    assert view.model == model and view.num_layers == 8
    assert view.records[server.peer_id].layers == LayerRange(0, 4)
    assert view.records[server.peer_id].throughput == 3.5
    assert view.uncovered_layers() == []
    assert client.fetch_view(model, num_layers=10).num_layers == 10
    assert client.fetch_view(unique_model()).records == {}


def test_reannounce_replaces_record(swarm_trio) -> None:
    _, server, client = swarm_trio
    model = unique_model()
    server.announce(PeerRecord(server.peer_id, model, LayerRange(0, 4), num_layers=4), ttl=30)
    time.sleep(0.05)  # a strictly later expiration wins
    server.announce(
        PeerRecord(server.peer_id, model, LayerRange(0, 4), num_layers=4, state=PeerState.OFFLINE), ttl=30
    )
    view = wait_for(lambda: client.fetch_view(model), lambda v: v.records and not v.online())
    assert view.records[server.peer_id].state is PeerState.OFFLINE


def test_announce_refuses_foreign_peer_id(swarm_trio) -> None:
    _, server, client = swarm_trio
    with pytest.raises(ValueError):
        server.announce(PeerRecord(client.peer_id, unique_model(), LayerRange(0, 1)), ttl=30)


def test_unknown_fields_ignored_and_bad_records_dropped(swarm_trio) -> None:
    _, server, client = swarm_trio
    model = unique_model()
    expiration = get_dht_time() + 30
    key = model_key(model)
    future_record = PeerRecord(server.peer_id, model, LayerRange(2, 6), num_layers=6).to_dict()
    future_record["shiny_new_field"] = {"nested": [1, 2]}
    assert server.dht.store(key, future_record, expiration, subkey=server.signer.owned(server.peer_id))
    # malformed records, a record naming another peer, one of another model, and junk: each
    # signed by the client under its own subkey (other subkeys are refused or ignored)
    liar = PeerRecord(server.peer_id, model, LayerRange(0, 6), num_layers=6).to_dict()
    other = PeerRecord(client.peer_id, "another-model", LayerRange(0, 6), num_layers=6).to_dict()
    for i, junk in enumerate([{"peer_id": "x", "layers": "oops"}, liar, other, "not even a map"]):
        assert client.dht.store(key, junk, expiration + i, subkey=client.signer.owned(client.peer_id))
        view = wait_for(lambda: client.fetch_view(model), lambda v: v.records)
        assert set(view.records) == {server.peer_id}
    server.dht.store(key, liar, expiration, subkey="someone-else")  # unsigned: nobody owns it
    view = wait_for(lambda: client.fetch_view(model), lambda v: v.records)
    assert set(view.records) == {server.peer_id}
    assert view.records[server.peer_id].layers == LayerRange(2, 6)
    assert view.num_layers == 6


def test_expired_records_vanish(swarm_trio) -> None:
    _, server, client = swarm_trio
    model = unique_model()
    assert server.announce(PeerRecord(server.peer_id, model, LayerRange(0, 2), num_layers=2), ttl=1.5)
    assert wait_for(lambda: client.fetch_view(model).records)
    time.sleep(2.0)
    assert client.fetch_view(model).records == {}
    assert server.fetch_view(model).records == {}


def test_registry_lists_models(swarm_trio) -> None:
    bootstrap, server, client = swarm_trio
    a, b = unique_model(), unique_model()
    server.announce(PeerRecord(server.peer_id, a, LayerRange(0, 2), num_layers=24), ttl=30)
    # a shorter ttl for the shared registry entry is refused by hivemind; announce still succeeds
    assert bootstrap.announce(PeerRecord(bootstrap.peer_id, a, LayerRange(2, 4), num_layers=24), ttl=20)
    bootstrap.announce(PeerRecord(bootstrap.peer_id, b, LayerRange(0, 4), num_layers=32), ttl=30)
    client.dht.store(MODELS_KEY, {"model": "malformed-" + a, "num_layers": "many"}, get_dht_time() + 30,
                     subkey=client.signer.owned("malformed-" + a))
    client.dht.store(MODELS_KEY, {"model": "unsigned-" + a, "num_layers": 3}, get_dht_time() + 30,
                     subkey="unsigned-" + a)
    models = wait_for(client.list_models, lambda m: {a, b} <= set(m))
    assert models[a] == 24 and models[b] == 32
    assert "malformed-" + a not in models and "unsigned-" + a not in models


async def test_async_variants(swarm_trio) -> None:
    _, server, client = swarm_trio
    model = unique_model()
    assert await server.announce_async(
        PeerRecord(server.peer_id, model, LayerRange(0, 3), num_layers=3), ttl=30
    )
    view = await client.fetch_view_async(model)
    assert set(view.records) == {server.peer_id} and view.num_layers == 3
    assert (await client.list_models_async())[model] == 3


def test_identity_file_persists_peer_id(swarm_node_factory, tmp_path) -> None:
    path = str(tmp_path / "peer.key")
    first = swarm_node_factory(identity_path=path)
    peer_id = first.peer_id
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first.shutdown()
    second = swarm_node_factory(identity_path=path)
    assert second.peer_id == peer_id
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert second.visible_maddrs()[0].endswith(f"/p2p/{peer_id}")


def test_context_manager_and_cleanup(swarm_node_factory) -> None:
    node = swarm_node_factory()
    with node as same:
        assert same is node and node.dht.is_alive()
    assert not node.dht.is_alive()
    node.shutdown()  # idempotent
