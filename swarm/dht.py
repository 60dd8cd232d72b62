"""`SwarmNode`: a thin synchronous wrapper over hivemind.DHT for announcing and finding peers.

DHT key layout (documented in docs/protocol.md):
  layerswarm/v1/model/{model}   subkey = peer id (base58)   value = PeerRecord.to_dict()
  layerswarm/v1/models          subkey = model name         value = {"num_layers": int}
  layerswarm/v1/reports/{model} subkey = "peer|reporter"    value = {peer_id, reporter, reason, time}
In a private swarm (`swarm_key`), each key is replaced by `SwarmKey.dht_key(key)` and each value
by its msgpack bytes sealed with the swarm key (swarm/auth.py).
Every value expires at announce time + ttl, so peers that stop announcing vanish.

hivemind runs the DHT in a child process (which owns the p2pd daemon); calls here block
on a pipe to it. From async code use the `*_async` variants so the event loop keeps running.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from typing import Any

import hivemind
import msgpack
from hivemind.p2p import P2P
from hivemind.utils import get_dht_time

from swarm.auth import SwarmKey
from swarm.types import PeerRecord, SwarmView

logger = logging.getLogger(__name__)

KEY_PREFIX = "layerswarm/v1"
MODELS_KEY = f"{KEY_PREFIX}/models"


REPORT_TTL = 3600.0  # a report of a lying peer stays visible for an hour


def model_key(model: str) -> str:
    return f"{KEY_PREFIX}/model/{model}"


def reports_key(model: str) -> str:
    return f"{KEY_PREFIX}/reports/{model}"


def ensure_identity(path: str) -> None:
    """Create a libp2p private key at `path` (mode 0600) unless one exists, so the peer id survives restarts."""
    if os.path.exists(path):
        return
    P2P.generate_identity(path)  # hivemind's own format (protobuf RSA key), chmods it 0400
    os.chmod(path, 0o600)  # owner may rewrite it later (e.g. rotate); still private


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
    ) -> None:
        self.swarm_key = swarm_key  # private swarm: keys derived, values sealed (see swarm/auth.py)
        kwargs: dict[str, Any] = {}
        if identity_path is not None:
            ensure_identity(identity_path)
            kwargs["identity_path"] = identity_path
        self.dht = hivemind.DHT(
            initial_peers=list(initial_peers),
            host_maddrs=list(host_maddrs),
            client_mode=client_mode,
            start=False,
            **kwargs,
        )
        try:
            self.dht.run_in_background(await_ready=True, timeout=start_timeout)
        except BaseException:
            self.dht.shutdown()
            raise
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
        expiration = get_dht_time() + ttl
        record_key, models_key = self._key(model_key(record.model)), self._key(MODELS_KEY)
        return [
            self.dht.store(
                record_key,
                self._seal(record.to_dict(), record_key),
                expiration,
                subkey=record.peer_id,
                return_future=True,
            ),
            self.dht.store(
                models_key,
                self._seal({"num_layers": record.num_layers}, models_key),
                expiration,
                subkey=record.model,
                return_future=True,
            ),
        ]

    # ---- private swarms: the same layout under derived keys, with sealed values ----------------
    def _key(self, name: str) -> str:
        return name if self.swarm_key is None else self.swarm_key.dht_key(name)

    def _seal(self, value: dict[str, Any], key: str) -> Any:
        if self.swarm_key is None:
            return value
        return self.swarm_key.seal(msgpack.packb(value, use_bin_type=True), key)

    def _unseal(self, found: Any, key: str) -> dict[Any, Any]:
        """{subkey: value} of a DHT entry, dropping values a private swarm's members did not seal."""
        values = _subkey_values(found)
        if self.swarm_key is None:
            return dict(values)
        opened = {}
        for subkey, sealed in values.items():
            plain = self.swarm_key.open(sealed, key)
            if plain is None:
                logger.debug(f"dropping a value under {subkey!r} not sealed with this swarm's key")
                continue
            try:
                opened[subkey] = msgpack.unpackb(plain, raw=False, strict_map_key=False)
            except Exception:
                continue
        return opened

    # ---- reports of peers caught returning wrong results -----------------------------------------
    async def report_async(self, model: str, peer_id: str, reason: str) -> bool:
        """Tell the swarm (and its monitor) that `peer_id` returned wrong results to us."""
        key = self._key(reports_key(model))
        value = {"peer_id": peer_id, "reporter": self.peer_id, "reason": reason[:200], "time": time.time()}
        return bool(await self.dht.store(key, self._seal(value, key), get_dht_time() + REPORT_TTL,
                                         subkey=f"{peer_id}|{self.peer_id}", return_future=True))

    async def fetch_reports_async(self, model: str) -> dict[str, list[dict[str, Any]]]:
        """peer id -> the reports against it (one per reporter), newest data from the DHT."""
        key = self._key(reports_key(model))
        out: dict[str, list[dict[str, Any]]] = {}
        for value in self._unseal(await self.dht.get(key, latest=True, return_future=True), key).values():
            if isinstance(value, dict) and isinstance(value.get("peer_id"), str):
                out.setdefault(value["peer_id"], []).append(value)
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

    def list_models(self) -> dict[str, int]:
        """model name -> num_layers, for every model some peer announced recently."""
        key = self._key(MODELS_KEY)
        return _parse_registry(self._unseal(self.dht.get(key, latest=True), key))

    async def list_models_async(self) -> dict[str, int]:
        key = self._key(MODELS_KEY)
        return _parse_registry(self._unseal(await self.dht.get(key, latest=True, return_future=True), key))


def _subkey_values(found: Any) -> Mapping[Any, Any]:
    """Unwrap hivemind's ValueWithExpiration(dict[subkey, ValueWithExpiration]) into {subkey: value}."""
    if found is None or not isinstance(found.value, dict):
        return {}
    return {subkey: item.value for subkey, item in found.value.items()}


def _parse_registry(values: Mapping[Any, Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for model, value in values.items():
        n = value.get("num_layers") if isinstance(value, dict) else None
        if isinstance(model, str) and type(n) is int and n >= 0:
            out[model] = max(n, out.get(model, 0))
        else:
            logger.debug(f"dropping malformed registry entry {model!r}: {value!r:.200}")
    return out


def _build_view(model: str, num_layers: int | None, found: Mapping[Any, Any], models: Any) -> SwarmView:
    records: dict[str, PeerRecord] = {}
    for subkey, value in found.items():
        try:
            record = PeerRecord.from_dict(value)
        except ValueError as e:
            logger.debug(f"dropping malformed record under {subkey!r}: {e}")
            continue
        # The subkey is what the storing node claimed; a record naming another peer is a lie or a bug.
        if record.peer_id != subkey or record.model != model:
            logger.debug(
                f"dropping record for {record.peer_id}/{record.model} stored under {subkey!r}/{model}"
            )
            continue
        records[subkey] = record
    if num_layers is None:
        announced = [r.num_layers for r in records.values() if r.num_layers > 0]
        num_layers = max(announced) if announced else (models() if models else {}).get(model, 0)
    return SwarmView(model=model, num_layers=num_layers, records=records)
