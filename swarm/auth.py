"""Private swarms: a shared secret file that strangers lack.

libp2p already authenticates peer ids on every connection (Noise), but hivemind's p2pd has no
pre-shared-key network, so privacy is built on top of it with one secret:

* DHT keys are HMAC-derived from the secret: strangers cannot find the swarm's records;
* DHT values are sealed with AES-GCM: strangers can neither read them nor forge them (a value
  that does not authenticate is dropped like a malformed record);
* every stream starts with an `auth` message carrying HMAC(secret, server id | client id):
  bound to both authenticated peer ids, so it cannot be replayed by anyone else. A peer answers
  any other first message from a stranger with an `unauthorized` error and closes the stream.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

MIN_SECRET_BYTES = 16  # 128 bits: guessing is out of reach; shorter files are refused
NONCE_BYTES = 12  # AES-GCM's standard nonce; random per value, never reused in practice


class SwarmKeyError(ValueError):
    """The swarm key file is missing, unreadable or too short; the message says what to do."""


class SwarmKey:
    def __init__(self, secret: bytes) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise SwarmKeyError(f"a swarm key needs at least {MIN_SECRET_BYTES} bytes of secret")
        self._secret = secret
        # Separate derived keys for separate purposes: a leak of one use never helps another.
        self._names = self._derive(b"dht-names")
        self._aead = AESGCM(self._derive(b"dht-values"))
        self._streams = self._derive(b"stream-auth")

    def _derive(self, purpose: bytes) -> bytes:
        return hmac.new(self._secret, b"layerswarm/v1/" + purpose, hashlib.sha256).digest()

    @classmethod
    def load(cls, path: str | Path) -> SwarmKey:
        path = Path(path)
        try:
            data = path.read_bytes().strip()
        except FileNotFoundError:
            raise SwarmKeyError(f"swarm key file {path} does not exist; create one with `swarm-peer keygen {path}` "
                                "and give the same file to every member") from None
        except OSError as e:
            raise SwarmKeyError(f"cannot read swarm key file {path}: {e}") from None
        try:
            return cls(data)
        except SwarmKeyError as e:
            raise SwarmKeyError(f"{path}: {e}; create one with `swarm-peer keygen`") from None

    @staticmethod
    def generate(path: str | Path) -> Path:
        """Write a new random key (64 hex chars) readable by the owner only; refuses to overwrite."""
        path = Path(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        return path

    def dht_key(self, name: str) -> str:
        """The DHT key under which this swarm stores what others call `name`."""
        return "layerswarm/v1/private/" + hmac.new(self._names, name.encode(), hashlib.sha256).hexdigest()

    def seal(self, plaintext: bytes, context: str) -> bytes:
        """Encrypt and authenticate; `context` (the DHT key) binds the value to where it is stored."""
        nonce = os.urandom(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, plaintext, context.encode())

    def open(self, sealed: bytes, context: str) -> bytes | None:
        """The plaintext, or None when the value was not sealed by a member for this `context`."""
        if not isinstance(sealed, bytes) or len(sealed) <= NONCE_BYTES:
            return None
        try:
            return self._aead.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode())
        except Exception:  # cryptography raises InvalidTag; anything else is garbage too
            return None

    def stream_proof(self, server_peer_id: str, client_peer_id: str) -> bytes:
        return hmac.new(self._streams, f"{server_peer_id}|{client_peer_id}".encode(), hashlib.sha256).digest()

    def check_stream_proof(self, proof: object, server_peer_id: str, client_peer_id: str) -> bool:
        return isinstance(proof, bytes) and hmac.compare_digest(
            proof, self.stream_proof(server_peer_id, client_peer_id)
        )
