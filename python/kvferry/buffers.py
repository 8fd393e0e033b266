"""Engine-owned buffers, described for kvferry's manager (C++: include/kvferry/buffers.h).

A serving engine hands its transfer layer three lists of buffers, as SGLang's ``KVArgs`` carries
them (``kv_data_ptrs``/``kv_data_lens``/``kv_item_lens``, and the same for ``aux_`` and
``state_``):

* ``kv``: one buffer per layer tensor (MHA/GQA: every layer's K, then every layer's V; MLA: one
  latent per layer); item ``i`` of each is page ``i``; all KV buffers have the same item size.
* ``aux``: per-request metadata rows (first output token, cached-token count, logprobs, hidden
  states, ...); a room's ``aux_index`` names its row in every aux buffer.
* ``state``: optional per-request state rows of hybrid models (Mamba, sliding window).

Each list comes either as buffer objects (numpy arrays, bytearrays, memoryviews: writable and
C-contiguous; the item size defaults to ``nbytes // shape[0]`` for arrays of two or more
dimensions) or as raw device/host addresses with lengths and item lengths. ``describe`` turns
them into ``BufferDesc`` entries; for buffer objects it also holds a reference to each (so it is not freed
while registered) until ``release()``. The engine must not resize a registered buffer (numpy's
``resize(refcheck=False)`` would move its memory).

Units: bytes. Errors: ``ValueError`` naming the buffer (``kv[3]``) and what is wrong with it;
``BufferError``/``TypeError`` from Python for objects that are not writable contiguous buffers.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

KINDS = ("kv", "aux", "state")
MEMORY_KINDS = ("host", "cuda")

__all__ = ["BufferDesc", "EngineBuffers", "describe", "from_kv_args", "KINDS"]


@dataclass(frozen=True)
class BufferDesc:
    """One registered buffer: start address, size and item size in bytes, kind, memory kind."""
    address: int
    nbytes: int
    item_bytes: int
    kind: str
    memory: str = "host"

    @property
    def items(self) -> int:
        """Pages (kv) or rows (aux, state) the buffer holds."""
        return self.nbytes // self.item_bytes

    def as_tuple(self) -> tuple:
        return (self.address, self.nbytes, self.item_bytes, self.kind, self.memory)


class EngineBuffers:
    """The described buffers of one rank (``descs``, in kv, aux, state order) and the references
    that keep the buffer objects among them alive until ``release()``."""

    def __init__(self, descs: List[BufferDesc], held: List[Any]):
        self.descs = descs
        self._held = held

    def of(self, kind: str) -> List[BufferDesc]:
        return [d for d in self.descs if d.kind == kind]

    def release(self) -> None:
        """Lets go of the buffer objects (after the manager that registered them is closed)."""
        self._held = []


def _positive_int(value, what: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an integer, not {value!r}") from None
    if v <= 0:
        raise ValueError(f"{what} must be positive, not {v}")
    return v


def _from_object(obj, name: str, kind: str, item_len: Optional[int], held: List[Any]) -> BufferDesc:
    view = memoryview(obj)
    if view.readonly:
        raise ValueError(f"{name} is read-only: kvferry writes into engine buffers")
    if not view.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous")
    if view.nbytes == 0:
        raise ValueError(f"{name} is empty")
    if item_len is None:
        if view.ndim < 2:
            raise ValueError(f"{name}: give its item length ({kind}_item_lens) for a 1-D buffer")
        item_len = view.nbytes // view.shape[0]
    # A ctypes array over the buffer: its address, and a reference that keeps the buffer alive.
    anchor = (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
    held.append(anchor)
    return BufferDesc(ctypes.addressof(anchor), view.nbytes, _positive_int(item_len, f"{name} item length"), kind)


def _describe_kind(kind: str, buffers, ptrs, lens, item_lens, memory: str, held: List[Any]) -> List[BufferDesc]:
    if buffers is not None and ptrs is not None:
        raise ValueError(f"{kind}: give buffer objects or pointers, not both")
    out: List[BufferDesc] = []
    if buffers is not None:
        if memory != "host":
            raise ValueError(f"{kind}: buffer objects are host memory; give {memory} buffers as pointers")
        buffers = list(buffers)
        if item_lens is not None and len(item_lens) != len(buffers):
            raise ValueError(f"{kind}: {len(item_lens)} item lengths for {len(buffers)} buffers")
        for i, b in enumerate(buffers):
            out.append(_from_object(b, f"{kind}[{i}]", kind, None if item_lens is None else item_lens[i], held))
    elif ptrs is not None:
        ptrs = list(ptrs)
        if lens is None or item_lens is None:
            raise ValueError(f"{kind}: pointers need {kind}_data_lens and {kind}_item_lens")
        if not len(ptrs) == len(lens) == len(item_lens):
            raise ValueError(f"{kind}: {len(ptrs)} pointers, {len(lens)} lengths, {len(item_lens)} item lengths")
        for i, (p, n, item) in enumerate(zip(ptrs, lens, item_lens)):
            name = f"{kind}[{i}]"
            out.append(BufferDesc(_positive_int(p, f"{name} address"), _positive_int(n, f"{name} length"),
                                  _positive_int(item, f"{name} item length"), kind, memory))
    for i, d in enumerate(out):
        if d.item_bytes > d.nbytes:
            raise ValueError(f"{kind}[{i}]: item length {d.item_bytes} exceeds its {d.nbytes} bytes")
    return out


def describe(kv=None, aux=None, state=None, *, kv_ptrs: Optional[Sequence[int]] = None,
             kv_lens: Optional[Sequence[int]] = None, kv_item_lens: Optional[Sequence[int]] = None,
             aux_ptrs: Optional[Sequence[int]] = None, aux_lens: Optional[Sequence[int]] = None,
             aux_item_lens: Optional[Sequence[int]] = None, state_ptrs: Optional[Sequence[int]] = None,
             state_lens: Optional[Sequence[int]] = None, state_item_lens: Optional[Sequence[int]] = None,
             memory: str = "host") -> EngineBuffers:
    """Describes an engine's buffers: ``kv``/``aux``/``state`` as lists of buffer objects, or the
    ``*_ptrs``, ``*_lens`` and ``*_item_lens`` of each kind (``memory``: "host" or "cuda" for
    pointers). At least one KV buffer; every KV buffer has the same item length."""
    if memory not in MEMORY_KINDS:
        raise ValueError(f"memory must be one of {MEMORY_KINDS}, not {memory!r}")
    held: List[Any] = []
    descs = (_describe_kind("kv", kv, kv_ptrs, kv_lens, kv_item_lens, memory, held) +
             _describe_kind("aux", aux, aux_ptrs, aux_lens, aux_item_lens, memory, held) +
             _describe_kind("state", state, state_ptrs, state_lens, state_item_lens, memory, held))
    kv_descs = [d for d in descs if d.kind == "kv"]
    if not kv_descs:
        raise ValueError("no KV buffer: give kv buffers or kv_ptrs")
    sizes = sorted({d.item_bytes for d in kv_descs})
    if len(sizes) > 1:
        raise ValueError(f"KV buffers must all have one item length (a page), not {sizes}")
    return EngineBuffers(descs, held)


def from_kv_args(kv_args, memory: str = "host") -> EngineBuffers:
    """Describes the buffers of an object shaped like SGLang's KVArgs (``kv_data_ptrs``,
    ``kv_data_lens``, ``kv_item_lens``, ``aux_...``, and optionally ``state_...``)."""
    def get(name):
        v = getattr(kv_args, name, None)
        return None if v is None or (name.startswith("state_") and len(v) == 0) else list(v)

    return describe(kv_ptrs=get("kv_data_ptrs"), kv_lens=get("kv_data_lens"), kv_item_lens=get("kv_item_lens"),
                    aux_ptrs=get("aux_data_ptrs"), aux_lens=get("aux_data_lens"), aux_item_lens=get("aux_item_lens"),
                    state_ptrs=get("state_data_ptrs"), state_lens=get("state_data_lens"),
                    state_item_lens=get("state_item_lens"), memory=memory)
