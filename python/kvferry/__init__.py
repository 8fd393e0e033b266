"""kvferry for Python serving engines: KV-cache transfer from prefill to decode ranks.

The connector objects follow SGLang's disaggregation interface (python/sglang/srt/disaggregation/
base/conn.py): a ``KVManager`` per rank, a ``KVSender`` (prefill) or ``KVReceiver`` (decode) per
request (``bootstrap_room``), each with ``init``, ``send`` (sender), ``poll``,
``failure_exception`` and ``abort``.

* Memory, one of two shapes. Engine-owned buffers (``buffers=``): KV buffers per layer tensor,
  aux rows and state rows, as SGLang's KVArgs carries them, described by ``describe_buffers`` /
  ``from_kv_args`` (kvferry/buffers.py: host arrays, tensors with ``data_ptr()`` or
  ``__cuda_array_interface__``, or pointers with their memory kind and CUDA device; device memory
  is refused at construction where this machine cannot back it, docs/gpu.md); a page index
  addresses item i of every KV buffer, a room's aux_index its row of every aux buffer (prefill's
  row lands in decode's row after the last KV write), state indices rows of every state buffer
  (sent with the last chunk). Or one KV pool (``kv_pool``) laid out by kvferry: ``num_buffers``
  buffers (layer-major, K then V; MLA: one latent) of ``num_pages`` pages of ``page_bytes`` bytes,
  then ``aux_slots`` aux slots of 64 bytes (``KVManager.layout``; ``pool_nbytes()`` sizes it).
  Either way the memory is the engine's: writable, C-contiguous, registered with the transport
  (nothing is copied) and kept alive until ``close()``.
* Page indices are integer sequences (lists, numpy integer arrays) of pages of this rank's
  memory. Out-of-range or duplicate indices raise ``ValueError`` and nothing is sent.
* Prefill: ``KVSender.init(num_kv_indices, aux_index)``, then ``send(kv_indices,
  state_indices=None, last=None, layers=None)`` per chunk; ``last`` is inferred (the chunk after
  which every layer reached the room's page count) unless given; a last chunk may carry no pages
  (only its state rows); ``layers=(begin, end)`` sends only those layers (layer-wise streaming).
  Decode: ``KVReceiver(mgr, room, bootstrap_addr=None, prefill_dp_rank=None)``, then
  ``init(kv_indices, aux_index, state_indices=None)`` (also named ``send_metadata``).
* Freeing a room's pages and rows: ``release_safe()`` (sender and receiver) is True once no write
  of any prefill source can still reach them. An engine must free (or reuse) a room's pages, aux
  row and state rows only once it is True. ``KVPoll.Failed`` does NOT imply it: a prefill rank
  may still be writing into a failed room's pages. A receiver whose prefill never confirmed its
  writes drained becomes release-safe at the drain deadline with ``quarantined()`` True: those
  pages must not be reused.
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
from typing import Iterable, Optional, Tuple

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


class KVManager(_kvferry.Manager):
    """One rank's manager: memory, transport, control plane, failure registry and progress thread.

    role: "prefill" or "decode". Memory (see the module doc): ``buffers``, the engine's buffers as
    ``describe_buffers``/``from_kv_args`` return them (kept referenced until close()), or
    ``kv_pool``, one pool laid out by kvferry (as many pages as fit are used). Geometry:
    num_layers, num_kv_heads (the model's, over all ranks), head_dim, dtype_bytes,
    tensors_per_layer (2: K and V; 1 with attention="MLA"), page_size (tokens); with buffers, the
    KV buffers' item length must be a page of this rank's heads. model_name must be the same on
    both engines. bootstrap_addr: "host:port" of the bootstrap service; prefill registers there,
    decode looks its prefill ranks up (blocking up to lookup_timeout_ms). transport: "shm" or
    "tcp". deadlines: milliseconds by name (bootstrap_timeout_ms, waiting_timeout_ms,
    heartbeat_interval_ms, heartbeat_timeout_ms, drain_timeout_ms, lookup_timeout_ms, ...;
    KVFERRY_* environment variables are the defaults). log_file: optional JSON-lines log of this
    rank (as `kvferry replay` writes). transfer_shards: transfer worker shards, 1..8 (each a UCX
    worker with its own progress thread; a room's writes stay on one shard; `--transfer-shards`
    in the CLI). Peers may use other counts. log_failures: False leaves logging a failed room to
    the engine (SGLang's scheduler logs it; kvferry.sglang). control_bind / control_advertise /
    control_port: the control socket's bind host, the host peers are told, its port (defaults:
    loopback, any free port). fault_injection: True wraps the transport in kvferry's
    fault-injecting decorator, for tests (inject_write_failure, hold_writes); off by default, and
    then those hooks raise ValueError. integrity: True turns on end-to-end integrity
    (ManagerConfig::integrity, docs/failure-model.md "Integrity"): decode digests what landed and
    compares it with each prefill source's digest (a mismatch fails the room with code
    "integrity_error", origin the decode rank); a prefill with it on fails rooms whose decode rank
    does not ask. Off by default; both engines should agree. dp_rank: this rank's DP group (each
    DP group is its own TP engine of tp_size ranks; DP attention); peer_dp_size: the other
    engine's DP size. A room is served by decode DP group ``room % decode DP size``
    (kvferry/routing.h) and by the prefill DP group its receiver names (``prefill_dp_rank``,
    default the same rule). engine_id: decode only, its decode instance's id (every rank of the
    instance the same, two instances different: kvferry.engine_id); one prefill instance serves
    several decode instances that way. A prefill engine's is 0.

    KVManager is the compiled manager type itself (``kvferry._kvferry.Manager``): ``layout``,
    ``rank``, ``control_endpoint`` and the calls by room id that KVSender and KVReceiver make
    (``room_poll(room)``, ``room_failure(room)``, ``room_abort(room, reason)``, ``room_fail``,
    ``room_fail_from_engine``, ``room_fail_from_agreement``, ``room_release_safe``,
    ``room_quarantined``, ``room_metrics``, ``room_open``, ``room_close``, ``sender_init``,
    ``sender_send``, ``sender_take_completed_sends``, ``receiver_init``, ``aux_row(slot)``) are its methods; engines normally use
    the room objects.
    """

    def __init__(self, role: str, kv_pool=None, *, num_layers: int, num_kv_heads: int, head_dim: int,
                 page_size: int, bootstrap_addr: str, buffers: Optional[EngineBuffers] = None,
                 dtype_bytes: int = 2, tensors_per_layer: int = 2,
                 attention: str = "GQA", model_name: str = "custom", aux_slots: int = 64,
                 transport: str = "shm", tp_rank: int = 0, tp_size: int = 1,
                 peer_tp_size: Optional[int] = None, deadlines: Optional[dict] = None,
                 log_file: Optional[str] = None, transfer_shards: int = 1, log_failures: bool = True,
                 control_bind: str = "", control_advertise: str = "", control_port: int = 0,
                 fault_injection: bool = False, integrity: bool = False, dp_rank: int = 0,
                 peer_dp_size: int = 1, engine_id: int = 0):
        if (kv_pool is None) == (buffers is None):
            raise ValueError("give kv_pool or buffers (one of them)")
        _logging_start()
        g = _geometry(num_layers, num_kv_heads, head_dim, dtype_bytes, tensors_per_layer, model_name, attention)
        self.role = role
        self._buffers = buffers  # keeps the engine's buffer objects alive while registered
        descs = [d.as_tuple() for d in buffers.descs] if buffers is not None else []
        super().__init__(role, kv_pool, descs, g, page_size, aux_slots, bootstrap_addr, transport,
                         tp_rank, tp_size, peer_tp_size or 0, dict(deadlines or {}),
                         os.fspath(log_file) if log_file else "", transfer_shards, bool(log_failures),
                         control_bind, control_advertise, int(control_port), bool(fault_injection),
                         bool(integrity), int(dp_rank), int(peer_dp_size), int(engine_id))
        self._constructed = True  # the compiled manager exists (close() may call into it)

    def page_offset(self, buffer: int, page: int) -> int:
        """Byte offset of `page` of layer buffer `buffer` in the pool."""
        l = self.layout
        return buffer * l["buffer_bytes"] + page * l["page_bytes"]

    def inject_write_failure(self, bootstrap_room: int, code: str = "transfer_error",
                             reason: str = "write failure injected") -> None:
        """Fault injection: every later write of the room fails in the transport with `code`."""
        super().inject_write_failure(bootstrap_room, code, reason)

    def corrupt_next_write(self, bootstrap_room: int) -> None:
        """Fault injection: the room's next write lands with one byte flipped, and the transport
        reports success (only the integrity check can tell)."""
        super().corrupt_next_write(bootstrap_room)

    def hold_writes(self, bootstrap_room: int) -> None:
        """Test hook (fault decorator): later writes of the room stay in flight until
        release_held_writes(); they are queued, not lost."""
        super().hold_writes(bootstrap_room)

    def release_held_writes(self, bootstrap_room: int) -> None:
        """Ends hold_writes(): the room's queued writes go out, in order."""
        super().release_held_writes(bootstrap_room)

    def held_writes(self, bootstrap_room: int) -> int:
        """Writes of the room held in flight (queued) right now."""
        return super().held_writes(bootstrap_room)

    def live_rooms(self) -> int:
        return super().live_rooms()

    def peers(self) -> int:
        """Peer ranks connected (prefill: decode pools registered; decode: prefill ranks found)."""
        return super().peers()

    def leave(self, timeout_ms: int = 2000) -> None:
        """An orderly leave, first half (``Manager::leave``, docs/failure-model.md "Leaving"): no
        new rooms from now on (room_open raises), the rooms open go on; a prefill rank removes its
        bootstrap entry (raises if the service refused or did not answer; the leave stands).
        Poll drained(), then close()."""
        super().leave(int(timeout_ms))

    def drained(self) -> bool:
        """True once leave() was called and no room is open or being released: close() now."""
        return super().drained()

    def take_reclaimed_rooms(self) -> list:
        """Decode: rooms closed while quarantined (``KVReceiver.quarantined()``), or closed before
        they were release-safe, whose pages, aux and state rows may be reused now (every source
        confirmed the drain or died), each once. Prefill: always empty."""
        return list(super().take_reclaimed_rooms())

    def close(self) -> None:
        """Tears the rank down (transport first), then lets go of its memory. Idempotent."""
        if getattr(self, "_constructed", False):  # a failed constructor left no compiled manager
            super().close()
        if self._buffers is not None:
            self._buffers.release()
            self._buffers = None

    def __del__(self):
        # Before the attributes go (in no set order): the rank first, then the buffers it registered.
        try:
            self.close()
        except Exception:  # a constructor that failed, or interpreter exit
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _rows(indices) -> list:
    """Row indices (a list or numpy integer array; None: none) as Python ints."""
    return [] if indices is None else [int(i) for i in indices]


