"""What `view` relays: `SwarmNode.fetch_signed_view_async` against real hivemind nodes on 127.0.0.1.

Every record it keeps comes with the exact value its owner signed in the DHT (hivemind's own
validator accepts those bytes, and refuses them with one byte changed), and nothing else does.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.dht import model_key
from swarm.records import SignedRecord, dht_key_bytes, open_signed, owner_of
from swarm.types import LayerRange, PeerRecord
from tests.test_records import settle


def _announce_pair(bootstrap: Any, server: Any, prefix: str) -> tuple[str, str]:
    """Both nodes announce half of a fresh 8-layer model at 5 tokens/s; returns (model, DHT key)."""
    model = f"{prefix}-{uuid.uuid4().hex[:8]}"
    for node, (a, b) in ((bootstrap, (0, 4)), (server, (4, 8))):
        assert node.announce(PeerRecord(node.peer_id, model, LayerRange(a, b), num_layers=8, throughput=5.0), ttl=30)
    return model, model_key(model)


def _flip_throughput_byte(value: bytes) -> bytes:
    """The signed value with one byte of its throughput float changed."""
    at = value.index(b"throughput") + 11
    return value[:at] + bytes([value[at] ^ 1]) + value[at + 1:]


def test_signed_view_carries_each_record_as_its_owner_signed_it(swarm_trio) -> None:
    bootstrap, server, stranger = swarm_trio
    model, key = _announce_pair(bootstrap, server, "signed")
    # A stranger speaks for the server, signed with its own key under the server's name: dropped.
    lie = PeerRecord(server.peer_id, model, LayerRange(0, 8), num_layers=8, throughput=1e5).to_dict()
    assert stranger.dht.store(key, lie, get_dht_time() + 30, subkey=stranger.signer.owned(server.peer_id))

    for reader in (bootstrap, stranger):  # one stores the key, the other reads it from others
        view, signed = settle(lambda r=reader: asyncio.run(r.fetch_signed_view_async(model)),
                              lambda found: len(found[0].records) == 2)
        assert set(view.records) == set(signed) == {bootstrap.peer_id, server.peer_id}
        assert view.records[server.peer_id].throughput == 5.0  # the stranger's lie is not among them
        assert asyncio.run(reader.fetch_view_async(model)).records == view.records
        for peer, entry in signed.items():
            subkey, value = open_signed(key, entry, reader.signer)
            assert owner_of(subkey) == (peer, peer)
            assert PeerRecord.from_dict(value) == view.records[peer]
            stored = DHTRecord(dht_key_bytes(key), entry.subkey, entry.value, entry.expiration_time)
            assert reader.signer.validator.validate(stored)  # hivemind's validator, on the relayed bytes
            tampered = _flip_throughput_byte(entry.value)
            assert not reader.signer.validator.validate(DHTRecord(stored.key, stored.subkey, tampered,
                                                                  stored.expiration_time))
            assert open_signed(model_key("another-model"), entry, reader.signer) is None


async def _plant(key: str, record: SignedRecord, _dht: Any, node: Any) -> bool:
    """(In the DHT process.) Put a value straight into local storage, past every validator."""
    subkey = MSGPackSerializer.loads(record.subkey)
    return node.protocol.storage.store_subkey(DHTID.generate(source=key), subkey, record.value, record.expiration_time)


def test_a_value_that_does_not_verify_is_never_relayed(swarm_trio) -> None:
    """Even one that reached a reader's own storage unchecked: the reader checks again before relaying."""
    bootstrap, server, reader = swarm_trio
    model, key = _announce_pair(bootstrap, server, "planted")
    _, signed = settle(lambda: asyncio.run(reader.fetch_signed_view_async(model)), lambda found: len(found[1]) == 2)
    good = signed[server.peer_id]
    forged = SignedRecord(good.subkey, _flip_throughput_byte(good.value),
                          good.expiration_time + 5.0)  # newer: the DHT keeps it over the true one
    assert reader.dht.run_coroutine(functools.partial(_plant, key, forged))
    # hivemind's get does not check its own storage again: the plain view now holds the forgery ...
    assert asyncio.run(reader.fetch_view_async(model)).records[server.peer_id].throughput == 5.0 * 2**16
    view, signed = asyncio.run(reader.fetch_signed_view_async(model))
    assert set(signed) == set(view.records) == {bootstrap.peer_id}  # ... the signed view drops it, relays nothing
