"""swarm: the network layer of layerswarm — DHT records, wire codec, stream framing.

Files and the concept each one owns:
  types.py       plain data: LayerRange, PeerState, PeerRecord, SwarmView, Hop, Route (no I/O, no torch)
  errors.py      ProtocolError (+ FrameTooLarge, FrameTimeout), ConnectionClosed, PeerUnreachable, RemoteError
  framing.py     read_frame / write_frame: 4-byte big-endian length + payload; payload deadline, ByteBudget
  codec.py       Limits (bytes, objects, depth, time, per remote), encode/decode_message, encode/decode_tensor
  messages.py    PROTOCOL_NAME, message type constants, ERROR_CODES, require_* field validators
  schema.py      the typed messages: one dataclass per message, from_wire (validated) / to_wire
  connection.py  PeerStream (send / recv / request / close), open_stream, answers (a liveness probe),
                 serve_stream, stream_handler
                 (per-remote stream cap and frame buffer), require_auth (small first frame)
  notices.py     crash notices on the wire: notice_recipients (FANOUT random peers of a view), tell (send them)
  dht.py         SwarmNode: hivemind.DHT wrapper — announce, fetch_view (+ signed values), list_models, reports
  identity.py    the node's libp2p RSA key: identity files (mode checked), peer id of a public key
  records.py     signed records: owned subkeys, RSA signature + max-TTL validators, owner_of,
                 SignedRecord (a value as stored, signature included) and open_signed (its check)
  lifeline.py    no orphans: the DHT child and its p2pd die with the process that started them
  launcher.py    no orphans, one level up: processes we start (launched_env) stop when their starter
                 dies, even by kill -9 (exit_with_launcher); watch_parent

The protocol itself (messages, limits, error codes, DHT keys, push design) is in docs/protocol.md.
`types` is importable without torch or hivemind; the other modules import them lazily via this
package only when their names are used, so `routing/` can depend on `swarm.types` cheaply.
"""

from __future__ import annotations

from typing import Any

from swarm.types import PROTOCOL_VERSION, Hop, LayerRange, PeerRecord, PeerState, Route, SwarmView

# name -> module that defines it; loaded on first use (PEP 562) so importing swarm.types
# (or this package for its plain types) does not pull in torch, msgpack or hivemind.
_LAZY = {
    "ProtocolError": "swarm.errors",
    "FrameTooLarge": "swarm.errors",
    "ConnectionClosed": "swarm.errors",
    "PeerUnreachable": "swarm.errors",
    "RemoteError": "swarm.errors",
    "read_frame": "swarm.framing",
    "write_frame": "swarm.framing",
    "Limits": "swarm.codec",
    "encode_message": "swarm.codec",
    "decode_message": "swarm.codec",
    "encode_tensor": "swarm.codec",
    "decode_tensor": "swarm.codec",
    "PROTOCOL_NAME": "swarm.messages",
    "ERROR_CODES": "swarm.messages",
    "PeerStream": "swarm.connection",
    "open_stream": "swarm.connection",
    "serve_stream": "swarm.connection",
    "stream_handler": "swarm.connection",
    "SwarmNode": "swarm.dht",
}

__all__ = ["PROTOCOL_VERSION", "Hop", "LayerRange", "PeerRecord", "PeerState", "Route", "SwarmView", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'swarm' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
