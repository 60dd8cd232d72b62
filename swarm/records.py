"""Signed DHT records: subkeys only their owner can write, expirations no later than MAX_TTL.

Every value layerswarm stores sits under a subkey `name + "[owner:<ssh-rsa public key>]"`.
hivemind's RSASignatureValidator (run by every layerswarm DHT node, on stores it receives and
on values it reads from others) then requires the value to be signed by that key, so a stranger
can neither forge nor overwrite (e.g. with a far-future OFFLINE record) a peer's entry. The key is
the node's libp2p identity, so readers check `owner_of(subkey)` is the peer the record names.

`ExpirationValidator` refuses values expiring more than MAX_TTL from now: hivemind keeps, per
subkey, the value with the latest expiration, so one far-future value would pin a key for years.

`SignedRecord` is one value exactly as the DHT stores it (subkey, value with its signature,
expiration): `view` replies relay these so a reader who trusts no peer checks each signature
itself (docs/protocol.md, "Signed records"); `open_signed` is that check, done with hivemind's
own validators before a peer relays anything.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import DHTRecord, RecordValidatorBase
from hivemind.utils import MSGPackSerializer, get_dht_time

from swarm.identity import IdentityKey, peer_id_of

MAX_TTL = 3600.0  # the longest-lived value we write is a report of a lying peer (swarm.dht.REPORT_TTL)
CLOCK_SLACK = 60.0  # DHT time is wall time: tolerate this much skew between honest nodes
MAX_SUBKEY_BYTES = 2048  # a name (<= 512 chars) plus a public key of up to 8192 bits in OpenSSH form

_OWNED = re.compile(r"^(.*)\[owner:(.+?)\]$", re.DOTALL)


class ExpirationValidator(RecordValidatorBase):
    """Refuse values that expire further ahead than MAX_TTL (+ clock slack) or whose subkey is huge."""

    def __init__(self, max_ttl: float = MAX_TTL) -> None:
        self.max_ttl = max_ttl

    def validate(self, record: DHTRecord) -> bool:
        if len(record.subkey or b"") > MAX_SUBKEY_BYTES:
            return False
        return record.expiration_time <= get_dht_time() + self.max_ttl + CLOCK_SLACK

    def merge_with(self, other: RecordValidatorBase) -> bool:
        return isinstance(other, ExpirationValidator)


class RecordSigner:
    """Signs this node's values and names the subkeys it owns."""

    def __init__(self, key: IdentityKey) -> None:
        self.validator = RSASignatureValidator(key)
        self.marker = self.validator.local_public_key.decode()  # "[owner:ssh-rsa AAAA...]"

    def validators(self) -> list[RecordValidatorBase]:
        """What a SwarmNode gives its hivemind.DHT (`record_validators=`)."""
        return [self.validator, ExpirationValidator()]

    def owned(self, name: str) -> str:
        """The subkey `name` that only this node can write."""
        return name + self.marker


def owner_of(subkey: object) -> tuple[str, str] | None:
    """(name, peer id of the signing key) of an owned subkey, or None for an unowned or bad one.

    hivemind has already checked the signature of every value it returns under an owned subkey,
    so the peer id here is who wrote the value.
    """
    if not isinstance(subkey, str) or len(subkey) > MAX_SUBKEY_BYTES:
        return None
    match = _OWNED.match(subkey)
    if match is None:
        return None
    peer_id = peer_id_of(match.group(2).encode())
    return None if peer_id is None else (match.group(1), peer_id)


@dataclass(frozen=True)
class SignedRecord:
    """One owned DHT value exactly as stored: what the owner signed, and the signature."""

    subkey: bytes  # msgpack of the subkey str `name[owner:ssh-rsa ...]`
    value: bytes  # msgpack of the value, then b"[signature:" + base64(RSA-PSS signature) + b"]"
    expiration_time: float  # DHT time (Unix seconds); signed too, so nobody can prolong a record


def dht_key_bytes(key: str) -> bytes:
    """The 20 bytes a DHT key is stored and signed under: SHA-1 of its msgpack (hivemind's DHTID)."""
    return DHTID.generate(source=key).to_bytes()


def open_signed(key: str, record: SignedRecord, signer: RecordSigner) -> tuple[str, Any] | None:
    """(subkey, value) of a record stored under `key` whose owner's signature verifies, else None.

    Refused too: unowned subkeys (hivemind's validator passes those), expired values, and what
    the DHT's other validators refuse (far-future expirations). `signer`: any node's (its key is unused).
    """
    if type(record.expiration_time) is not float or not math.isfinite(record.expiration_time):
        return None
    if record.expiration_time <= get_dht_time() or len(record.subkey) > MAX_SUBKEY_BYTES:
        return None
    try:
        subkey = MSGPackSerializer.loads(record.subkey)
    except Exception:
        return None
    if owner_of(subkey) is None:
        return None
    dht_record = DHTRecord(dht_key_bytes(key), record.subkey, record.value, record.expiration_time)
    try:  # hostile bytes must cost this one record, never raise out of the reader
        if not all(v.validate(dht_record) for v in signer.validators()):
            return None
        return subkey, MSGPackSerializer.loads(signer.validator.strip_value(dht_record))
    except Exception:
        return None
