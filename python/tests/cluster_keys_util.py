"""The cluster's derived keys and the bootstrap request MAC, written here from docs/security.md with
hashlib alone (not by kvferry's code), so that tests check the documented scheme: what another
implementation following the docs would send is what kvferry accepts."""
import hashlib
import os
import time

MASTER_KEY = b"kvferry cluster secret v1"


def _kdf(master: bytes, subkey_id: int, context: bytes) -> bytes:
    """libsodium's crypto_kdf_derive_from_key: BLAKE2b-256 of nothing, keyed with the master key,
    salt the id (8 bytes little-endian, 8 zero bytes), personalization the context (8 zero bytes)."""
    return hashlib.blake2b(b"", digest_size=32, key=master, salt=subkey_id.to_bytes(8, "little") + bytes(8),
                           person=context + bytes(8)).digest()


def _master(secret: str) -> bytes:
    return hashlib.blake2b(secret.encode(), digest_size=32, key=MASTER_KEY).digest()


def bearer_token(secret: str) -> str:
    return _kdf(_master(secret), 2, b"kvfbearr").hex()


def bootstrap_authorization(secret: str, method: str, target: str, body: bytes = b"", ts=None,
                            nonce_hex=None) -> str:
    """The Authorization header of one bootstrap request (docs/security.md)."""
    key = _kdf(_master(secret), 3, b"kvfbtmac")
    ts_text = str(int(time.time()) if ts is None else ts)
    nonce_hex = nonce_hex or os.urandom(16).hex()
    h = hashlib.blake2b(digest_size=32, key=key)
    h.update(b"kvferry bootstrap request")
    for field in (b"1", method.encode(), target.encode(), ts_text.encode(), nonce_hex.encode(),
                  hashlib.blake2b(body, digest_size=32).digest()):
        h.update(len(field).to_bytes(4, "little") + field)
    return f"KVF-MAC v=1,ts={ts_text},nonce={nonce_hex},mac={h.hexdigest()}"
