"""A decode instance's kvferry engine_id (docs/manager.md "Several decode instances").

One prefill instance may serve several decode instances (1PxD). Its ranks tell the decode
instances apart by the engine_id of their RankId (``ManagerConfig::self.engine_id``): every rank of
one decode instance must have the same engine_id, and two instances different ones. The adapters
derive it, without any communication between the ranks, from a string every rank of the instance
already shares (vLLM: ``kv_transfer_config.engine_id``; SGLang: the server's ``dist_init_addr``,
else this host's name and the server's port):

    engine_id = 1 + (first 8 bytes of BLAKE2b-64(key), little-endian) mod (2^31 - 1)

a stable, nonzero 31-bit number (the same in every process and Python version: no ``hash()``,
which is salted per process). ``KVFERRY_ENGINE_ID`` (1..2^31-1) overrides it for every rank of an
instance. A prefill engine's engine_id stays 0: decode looks its ranks up under engine 0 at its
bootstrap service.
"""
import hashlib
import os
from typing import Optional

ENV = "KVFERRY_ENGINE_ID"
MAX = (1 << 31) - 1


def derive(key: str) -> int:
    """The engine_id of the decode instance every rank of which shares ``key`` (1..2^31-1)."""
    digest = hashlib.blake2b(str(key).encode("utf-8"), digest_size=8).digest()
    return 1 + int.from_bytes(digest, "little") % MAX


def decode_engine_id(key: str, environ: Optional[dict] = None) -> int:
    """``KVFERRY_ENGINE_ID`` if set (ValueError unless an integer in 1..2^31-1), else derive(key)."""
    env = os.environ if environ is None else environ
    raw = (env.get(ENV) or "").strip()
    if raw:
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError(f"{ENV}={raw!r}: not an integer") from None
        if not 1 <= value <= MAX:
            raise ValueError(f"{ENV}={value}: outside 1..{MAX} (0 is the prefill engine's)")
        return value
    return derive(key)