class _Room:
    def __init__(self, mgr: KVManager, bootstrap_room: int, role: str, bootstrap_addr: Optional[str] = None,
                 prefill_dp_rank: Optional[int] = None):
        if mgr.role != role:
            raise ValueError(f"a {type(self).__name__} needs a {role} manager, not {mgr.role}")
        self._mgr = mgr
        self.bootstrap_room = int(bootstrap_room)
        self._closed = True
        dp_rank = -1 if prefill_dp_rank is None else int(prefill_dp_rank)
        mgr.room_open(self.bootstrap_room, bootstrap_addr or "", dp_rank)
        self._closed = False

    def poll(self) -> KVPoll:
        return KVPoll(self._mgr.room_poll(self.bootstrap_room))

    def metrics(self) -> dict:
        """bytes (prefill: written; decode: expected), latency_s (first send to done),
        wait_metadata_s, and the CLOCK_MONOTONIC ns stamps created/metadata/first_send/done.
        After close(), the room's metrics when it was closed (kept for the last 4096 closed rooms)."""
        return self._mgr.room_metrics(self.bootstrap_room)

    @property
    def manager(self) -> "KVManager":
        """The manager this room belongs to."""
        return self._mgr

    def failure(self) -> Optional[KVTransferError]:
        """The room's KVTransferError if it failed (None otherwise), without raising it."""
        f = self._mgr.room_failure(self.bootstrap_room)
        return None if f is None else KVTransferError(*f)

    def failure_exception(self) -> None:
        """Raises the room's KVTransferError if it failed; returns None otherwise."""
        f = self.failure()
        if f is not None:
            raise f

    def fail(self, code: str, reason: str) -> None:
        """Fails the room on this rank as its own failure (origin this rank, the given code, e.g.
        "invalid_argument" for a call the engine made that kvferry refused) and tells its peers.
        No-op if the room already ended. Raises ValueError for an unknown code."""
        self._mgr.room_fail(self.bootstrap_room, code, reason)

    def abort(self, reason: str = "aborted by the engine") -> None:
        """Fails the room on this rank (code "aborted", origin this rank) and tells its peers."""
        self._mgr.room_abort(self.bootstrap_room, reason)

    def fail_from_engine(self, error: KVTransferError) -> None:
        """A failure the engine learned from another of its ranks (e.g. its per-step agreement):
        the room fails here with that error's code, reason and origin (is_from_another_rank unless
        the origin is this rank) and its peers are told. No-op if the room already ended."""
        self._mgr.room_fail_from_engine(self.bootstrap_room, error.code, error.failure_reason, error.origin)

    def fail_from_agreement(self, reason: str, code: str = "aborted", wait_s: float = 1.0) -> KVTransferError:
        """The engine's agreement says the room failed (e.g. SGLang's MIN over its TP group) but this
        rank saw no failure of it: returns the room's KVTransferError with its true origin, code and
        reason, from the failure board of the room's bootstrap service (where the rank that observed
        it posted it), waiting up to ``wait_s`` for it; the room fails here as from another rank and
        its peers are told. If the room already failed here, that failure. Without a record in time,
        the room fails with ``reason``/``code`` (origin this rank, from another rank)."""
        f = self._mgr.room_fail_from_agreement(self.bootstrap_room, code, reason, int(wait_s * 1000))
        return KVTransferError(*f)

    def release_safe(self) -> bool:
        """True once no write can still reach the room's pages, aux row and state rows: only then
        may the engine free or reuse them. Failed does not imply it (a prefill may still write)."""
        return self._mgr.room_release_safe(self.bootstrap_room)

    def close(self) -> None:
        """The engine is done: the room is released once no write can still reach its pages."""
        if not self._closed:
            self._closed = True
            self._mgr.room_close(self.bootstrap_room)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter exit: the manager may be gone
            pass


