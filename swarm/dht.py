"""`SwarmNode`: a thin synchronous wrapper over hivemind.DHT for announcing and finding peers.

DHT key layout (documented in docs/protocol.md); OWNED(x) is `x + "[owner:<writer's public key>]"`:
  layerswarm/v1/model/{model}   subkey = OWNED(peer id)     value = PeerRecord.to_dict()
  layerswarm/v1/models          subkey = OWNED(model tag)   value = {"model": str, "num_layers": int}
  layerswarm/v1/reports/{model} subkey = OWNED(peer id)     value = {peer_id, reporter, reason, time}
  layerswarm/v1/suspects/{model} subkey = OWNED(peer id)    value = {peer_id, reporter, announced, time}
Only the owner's key can write an owned subkey (signed records, swarm/records.py); readers keep a
value only when its owner is the peer it names, and range-check every field (PeerRecord.from_dict).
In a private swarm (`swarm_key`), each key is replaced by `SwarmKey.dht_key(key)`, the model tag
is hashed the same way, and each value is its msgpack bytes sealed with the swarm key (swarm/auth.py).
Every value expires at announce time + ttl (at most records.MAX_TTL), so peers that stop announcing vanish.

hivemind runs the DHT in a child process (which owns the p2pd daemon); calls here block
on a pipe to it. From async code use the `*_async` variants so the event loop keeps running.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import hivemind
import msgpack
from hivemind.dht.routing import DHTID
from hivemind.dht.storage import DictionaryDHTValue
from hivemind.p2p import P2P
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.auth import SwarmKey
from swarm.identity import ensure_identity, ephemeral_identity, load_identity
from swarm.lifeline import GuardedDHT
from swarm.records import MAX_TTL, RecordSigner, SignedRecord, open_signed, owner_of
from swarm.types import MAX_NUM_LAYERS, MAX_STR, PeerRecord, SwarmView

logger = logging.getLogger(__name__)

KEY_PREFIX = "layerswarm/v1"
MODELS_KEY = f"{KEY_PREFIX}/models"


REPORT_TTL = MAX_TTL  # a report of a lying peer stays visible for an hour
# A report that a peer could not be dialled matters until the peers have probed it (one watch
# period, peer/balancer.py) or its record has expired (its TTL, 30 s by default) anyway.
SUSPECT_TTL = 60.0
MAX_VALUES_READ = 4096  # subkeys of one key parsed per read; a flood of signed junk costs no more


def model_key(model: str) -> str:
    return f"{KEY_PREFIX}/model/{model}"


def reports_key(model: str) -> str:
    return f"{KEY_PREFIX}/reports/{model}"


def suspects_key(model: str) -> str:
    return f"{KEY_PREFIX}/suspects/{model}"


class SwarmNode:
    """One DHT participant. `client_mode=True` nodes can read and write but are not reachable."""

    def __init__(
        self,
        initial_peers: Iterable[str] = (),
        host_maddrs: Iterable[str] = ("/ip4/127.0.0.1/tcp/0",),
        identity_path: str | None = None,
        client_mode: bool = False,
        start_timeout: float = 30,
        swarm_key: SwarmKey | None = None,
        announce_maddrs: Iterable[str] | None = None,
        use_relay: bool = True,
        relayed: bool = False,
    ) -> None:
        """`announce_maddrs`: what others should dial (None: what the daemon sees itself listening on).
        `use_relay`: dial peers that are reachable only through a libp2p circuit relay, and relay for
        others. `relayed`: nobody can dial us (swarm/reachability.py found out): join as a DHT client
        and reserve a slot on a relay (by default the initial peers) through which others reach us."""
        self.swarm_key = swarm_key  # private swarm: keys derived, values sealed (see swarm/auth.py)
        initial_peers = list(initial_peers)
        kwargs: dict[str, Any] = {"use_relay": use_relay or relayed}
        if relayed:
            # Forced "private": libp2p's AutoNAT needs several peers to decide, autorelay waits for it.
            # Relays to reserve a slot on: the initial peers, offered at once (else p2pd finds them
            # through the DHT a minute later). libp2p still waits for more candidates or ~3 min.
            kwargs.update(use_auto_relay=True, force_reachability="private", trusted_relays=list(initial_peers))
            client_mode = True
        if announce_maddrs:
            kwargs["announce_maddrs"] = list(announce_maddrs)
        # Every node has a key on file: p2pd names the node after it and records are signed with it.
        temporary = None
        if identity_path is not None:
            ensure_identity(identity_path)
        else:
            identity_path, temporary = ephemeral_identity()
            kwargs["check_if_identity_free"] = False  # a fresh key: asking the swarm costs seconds for nothing
        self.signer = RecordSigner(load_identity(identity_path))
        self.dht = GuardedDHT(  # its child process and p2pd die with this process (swarm/lifeline.py)
            initial_peers=list(initial_peers),
            host_maddrs=list(host_maddrs),
            client_mode=client_mode,
            start=False,
            identity_path=identity_path,
            record_validators=self.signer.validators(),
            **kwargs,
        )
        try:
            self.dht.run_in_background(await_ready=True, timeout=start_timeout)
        except BaseException:
            self.dht.shutdown()
            raise
        finally:
            if temporary is not None:
                temporary.cleanup()  # p2pd has read it; the key also lives on in self.signer
        self.peer_id: str = self.dht.peer_id.to_base58()
        self._daemon_maddr: Any = None  # p2pd control address, fetched on first replicate_p2p

    # ---- lifecycle -------------------------------------------------------------------------
    def visible_maddrs(self) -> list[str]:
        """Multiaddrs other nodes can use as initial_peers, each ending in /p2p/<peer id>."""
        return [str(m) for m in self.dht.get_visible_maddrs()]

    async def replicate_p2p(self) -> P2P:
        """A NEW P2P object bound to the calling event loop, sharing this node's p2pd daemon.

        Unlike hivemind's `DHT.replicate_p2p` (one cached replica per process, tied to the loop
        that made it) every call returns a fresh replica that the caller owns: use it only on
        this loop, and `await p2p.shutdown()` before the loop ends (that closes the replica's
        control socket, not the daemon). It works while this node is alive.
        """
        if self._daemon_maddr is None:
            future = self.dht.run_coroutine(hivemind.DHT._get_p2p_daemon_listen_maddr, return_future=True)
            self._daemon_maddr = await future
        return await P2P.replicate(self._daemon_maddr)

    def shutdown(self) -> None:
        """Stop the DHT child process and its p2pd daemon. Idempotent."""
        self.dht.shutdown()

    def __enter__(self) -> SwarmNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ---- announce ---------------------------------------------------------------------------
    def announce(self, record: PeerRecord, ttl: float) -> bool:
        """Store the record under its model key (and the model in the registry); True if the record was stored.

        hivemind keeps, per (key, subkey), the value with the LATEST expiration and refuses
        older ones: keep `ttl` constant for a peer so each announcement replaces the last
        (including the final OFFLINE one). The registry entry is shared by all peers of a
        model, so its store is refused whenever another peer's entry expires later: that is
        expected and not reported.
        """
        record_future, registry_future = self._announce_futures(record, ttl)
        registry_future.result()
        return bool(record_future.result())

    async def announce_async(self, record: PeerRecord, ttl: float) -> bool:
        record_future, registry_future = self._announce_futures(record, ttl)
        await registry_future
        return bool(await record_future)

    def _announce_futures(self, record: PeerRecord, ttl: float) -> list[Any]:
        if record.peer_id != self.peer_id:
            raise ValueError(f"record.peer_id {record.peer_id} is not this node's id {self.peer_id}")
        if not 0 < ttl <= MAX_TTL:
            raise ValueError(f"ttl {ttl} must be in (0, {MAX_TTL:g}] seconds: other nodes refuse longer ones")
        expiration = get_dht_time() + ttl
        record_key, models_key = self._key(model_key(record.model)), self._key(MODELS_KEY)
        return [
            self.dht.store(
                record_key,
                self._seal(record.to_dict(), record_key),
                expiration,
                subkey=self.signer.owned(record.peer_id),
                return_future=True,
            ),
            self.dht.store(
                models_key,
                self._seal({"model": record.model, "num_layers": record.num_layers}, models_key),
                expiration,
                subkey=self.signer.owned(self._model_tag(record.model)),
                return_future=True,
            ),
        ]

    # ---- private swarms: the same layout under derived keys, with sealed values ----------------
    def _key(self, name: str) -> str:
        return name if self.swarm_key is None else self.swarm_key.dht_key(name)

    def _model_tag(self, model: str) -> str:
        """The registry subkey's name for `model`: hashed in a private swarm, so strangers cannot read it."""
        return model if self.swarm_key is None else self.swarm_key.dht_key(model)[-32:]

    def _seal(self, value: dict[str, Any], key: str) -> Any:
        if self.swarm_key is None:
            return value
        return self.swarm_key.seal(msgpack.packb(value, use_bin_type=True), key)

    def _unseal(self, found: Any, key: str) -> dict[tuple[str, str], Any]:
        """{(name, owner peer id): value} of a DHT entry's owned subkeys.

        Unowned subkeys (anyone could have written them) are dropped, and in a private swarm
        so are values its members did not seal.
        """
        return self._open(_subkey_values(found), key)

    def _open(self, values: Mapping[Any, Any], key: str) -> dict[tuple[str, str], Any]:
        """`_unseal` of {subkey: value} already taken out of a DHT entry."""
        opened = {}
        for subkey, value in values.items():
            owner = owner_of(subkey)
            if owner is None:
                logger.debug(f"dropping a value under the unsigned subkey {subkey!r:.100}")
                continue
            if self.swarm_key is not None:
                plain = self.swarm_key.open(value, key)
                if plain is None:
                    logger.debug(f"dropping a value of {owner[1]} not sealed with this swarm's key")
                    continue
                try:
                    value = msgpack.unpackb(plain, raw=False, strict_map_key=False)
                except Exception:
                    continue
            opened[owner] = value
        return opened

    # ---- reports about other peers: each reporter's own word, under a subkey only it can write --
    async def _accuse(self, key_name: str, peer_id: str, fields: dict[str, Any], ttl: float) -> bool:
        key = self._key(key_name)
        value = {"peer_id": peer_id, "reporter": self.peer_id, **fields, "time": time.time()}
        return bool(await self.dht.store(key, self._seal(value, key), get_dht_time() + ttl,
                                         subkey=self.signer.owned(peer_id), return_future=True))

    async def _accusations(self, key_name: str) -> Iterable[tuple[str, dict[str, Any]]]:
        """(accused peer id, value) of the reports under `key_name` that are their reporter's own
        word about the peer they name, with a finite `time`: the key's other fields are unchecked."""
        key = self._key(key_name)
        found = self._unseal(await self.dht.get(key, latest=True, return_future=True), key)
        return [(accused, value) for (accused, reporter), value in found.items()
                if isinstance(value, dict) and value.get("peer_id") == accused and value.get("reporter") == reporter
                and _finite(value.get("time"))]

    async def report_async(self, model: str, peer_id: str, reason: str) -> bool:
        """Tell the swarm (and its monitor) that `peer_id` returned wrong results to us."""
        return await self._accuse(reports_key(model), peer_id, {"reason": reason[:200]}, REPORT_TTL)

    async def fetch_reports_async(self, model: str) -> dict[str, list[dict[str, Any]]]:
        """peer id -> the reports against it (one per reporter), newest data from the DHT."""
        out: dict[str, list[dict[str, Any]]] = {}
        for accused, value in await self._accusations(reports_key(model)):
            if isinstance(value.get("reason"), str) and len(value["reason"]) <= 200:
                out.setdefault(accused, []).append(value)
        return out

    async def report_unreachable_async(self, model: str, peer_id: str, announced: float) -> bool:
        """Tell the peers that we could not dial `peer_id` as announced at `announced` (its record's
        `updated`). A claim, not a verdict: each peer probes the suspect itself (peer/crash_watch.py)."""
        return await self._accuse(suspects_key(model), peer_id, {"announced": announced}, SUSPECT_TTL)

    async def fetch_suspects_async(self, model: str) -> dict[str, float]:
        """peer id -> the newest of its announcements some reporter could not dial."""
        out: dict[str, float] = {}
        for accused, value in await self._accusations(suspects_key(model)):
            if _finite(value.get("announced")):
                out[accused] = max(out.get(accused, -math.inf), float(value["announced"]))
        return out

    # ---- fetch ------------------------------------------------------------------------------
    def fetch_view(self, model: str, num_layers: int | None = None) -> SwarmView:
        """Snapshot of the live records for `model`; malformed or mislabelled records are dropped."""
        key = self._key(model_key(model))
        found = self._unseal(self.dht.get(key, latest=True), key)
        return _build_view(model, num_layers, found, self.list_models if num_layers is None else None)

    async def fetch_view_async(self, model: str, num_layers: int | None = None) -> SwarmView:
        key = self._key(model_key(model))
        found = self._unseal(await self.dht.get(key, latest=True, return_future=True), key)
        models = await self.list_models_async() if num_layers is None else {}
        return _build_view(model, num_layers, found, lambda: models)

    async def fetch_signed_view_async(
        self, model: str, num_layers: int | None = None
    ) -> tuple[SwarmView, dict[str, SignedRecord]]:
        """`fetch_view_async`, plus each kept record's value exactly as its owner signed it (for `view`).

        Every signature is checked here again (`open_signed`), whoever stored the value, so
        nothing relayed from this map is unverified.
        """
        key = self._key(model_key(model))
        stored = await self.dht.run_coroutine(functools.partial(_stored_values, key), return_future=True)
        found: dict[tuple[str, str], Any] = {}
        signed: dict[tuple[str, str], SignedRecord] = {}
        for record in stored:
            opened = open_signed(key, record, self.signer)
            if opened is None:
                logger.debug(f"dropping a value of {key!r:.80} whose signature does not verify")
                continue
            for name_owner, value in self._open({opened[0]: opened[1]}, key).items():  # unsealed, owned
                found[name_owner], signed[name_owner] = value, record
        models = await self.list_models_async() if num_layers is None else {}
        view = _build_view(model, num_layers, found, lambda: models)
        return view, {peer: signed[(peer, peer)] for peer in view.records}

    def list_models(self) -> dict[str, int]:
        """model name -> num_layers, for every model some peer announced recently."""
        key = self._key(MODELS_KEY)
        return self._parse_registry(self._unseal(self.dht.get(key, latest=True), key))

    async def list_models_async(self) -> dict[str, int]:
        key = self._key(MODELS_KEY)
        return self._parse_registry(self._unseal(await self.dht.get(key, latest=True, return_future=True), key))

    def _parse_registry(self, values: Mapping[tuple[str, str], Any]) -> dict[str, int]:
        """model -> num_layers; when peers disagree, the count most of them announce (ties: the larger)."""
        votes: dict[str, Counter[int]] = {}
        for (tag, _owner), value in values.items():
            model = value.get("model") if isinstance(value, dict) else None
            n = value.get("num_layers") if isinstance(value, dict) else None
            if (isinstance(model, str) and len(model) <= MAX_STR and tag == self._model_tag(model)
                    and type(n) is int and 0 <= n <= MAX_NUM_LAYERS):
                votes.setdefault(model, Counter())[n] += 1
            else:
                logger.debug(f"dropping malformed registry entry {tag!r:.100}: {value!r:.200}")
        return {model: _most_announced(counts) for model, counts in votes.items()}


