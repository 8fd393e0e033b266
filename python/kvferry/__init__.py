"""kvferry for Python serving engines: KV-cache transfer from prefill to decode ranks.

The connector objects follow SGLang's disaggregation interface (python/sglang/srt/disaggregation/
base/conn.py): a ``KVManager`` per rank, a ``KVSender`` (prefill) or ``KVReceiver`` (decode) per
request (``bootstrap_room``), each with ``init``, ``send`` (sender), ``poll``,
``failure_exception`` and ``abort``.

* Engine-shaped buffers (KV buffers per layer tensor, aux rows, state rows, as SGLang's KVArgs
  carries them) are described by ``describe_buffers`` / ``from_kv_args`` (kvferry/buffers.py).
* KV pools are buffer-protocol objects the engine owns (numpy arrays, bytearrays, memoryviews):
  writable and C-contiguous. The manager registers their memory with the transport (nothing is
  copied) and keeps them alive until ``close()``. Layout of one rank's pool (``KVManager.layout``):
  ``num_buffers`` buffers (layer-major, K then V; MLA: one latent) of ``num_pages`` pages of
  ``page_bytes`` bytes (``page_size`` tokens x this rank's heads x head_dim x dtype_bytes), then
  ``aux_slots`` aux slots of 64 bytes. ``pool_nbytes()`` sizes a pool for a number of pages.
* Page indices are integer sequences (lists, numpy integer arrays) of pages of this rank's pool.
  Out-of-range or duplicate indices raise ``ValueError`` and nothing is sent.
* A failed room raises ``KVTransferError`` from ``failure_exception()``, with the room, reason,
  code, origin rank and ``is_from_another_rank`` (False only on the origin).
* kvferry's log lines go to Python ``logging``: logger ``kvferry.<component>`` (e.g.
  ``kvferry.prefill.endpoint``, ``kvferry.decode.connector``), levels preserved (kvferry's trace
  is level 5, named TRACE); records carry ``room``, ``code`` and ``origin`` attributes where they
  apply. A failed room is logged once above debug, on its origin rank (error on decode, warning on
  prefill, info for an abort); other ranks log it at debug.

Threads: every method may be called from any thread; blocking work runs with the GIL released.
"""
from __future__ import annotations

import enum
import os
from typing import Iterable, Optional

from . import _kvferry
from .buffers import BufferDesc, EngineBuffers, from_kv_args
from .buffers import describe as describe_buffers
from ._logging import flush_logs
from ._logging import start as _logging_start

__all__ = [
    "KVPoll", "KVTransferError", "KVManager", "KVSender", "KVReceiver", "BootstrapServer",
    "pool_nbytes", "flush_logs", "BufferDesc", "EngineBuffers", "describe_buffers", "from_kv_args",
]