class KVSender(_Room):
    """Prefill side of one room: init(num_kv_indices, aux_index), then send() chunks of local pages."""

    def __init__(self, mgr: KVManager, bootstrap_room: int):
        super().__init__(mgr, bootstrap_room, "prefill")

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None, num_tokens: Optional[int] = None) -> None:
        """The room has `num_kv_indices` pages (`num_tokens` tokens; default: full pages). With
        engine buffers, `aux_index` is this rank's aux row, copied into decode's row of every aux
        buffer after the last KV write; with a kv_pool kvferry stages its own aux record."""
        self._mgr.sender_init(self.bootstrap_room, int(num_kv_indices), int(aux_index or 0),
                                    int(num_tokens or 0))

    def send(self, kv_indices: Iterable[int], state_indices: Optional[Iterable[int]] = None,
             last: Optional[bool] = None, layers: Optional[Tuple[int, int]] = None) -> None:
        """Writes the room's next len(kv_indices) pages from these local pages to every decode rank.
        last: None infers it (after this chunk every layer reached init's page count); False keeps
        the room open for a further (possibly empty) last chunk. state_indices (local state rows) go
        with the last chunk only. The aux row follows the last page; poll() is Success once all of
        it is at decode.
        layers: None sends every layer; (begin, end) only the KV buffers of layers [begin, end)
        (0-based; layer l is KV buffers l and num_layers + l: its K and V), so a forward pass can
        send each layer as it computes it. Each layer sends its pages in order: a call writes the
        next len(kv_indices) pages of each layer of the range, which must all stand at the same
        page. Raises ValueError for an empty range or one past the model, layers at different
        pages, a layer given more pages than the room has, or a last chunk that leaves pages of
        some layer unsent."""
        rng = None if layers is None else (int(layers[0]), int(layers[1]))
        self._mgr.sender_send(self.bootstrap_room, [int(i) for i in kv_indices], _rows(state_indices), last, rng)

    def take_completed_sends(self) -> list:
        """The per-chunk completion event: the numbers (0, 1, 2 ... in call order) of this room's
        send() calls whose KV writes have all ended since the last call, each once. A send's local
        pages may be reused once its number came back (e.g. a staging ring). A send of no pages
        (only the last may carry none) and a send on a room that had failed end at once. The
        room's aux and state rows are not a send's pages: they are read after every KV write, so
        keep them until the room ends (Success, or Failed and release-safe)."""
        return list(self._mgr.sender_take_completed_sends(self.bootstrap_room))


