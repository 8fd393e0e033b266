"""Engine-owned buffers, described for kvferry's manager (C++: include/kvferry/buffers.h).

A serving engine hands its transfer layer three lists of buffers, as SGLang's ``KVArgs`` carries
them (``kv_data_ptrs``/``kv_data_lens``/``kv_item_lens``, and the same for ``aux_`` and
``state_``):

* ``kv``: one buffer per layer tensor (MHA/GQA: every layer's K, then every layer's V; MLA: one
  latent per layer); item ``i`` of each is page ``i``; all KV buffers have the same item size.
* ``aux``: per-request metadata rows (first output token, cached-token count, logprobs, hidden
  states, ...); a room's ``aux_index`` names its row in every aux buffer.
* ``state``: optional per-request state rows of hybrid models (Mamba, sliding window).

Each list comes either as buffer objects or as raw device/host addresses with lengths and item
lengths (SGLang's KVArgs; ``device``: the CUDA device ordinal of device pointers, SGLang's
``gpu_id``). Buffer objects, C-contiguous, the item size defaulting to ``nbytes // shape[0]`` for
two or more dimensions:

* host memory through Python's buffer protocol (numpy arrays, bytearrays, memoryviews; writable);
* tensors with ``data_ptr()`` (PyTorch's shape: ``numel()``, ``element_size()``,
  ``is_contiguous()``, ``device.type`` "cuda" or "cpu" and ``device.index``): memory kind and
  device ordinal from ``device``;
* objects with ``__cuda_array_interface__`` (CuPy, Numba, PyTorch; version 2 or 3: ``data``,
  ``shape``, ``typestr``, ``strides``): device memory; the ordinal from ``device.id`` where the
  object has one (CuPy), else the ``device`` argument, else 0.

Nothing here imports torch or any GPU library. ``describe`` turns them into ``BufferDesc``
entries; for buffer objects it also holds a reference to each (so it is not freed while
registered) until ``release()``. The engine must not resize a registered buffer (numpy's
``resize(refcheck=False)`` would move its memory). Device memory is checked when a manager
registers it (docs/gpu.md, "Memory kinds"): without a usable GPU, or with a pointer that is not
device memory of its ordinal, ``KVManager(...)`` raises ``ValueError`` naming the buffer
(``kv buffer 0 (cuda device 1)``) and why; nothing here touches the memory.

Units: bytes. Errors: ``ValueError`` naming the buffer (``kv[3]``) and what is wrong with it;
``BufferError``/``TypeError`` from Python for objects that are not writable contiguous buffers.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

KINDS = ("kv", "aux", "state")
MEMORY_KINDS = ("host", "cuda")

__all__ = ["BufferDesc", "EngineBuffers", "describe", "from_kv_args", "KINDS"]


@dataclass(frozen=True)
class BufferDesc:
    """One registered buffer: start address, size and item size in bytes, kind, memory kind and
    the CUDA device ordinal of device memory (0 for host memory)."""
    address: int
    nbytes: int
    item_bytes: int
    kind: str
    memory: str = "host"
    device: int = 0

    @property
    def items(self) -> int:
        """Pages (kv) or rows (aux, state) the buffer holds."""
        return self.nbytes // self.item_bytes

    def as_tuple(self) -> tuple:
        return (self.address, self.nbytes, self.item_bytes, self.kind, self.memory, self.device)


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


def _ordinal(value, what: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a CUDA device ordinal (an integer), not {value!r}") from None
    if v < 0:
        raise ValueError(f"{what} must be a CUDA device ordinal (0 or more), not {v}")
    return v


@dataclass
class _Memory:
    """What a buffer object says about its memory."""
    address: int
    nbytes: int
    shape: tuple
    memory: str
    device: Optional[int]  # None: the object does not say
    contiguous: bool
    readonly: bool


def _tensor_memory(obj, name: str) -> _Memory:
    """A tensor with data_ptr() (PyTorch's shape, duck-typed)."""
    dev = getattr(obj, "device", None)
    dev_type = getattr(dev, "type", None)
    if dev_type not in ("cuda", "cpu"):
        raise ValueError(f"{name} is on device {dev!r}: kvferry takes cuda and cpu tensors")
    try:
        nbytes = int(obj.numel()) * int(obj.element_size())
        contiguous = bool(obj.is_contiguous())
        shape = tuple(int(x) for x in obj.shape)
    except AttributeError as e:
        raise ValueError(f"{name}: a tensor with data_ptr() needs numel(), element_size(), "
                         f"is_contiguous() and shape ({e})") from None
    index = getattr(dev, "index", None)
    return _Memory(int(obj.data_ptr()), nbytes, shape,
                   "cuda" if dev_type == "cuda" else "host",
                   None if dev_type != "cuda" or index is None else _ordinal(index, f"{name} device index"),
                   contiguous, False)


def _cuda_array_memory(obj, cai, name: str) -> _Memory:
    """An object with __cuda_array_interface__ (device memory by definition)."""
    try:
        shape = tuple(int(x) for x in cai["shape"])
        itemsize = int(str(cai["typestr"])[2:])
        address, readonly = cai["data"]
        strides = cai.get("strides")
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{name}: malformed __cuda_array_interface__ ({e!r})") from None
    if cai.get("mask") is not None:
        raise ValueError(f"{name}: a masked __cuda_array_interface__ is not a buffer")
    nbytes = itemsize
    for n in shape:
        nbytes *= n
    contiguous = True
    if strides is not None:  # C-contiguous: each stride the bytes of the dimensions after it
        step = itemsize
        for n, st in reversed(list(zip(shape, strides))):
            if n > 1 and int(st) != step:
                contiguous = False
            step *= n
    dev = getattr(obj, "device", None)
    index = getattr(dev, "id", None)  # CuPy's Device
    return _Memory(int(address or 0), nbytes, shape, "cuda",
                   None if index is None else _ordinal(index, f"{name} device id"), contiguous, bool(readonly))


def _object_memory(obj, name: str) -> Optional[_Memory]:
    """A tensor-like object's memory; None for anything else (buffer-protocol objects)."""
    if callable(getattr(obj, "data_ptr", None)):
        return _tensor_memory(obj, name)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        if not isinstance(cai, dict):
            raise ValueError(f"{name}: __cuda_array_interface__ is not a dict")
        return _cuda_array_memory(obj, cai, name)
    return None


def _from_object(obj, name: str, kind: str, item_len: Optional[int], memory: Optional[str],
                 device: Optional[int], held: List[Any]) -> BufferDesc:
    m = _object_memory(obj, name)
    if m is None:  # host memory through the buffer protocol
        view = memoryview(obj)
        # A ctypes array over the buffer: its address, and a reference that keeps the buffer alive.
        anchor = None if view.readonly or not view.c_contiguous or view.nbytes == 0 else \
            (ctypes.c_char * view.nbytes).from_buffer(view.cast("B"))
        m = _Memory(ctypes.addressof(anchor) if anchor is not None else 0, view.nbytes, tuple(view.shape),
                    "host", None, view.c_contiguous, view.readonly)
        obj = anchor
    if m.readonly:
        raise ValueError(f"{name} is read-only: kvferry writes into engine buffers")
    if not m.contiguous:
        raise ValueError(f"{name} is not C-contiguous")
    if m.nbytes == 0:
        raise ValueError(f"{name} is empty")
    if m.address <= 0:
        raise ValueError(f"{name} has no address ({m.address:#x})")
    if memory is not None and memory != m.memory:
        raise ValueError(f"{name} is {m.memory} memory, not {memory}")
    dev = 0
    if m.memory == "cuda":
        if m.device is not None and device is not None and m.device != device:
            raise ValueError(f"{name} is on cuda device {m.device}, not the given device {device}")
        dev = m.device if m.device is not None else (device if device is not None else 0)
    if item_len is None:
        if len(m.shape) < 2:
            raise ValueError(f"{name}: give its item length ({kind}_item_lens) for a 1-D buffer")
        item_len = m.nbytes // m.shape[0]
    held.append(obj)  # kept alive (and so its memory) until release()
    return BufferDesc(m.address, m.nbytes, _positive_int(item_len, f"{name} item length"), kind, m.memory, dev)


def _describe_kind(kind: str, buffers, ptrs, lens, item_lens, memory: Optional[str], device: Optional[int],
                   held: List[Any]) -> List[BufferDesc]:
    if buffers is not None and ptrs is not None:
        raise ValueError(f"{kind}: give buffer objects or pointers, not both")
    out: List[BufferDesc] = []
    if buffers is not None:
        buffers = list(buffers)
        if item_lens is not None and len(item_lens) != len(buffers):
            raise ValueError(f"{kind}: {len(item_lens)} item lengths for {len(buffers)} buffers")
        for i, b in enumerate(buffers):
            out.append(_from_object(b, f"{kind}[{i}]", kind, None if item_lens is None else item_lens[i], memory,
                                    device, held))
    elif ptrs is not None:
        ptrs = list(ptrs)
        if lens is None or item_lens is None:
            raise ValueError(f"{kind}: pointers need {kind}_data_lens and {kind}_item_lens")
        if not len(ptrs) == len(lens) == len(item_lens):
            raise ValueError(f"{kind}: {len(ptrs)} pointers, {len(lens)} lengths, {len(item_lens)} item lengths")
        memory = memory or "host"
        dev = (device or 0) if memory == "cuda" else 0
        for i, (p, n, item) in enumerate(zip(ptrs, lens, item_lens)):
            name = f"{kind}[{i}]"
            out.append(BufferDesc(_positive_int(p, f"{name} address"), _positive_int(n, f"{name} length"),
                                  _positive_int(item, f"{name} item length"), kind, memory, dev))
    for i, d in enumerate(out):
        if d.item_bytes > d.nbytes:
            raise ValueError(f"{kind}[{i}]: item length {d.item_bytes} exceeds its {d.nbytes} bytes")
    return out


def _memory_of(memory, kind: str) -> Optional[str]:
    m = memory.get(kind) if isinstance(memory, dict) else memory
    if m is not None and m not in MEMORY_KINDS:
        raise ValueError(f"memory must be one of {MEMORY_KINDS}, not {m!r}")
    return m


def describe(kv=None, aux=None, state=None, *, kv_ptrs: Optional[Sequence[int]] = None,
             kv_lens: Optional[Sequence[int]] = None, kv_item_lens: Optional[Sequence[int]] = None,
             aux_ptrs: Optional[Sequence[int]] = None, aux_lens: Optional[Sequence[int]] = None,
             aux_item_lens: Optional[Sequence[int]] = None, state_ptrs: Optional[Sequence[int]] = None,
             state_lens: Optional[Sequence[int]] = None, state_item_lens: Optional[Sequence[int]] = None,
             memory: Union[None, str, Dict[str, str]] = None, device: Optional[int] = None) -> EngineBuffers:
    """Describes an engine's buffers: ``kv``/``aux``/``state`` as lists of buffer objects (host
    arrays, tensors, ``__cuda_array_interface__`` objects; see the module doc), or the ``*_ptrs``,
    ``*_lens`` and ``*_item_lens`` of each kind. ``memory``: "host" or "cuda", or a dict of them by
    kind ({"kv": "cuda", "aux": "host"}): the memory kind of pointers (default "host"); for buffer
    objects, what they must be (default: whatever each is). ``device``: the CUDA device ordinal of
    device pointers, and of device objects that do not say theirs (default 0); an object on another
    device is refused. At least one KV buffer; every KV buffer has the same item length."""
    if memory is not None and not isinstance(memory, (str, dict)):
        raise ValueError(f"memory must be one of {MEMORY_KINDS} or a dict of them by kind, not {memory!r}")
    if isinstance(memory, dict) and not set(memory) <= set(KINDS):
        raise ValueError(f"memory: kinds are {KINDS}, not {sorted(set(memory) - set(KINDS))}")
    device = None if device is None else _ordinal(device, "device")
    held: List[Any] = []
    descs = (_describe_kind("kv", kv, kv_ptrs, kv_lens, kv_item_lens, _memory_of(memory, "kv"), device, held) +
             _describe_kind("aux", aux, aux_ptrs, aux_lens, aux_item_lens, _memory_of(memory, "aux"), device, held) +
             _describe_kind("state", state, state_ptrs, state_lens, state_item_lens, _memory_of(memory, "state"),
                            device, held))
    kv_descs = [d for d in descs if d.kind == "kv"]
    if not kv_descs:
        raise ValueError("no KV buffer: give kv buffers or kv_ptrs")
    sizes = sorted({d.item_bytes for d in kv_descs})
    if len(sizes) > 1:
        raise ValueError(f"KV buffers must all have one item length (a page), not {sizes}")
    return EngineBuffers(descs, held)


def from_kv_args(kv_args, memory: Union[str, Dict[str, str]] = "host", device: Optional[int] = None) -> EngineBuffers:
    """Describes the buffers of an object shaped like SGLang's KVArgs (``kv_data_ptrs``,
    ``kv_data_lens``, ``kv_item_lens``, ``aux_...``, and optionally ``state_...``). ``memory`` as
    for ``describe`` (SGLang: ``{"kv": "cuda", "aux": "host", "state": "cuda"}``); ``device``: the
    ordinal of its device pointers, by default ``kv_args.gpu_id`` (0 where it has none)."""
    def get(name):
        v = getattr(kv_args, name, None)
        return None if v is None or (name.startswith("state_") and len(v) == 0) else list(v)

    if device is None:
        gpu_id = getattr(kv_args, "gpu_id", None)
        device = None if gpu_id is None else _ordinal(gpu_id, "KVArgs.gpu_id")
    return describe(kv_ptrs=get("kv_data_ptrs"), kv_lens=get("kv_data_lens"), kv_item_lens=get("kv_item_lens"),
                    aux_ptrs=get("aux_data_ptrs"), aux_lens=get("aux_data_lens"), aux_item_lens=get("aux_item_lens"),
                    state_ptrs=get("state_data_ptrs"), state_lens=get("state_data_lens"),
                    state_item_lens=get("state_item_lens"), memory=memory, device=device)