class KVPoll(enum.IntEnum):
    """A room's state on one rank; SGLang's numbering (an engine takes the MIN over its ranks)."""
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVTransferError(Exception):
    """A failed room as this rank sees it.

    bootstrap_room: the request's room id. failure_reason: the root cause in words.
    code: snake_case error code ("transfer_error", "aborted", "peer_unreachable", ...).
    origin: the rank where the failure was first observed ("prefill/tp0").
    is_from_another_rank: True where the failure was propagated, False on the origin.
    """

    def __init__(self, bootstrap_room: int, failure_reason: str, is_from_another_rank: bool = False,
                 origin: str = "", code: str = "internal"):
        super().__init__(bootstrap_room, failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank
        self.origin = origin
        self.code = code

    def __str__(self) -> str:
        where = " (from another rank)" if self.is_from_another_rank else ""
        return f"room {self.bootstrap_room}: {self.code} at {self.origin}{where}: {self.failure_reason}"

    def __repr__(self) -> str:
        return (f"KVTransferError(bootstrap_room={self.bootstrap_room}, code={self.code!r}, "
                f"origin={self.origin!r}, is_from_another_rank={self.is_from_another_rank}, "
                f"failure_reason={self.failure_reason!r})")


BootstrapServer = _kvferry.BootstrapServer
BootstrapServer.__doc__ = ("The bootstrap service (HTTP) in this process: BootstrapServer(host='127.0.0.1', "
                           "port=0); .port is the bound port; stops when garbage-collected.")


def _geometry(num_layers, num_kv_heads, head_dim, dtype_bytes, tensors_per_layer, model_name, attention):
    return {"name": model_name, "attention": attention, "num_layers": num_layers,
            "num_kv_heads": num_kv_heads, "head_dim": head_dim, "dtype_bytes": dtype_bytes,
            "tensors_per_layer": tensors_per_layer}


def pool_nbytes(num_pages: int, *, num_layers: int, num_kv_heads: int, head_dim: int, page_size: int,
                dtype_bytes: int = 2, tensors_per_layer: int = 2, aux_slots: int = 64, tp_rank: int = 0,
                tp_size: int = 1, attention: str = "GQA") -> int:
    """Bytes of one rank's pool holding `num_pages` pages (num_kv_heads: the model's, all ranks)."""
    g = _geometry(num_layers, num_kv_heads, head_dim, dtype_bytes, tensors_per_layer, "custom", attention)
    return _kvferry.layout_for_pages(g, page_size, aux_slots, tp_rank, tp_size, num_pages)["total_bytes"]


class KVManager:
    """One rank's manager: pool, transport, control plane, failure registry and progress thread.

    role: "prefill" or "decode". kv_pool: the rank's pool (see the module doc); as many pages as
    fit are used. Geometry: num_layers, num_kv_heads (the model's, over all ranks), head_dim,
    dtype_bytes, tensors_per_layer (2: K and V; 1 with attention="MLA"), page_size (tokens).
    model_name must be the same on both engines. bootstrap_addr: "host:port" of the bootstrap
    service; prefill registers there, decode looks its prefill ranks up (blocking up to
    lookup_timeout_ms). transport: "shm" or "tcp". deadlines: milliseconds by name
    (bootstrap_timeout_ms, waiting_timeout_ms, heartbeat_interval_ms, heartbeat_timeout_ms,
    drain_timeout_ms, lookup_timeout_ms, ...; KVFERRY_* environment variables are the defaults).
    log_file: optional JSON-lines log of this rank (as `kvferry replay` writes).
    transfer_shards: transfer worker shards, 1..8 (each a UCX worker with its own progress thread;
    a room's writes stay on one shard; `--transfer-shards` in the CLI). Peers may use other counts.
    """

    def __init__(self, role: str, kv_pool, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 page_size: int, bootstrap_addr: str, dtype_bytes: int = 2, tensors_per_layer: int = 2,
                 attention: str = "GQA", model_name: str = "custom", aux_slots: int = 64,
                 transport: str = "shm", tp_rank: int = 0, tp_size: int = 1,
                 peer_tp_size: Optional[int] = None, deadlines: Optional[dict] = None,
                 log_file: Optional[str] = None, transfer_shards: int = 1):
        _logging_start()
        g = _geometry(num_layers, num_kv_heads, head_dim, dtype_bytes, tensors_per_layer, model_name, attention)
        self.role = role
        self._impl = _kvferry.Manager(role, kv_pool, g, page_size, aux_slots, bootstrap_addr, transport,
                                      tp_rank, tp_size, peer_tp_size or 0, dict(deadlines or {}),
                                      os.fspath(log_file) if log_file else "", transfer_shards)

    @property
    def layout(self) -> dict:
        """num_pages, page_size, num_buffers, token_bytes, page_bytes, buffer_bytes, aux_slots,
        aux_offset, aux_slot_bytes, total_bytes, heads_per_rank, first_head (bytes, tokens, pages)."""
        return self._impl.layout

    @property
    def rank(self) -> str:
        return self._impl.rank

    def page_offset(self, buffer: int, page: int) -> int:
        """Byte offset of `page` of layer buffer `buffer` in the pool."""
        l = self._impl.layout
        return buffer * l["buffer_bytes"] + page * l["page_bytes"]

    def inject_write_failure(self, bootstrap_room: int, code: str = "transfer_error",
                             reason: str = "write failure injected") -> None:
        """Fault injection: every later write of the room fails in the transport with `code`."""
        self._impl.inject_write_failure(bootstrap_room, code, reason)

    def live_rooms(self) -> int:
        return self._impl.live_rooms()

    def peers(self) -> int:
        """Peer ranks connected (prefill: decode pools registered; decode: prefill ranks found)."""
        return self._impl.peers()

    def close(self) -> None:
        """Tears the rank down (transport first), then lets go of the pool. Idempotent."""
        self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Room:
    def __init__(self, mgr: KVManager, bootstrap_room: int, role: str):
        if mgr.role != role:
            raise ValueError(f"a {type(self).__name__} needs a {role} manager, not {mgr.role}")
        self._mgr = mgr
        self.bootstrap_room = int(bootstrap_room)
        mgr._impl.open(self.bootstrap_room)
        self._closed = False

    def poll(self) -> KVPoll:
        return KVPoll(self._mgr._impl.poll(self.bootstrap_room))

    def failure_exception(self) -> None:
        """Raises the room's KVTransferError if it failed; returns None otherwise."""
        f = self._mgr._impl.failure(self.bootstrap_room)
        if f is not None:
            raise KVTransferError(*f)

    def abort(self, reason: str = "aborted by the engine") -> None:
        """Fails the room on this rank (code "aborted", origin this rank) and tells its peers."""
        self._mgr._impl.abort(self.bootstrap_room, reason)

    def close(self) -> None:
        """The engine is done: the room is released once no write can still reach its pages."""
        if not self._closed:
            self._closed = True
            self._mgr._impl.close_room(self.bootstrap_room)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter exit: the manager may be gone
            pass


class KVSender(_Room):
    """Prefill side of one room: init(num_kv_indices), then send() chunks of local page indices."""

    def __init__(self, mgr: KVManager, bootstrap_room: int):
        super().__init__(mgr, bootstrap_room, "prefill")

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None, num_tokens: Optional[int] = None) -> None:
        """The room has `num_kv_indices` pages (`num_tokens` tokens; default: full pages).
        aux_index is accepted for SGLang's call shape only: prefill's aux record is built by kvferry
        (room guard, token and page counts) in its own staging slot, not taken from the engine."""
        self._mgr._impl.sender_init(self.bootstrap_room, int(num_kv_indices), int(num_tokens or 0))

    def send(self, kv_indices: Iterable[int]) -> None:
        """Writes the room's next len(kv_indices) pages from these local pages to every decode rank.
        The aux record follows the last page; poll() is Success once all of it is at decode."""
        self._mgr._impl.sender_send(self.bootstrap_room, [int(i) for i in kv_indices])


class KVReceiver(_Room):
    """Decode side of one room: init(kv_indices, aux_index), then poll() until Success or Failed."""

    def __init__(self, mgr: KVManager, bootstrap_room: int):
        super().__init__(mgr, bootstrap_room, "decode")

    def init(self, kv_indices: Iterable[int], aux_index: int, num_tokens: Optional[int] = None) -> None:
        """Destination pages (one per room page, in order) and aux slot; sends them to prefill."""
        self._mgr._impl.receiver_init(self.bootstrap_room, [int(i) for i in kv_indices], int(aux_index),
                                      int(num_tokens or 0))

    def aux(self, aux_index: int) -> dict:
        """The aux record prefill wrote last: room, cached_tokens, num_pages."""
        return self._mgr._impl.aux(int(aux_index))