class KVReceiver(_Room):
    """Decode side of one room: init(kv_indices, aux_index, state_indices), then poll() until
    Success or Failed; free its pages and rows once release_safe()."""

    def __init__(self, mgr: KVManager, bootstrap_room: int, bootstrap_addr: Optional[str] = None,
                 prefill_dp_rank: Optional[int] = None):
        """bootstrap_addr: the prefill instance's bootstrap service (default: the manager's);
        prefill_dp_rank: its DP group serving the room (default: chosen by room)."""
        super().__init__(mgr, bootstrap_room, "decode", bootstrap_addr, prefill_dp_rank)

    def init(self, kv_indices: Iterable[int], aux_index: int, state_indices: Optional[Iterable[int]] = None,
             num_tokens: Optional[int] = None) -> None:
        """Destination pages (one per room page, in order), aux row and state rows; sends them to
        every prefill source of the room."""
        self._mgr.receiver_init(self.bootstrap_room, [int(i) for i in kv_indices], int(aux_index),
                                      _rows(state_indices), int(num_tokens or 0))

    send_metadata = init

    def quarantined(self) -> bool:
        """True if release_safe() only because the drain deadline passed: do not reuse the pages."""
        return self._mgr.room_quarantined(self.bootstrap_room)

    def aux(self, aux_index: int) -> dict:
        """With a kv_pool: the aux record prefill wrote last (room, cached_tokens, num_pages)."""
        return self._mgr.aux_row(int(aux_index))
