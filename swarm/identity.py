"""A node's identity: the libp2p RSA key that names it (peer id) and signs its DHT records.

One key does both jobs, so a record's signer IS the peer it describes: a reader derives the
peer id from the public key in the record's subkey (`peer_id_of`) and drops records that
name anyone else. hivemind stores the key as a libp2p `crypto_pb2.PrivateKey` (RSA, DER).
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import tempfile

import multihash
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.p2p import P2P
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey


class IdentityError(ValueError):
    """The identity file is unusable; the message says what to do."""


class IdentityKey(RSAPrivateKey):
    """hivemind's RSAPrivateKey built from an existing key instead of a fresh one (picklable as its base)."""

    def __init__(self, key: rsa.RSAPrivateKey) -> None:  # noqa: D107 - base __init__ would generate a key
        self._private_key = key


def ensure_identity(path: str) -> None:
    """Create a libp2p private key at `path` (mode 0600) unless one exists; refuse one others can read.

    The key is the peer's name and signs its records: a copy lets anyone impersonate the peer.
    """
    if not os.path.exists(path):
        P2P.generate_identity(path)  # hivemind's own format (protobuf RSA key), chmods it 0400
        os.chmod(path, 0o600)  # owner may rewrite it later (e.g. rotate); still private
        return
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise IdentityError(f"identity file {path} is readable by other users (mode {mode:04o}); anyone who "
                            f"copies it can impersonate this peer: run `chmod 600 {path}` (or make a new one)")


def load_identity(path: str) -> IdentityKey:
    """The RSA key of a libp2p identity file written by `ensure_identity` (or hivemind)."""
    try:
        with open(path, "rb") as f:
            proto = crypto_pb2.PrivateKey.FromString(f.read())
        key = serialization.load_der_private_key(proto.data, password=None)
    except Exception as e:
        raise IdentityError(f"identity file {path} is not a libp2p RSA key ({e}); move it away and a new "
                            "one is created at the next start (the peer id changes)") from None
    if proto.key_type != crypto_pb2.KeyType.RSA or not isinstance(key, rsa.RSAPrivateKey):
        raise IdentityError(f"identity file {path} holds a non-RSA key; records can only be signed with RSA")
    return IdentityKey(key)


def ephemeral_identity() -> tuple[str, tempfile.TemporaryDirectory]:
    """A fresh identity file in a private temporary folder (for nodes without --identity).

    p2pd reads the file once at start; the caller removes the folder after the node started.
    """
    folder = tempfile.TemporaryDirectory(prefix="layerswarm-id-")
    path = os.path.join(folder.name, "identity.key")
    P2P.generate_identity(path)
    return path, folder


@functools.lru_cache(maxsize=4096)
def peer_id_of(ssh_public_key: bytes) -> str | None:
    """The libp2p peer id (base58) of an RSA public key in OpenSSH form, or None if it is not one.

    Same derivation as libp2p (and hivemind's PeerID.from_identity): sha2-256 multihash of the
    protobuf-wrapped DER SubjectPublicKeyInfo.
    """
    try:
        key = serialization.load_ssh_public_key(ssh_public_key)
    except Exception:
        return None
    if not isinstance(key, rsa.RSAPublicKey) or not 2048 <= key.key_size <= 8192:
        return None  # smaller keys are forgeable; larger ones only cost verification time
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return PeerID(digest).to_base58()