def _finite(value: Any) -> bool:
    """A real number (bool excluded), neither NaN nor infinite: what a report's times must be."""
    return type(value) in (int, float) and math.isfinite(value)


def _subkey_values(found: Any) -> Mapping[Any, Any]:
    """Unwrap hivemind's ValueWithExpiration(dict[subkey, ValueWithExpiration]) into {subkey: value}."""
    if found is None or not isinstance(found.value, dict):
        return {}
    return {subkey: item.value for subkey, item in itertools.islice(found.value.items(), MAX_VALUES_READ)}


async def _stored_values(key: str, _dht: Any, node: Any) -> list[SignedRecord]:
    """(Runs in the DHT process.) Every live subkey of `key` as stored, signature included.

    hivemind's get merges all it finds into this node's storage or cache entry for the key (the
    first candidate's dict is updated in place, a newer result is cached: DHTNode._cache_new_result),
    so those two entries, read right after a full search, hold the signed bytes of every value found.
    """
    await node.get(key, latest=True)
    key_id = DHTID.generate(source=key)
    latest: dict[Any, tuple[bytes, float]] = {}
    for entry in (node.protocol.storage.get(key_id), node.protocol.cache.get(key_id)):
        if entry is not None and isinstance(entry.value, DictionaryDHTValue):
            for subkey, (value, expiration) in entry.value.items():
                if subkey not in latest or expiration > latest[subkey][1]:
                    latest[subkey] = (value, expiration)
    return [SignedRecord(MSGPackSerializer.dumps(subkey), value, expiration)
            for subkey, (value, expiration) in itertools.islice(latest.items(), MAX_VALUES_READ)]


