"""Check the signed records of a `view` reply ourselves: trust the signatures, not the peer that relayed them.

Written from docs/protocol.md ("Signed records") alone, without hivemind or layerswarm: RSA-PSS
with `cryptography`, peer ids with py-libp2p, msgpack. Each record is dropped alone, with a reason.

    python tests/interop/signed_records.py --model NAME < reply.msgpack
prints {"accepted": [record map, ...], "rejected": [reason, ...]} (used by tests/test_interop_libp2p.py).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import math
import re
import sys
import time
from typing import Any

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from libp2p.crypto.rsa import RSAPublicKey
from libp2p.peer.id import ID

KEY_PREFIX = "layerswarm/v1/model/"
TUPLE_EXT = 0x40  # the signed tuple is a msgpack ext of this type wrapping a 4-element array
MAX_TTL = 3600.0 + 60.0  # no honest record expires further ahead (plus clock slack)
MIN_RSA_BITS, MAX_RSA_BITS = 2048, 8192
OWNED = re.compile(r"^([^\[\]]+)\[owner:([^\]]+)\]$")  # `<peer id>[owner:ssh-rsa AAAA...]`
SIGNATURE = re.compile(rb"\[signature:(.+?)\]")  # as hivemind finds it: exactly one in the value
PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH)


class Rejected(ValueError):
    """This record is dropped; the message says why."""


def dht_key_bytes(model: str) -> bytes:
    """The 20 bytes the model's records are stored and signed under: SHA-1 of the msgpack str key."""
    return hashlib.sha1(msgpack.packb(KEY_PREFIX + model, use_bin_type=True)).digest()


def peer_id_of(key: rsa.RSAPublicKey) -> str:
    """libp2p's peer id of an RSA key: sha2-256 multihash of the protobuf-wrapped DER SubjectPublicKeyInfo."""
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return ID.from_pubkey(RSAPublicKey.from_bytes(der)).to_base58()


def verify_entry(entry: Any, model: str, now: float) -> dict[str, Any]:
    """The record map of one `view` entry {subkey, value, expiration_time}, or Rejected."""
    if not isinstance(entry, dict):
        raise Rejected("entry is not a map")
    subkey_bytes, value, expiration = entry.get("subkey"), entry.get("value"), entry.get("expiration_time")
    if not (isinstance(subkey_bytes, bytes) and isinstance(value, bytes) and type(expiration) is float):
        raise Rejected("entry needs subkey: bytes, value: bytes, expiration_time: float")
    if not (math.isfinite(expiration) and now < expiration <= now + MAX_TTL):
        raise Rejected(f"expiration {expiration} is past or too far ahead")
    subkey = msgpack.unpackb(subkey_bytes, raw=False)
    match = OWNED.match(subkey) if isinstance(subkey, str) else None
    if match is None:
        raise Rejected("subkey is not `<peer id>[owner:<ssh-rsa key>]`")
    name, key_text = match.groups()
    try:
        key = serialization.load_ssh_public_key(key_text.encode())
    except ValueError as e:
        raise Rejected(f"owner key does not parse: {e}") from None
    if not isinstance(key, rsa.RSAPublicKey) or not MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
        raise Rejected("owner key is not an RSA key of 2048 to 8192 bits")
    try:
        owner = peer_id_of(key)
    except Exception as e:  # py-libp2p takes RSA keys up to 4096 bits
        raise Rejected(f"no libp2p peer id for the owner key: {e}") from None
    if owner != name:
        raise Rejected(f"subkey names {name} but its key is {owner}'s")
    signatures = SIGNATURE.findall(value)
    if len(signatures) != 1:
        raise Rejected(f"value holds {len(signatures)} signatures, not 1")
    stripped = SIGNATURE.sub(b"", value)
    signed = msgpack.packb(msgpack.ExtType(TUPLE_EXT, msgpack.packb(
        [dht_key_bytes(model), subkey_bytes, stripped, expiration], use_bin_type=True)))
    try:
        key.verify(base64.b64decode(signatures[0], validate=True), signed, PSS, hashes.SHA256())
    except (InvalidSignature, binascii.Error):
        raise Rejected(f"signature of {name}'s record does not verify") from None
    record = msgpack.unpackb(stripped, raw=False)
    if not isinstance(record, dict) or record.get("peer_id") != owner or record.get("model") != model:
        raise Rejected(f"record signed by {owner} does not describe {owner} serving {model}")
    return record


def verify_view(reply: dict[str, Any], model: str, now: float | None = None) -> tuple[list[dict], list[str]]:
    """(records whose signatures verify, reasons for the others) of a `view` reply for `model`."""
    now = time.time() if now is None else now
    accepted, rejected = [], []
    for entry in reply.get("records", []):
        try:
            accepted.append(verify_entry(entry, model, now))
        except (Rejected, ValueError, TypeError, msgpack.UnpackException) as e:
            rejected.append(str(e) or type(e).__name__)
    return accepted, rejected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the model the reply is for (its records are signed under it)")
    args = parser.parse_args()
    reply = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
    accepted, rejected = verify_view(reply, args.model)
    print(json.dumps({"accepted": accepted, "rejected": rejected}))


if __name__ == "__main__":
    main()