def _most_announced(counts: Counter[int]) -> int:
    return max(counts.items(), key=lambda item: (item[1], item[0]))[0]


def _build_view(model: str, num_layers: int | None, found: Mapping[tuple[str, str], Any], models: Any) -> SwarmView:
    """The view of `model`: each record checked alone, so one bad record never hides the others."""
    records: dict[str, PeerRecord] = {}
    for (name, owner), value in found.items():
        try:
            record = PeerRecord.from_dict(value)
        except ValueError as e:
            logger.debug(f"dropping malformed record of {owner}: {e}")
            continue
        # Only a peer's own key may speak for it: a record naming another peer is a lie or a bug.
        if record.peer_id != owner or name != owner or record.model != model:
            logger.debug(f"dropping record for {record.peer_id}/{record.model} signed by {owner} as {name!r:.80}")
            continue
        records[owner] = record
    if num_layers is None:
        announced = Counter(r.num_layers for r in records.values() if r.num_layers > 0)
        num_layers = _most_announced(announced) if announced else (models() if models else {}).get(model, 0)
    # Layers beyond the model are a liar's or a misconfigured peer's: routing must never see them.
    records = {peer: r for peer, r in records.items() if not num_layers or r.layers.end <= num_layers}
    return SwarmView(model=model, num_layers=num_layers, records=records)
