"""Engines' device pointers through the Python module (issue 32 item 5; docs/gpu.md, "From Python"):
tensors with data_ptr() and objects with __cuda_array_interface__ (stand-ins here: nothing imports
torch) and SGLang's KVArgs with gpu_id become buffer descriptions with their address, length, item
length, memory kind and device ordinal; registering device memory on a machine that cannot back it
is a ValueError naming the buffer and the reason, never a crash; host tensors still move bytes."""
import types

import numpy as np
import pytest

import kvferry
from kv_test_util import wait_until


class FakeDevice:
    """torch.device's shape: type and index."""

    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __repr__(self):
        return f"device(type={self.type!r}, index={self.index!r})"


class FakeTensor:
    """torch.Tensor's shape over a numpy array's memory (which plays device memory when the device
    says cuda): data_ptr(), numel(), element_size(), is_contiguous(), shape, device."""

    def __init__(self, array, device="cpu", index=None):
        self.array, self.device = array, FakeDevice(device, index)
        self.shape = array.shape

    def data_ptr(self):
        return self.array.ctypes.data

    def numel(self):
        return self.array.size

    def element_size(self):
        return self.array.itemsize

    def is_contiguous(self):
        return self.array.flags.c_contiguous


class FakeCudaArray:
    """CuPy's / Numba's shape: __cuda_array_interface__ (version 3); device.id where given (CuPy)."""

    def __init__(self, array, device_id=None, readonly=False, strides=None):
        self.array, self.readonly, self.strides = array, readonly, strides
        if device_id is not None:
            self.device = types.SimpleNamespace(id=device_id)

    @property
    def __cuda_array_interface__(self):
        a = self.array
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, self.readonly),
                "strides": self.strides, "version": 3}


def test_tensors_give_pointer_length_item_length_and_device():
    a = np.zeros((8, 64), np.float16)
    t = kvferry.describe_buffers([FakeTensor(a, "cuda", 1)]).descs[0]
    assert t.as_tuple() == (a.ctypes.data, a.nbytes, 128, "kv", "cuda", 1)
    # __cuda_array_interface__: the object's own device (CuPy's device.id), else `device`, else 0.
    b = np.zeros((4, 32), np.int32)
    assert kvferry.describe_buffers([FakeCudaArray(b, 2)]).descs[0].as_tuple() == \
        (b.ctypes.data, b.nbytes, 128, "kv", "cuda", 2)
    assert kvferry.describe_buffers([FakeCudaArray(b)], device=3).descs[0].device == 3
    assert kvferry.describe_buffers([FakeCudaArray(b)]).descs[0].device == 0
    # Explicit C-contiguous strides are contiguous; item lengths may be given.
    d = kvferry.describe_buffers([FakeCudaArray(b, strides=b.strides)], kv_item_lens=[64]).descs[0]
    assert (d.nbytes, d.item_bytes, d.items) == (b.nbytes, 64, 8)
    # Device KV with host aux rows, as SGLang keeps them.
    aux = np.zeros((4, 16), np.uint8)
    bufs = kvferry.describe_buffers([FakeTensor(a, "cuda", 1)], [aux])
    assert [(x.kind, x.memory, x.device) for x in bufs.descs] == [("kv", "cuda", 1), ("aux", "host", 0)]


def test_bad_device_objects_are_named():
    a = np.zeros((8, 64), np.uint8)
    with pytest.raises(ValueError, match=r"kv\[0\] is on cuda device 1, not the given device 0"):
        kvferry.describe_buffers([FakeTensor(a, "cuda", 1)], device=0)
    with pytest.raises(ValueError, match=r"kv\[0\] is not C-contiguous"):
        kvferry.describe_buffers([FakeCudaArray(a[:, ::2], strides=a[:, ::2].strides)])
    with pytest.raises(ValueError, match=r"kv\[0\] is not C-contiguous"):
        kvferry.describe_buffers([FakeTensor(a.T, "cuda", 0)])
    with pytest.raises(ValueError, match=r"kv\[0\] is read-only"):
        kvferry.describe_buffers([FakeCudaArray(a, readonly=True)])
    with pytest.raises(ValueError, match=r"kv\[0\] is empty"):
        kvferry.describe_buffers([FakeCudaArray(np.zeros((0, 4), np.uint8))])
    with pytest.raises(ValueError, match=r"kv\[0\] is on device device\(type='mps'"):
        kvferry.describe_buffers([FakeTensor(a, "mps", 0)])
    with pytest.raises(ValueError, match=r"kv\[0\] is cuda memory, not host"):
        kvferry.describe_buffers([FakeTensor(a, "cuda", 0)], memory="host")
    with pytest.raises(ValueError, match=r"aux\[0\] is host memory, not cuda"):
        kvferry.describe_buffers([FakeTensor(a, "cuda", 0)], [a], memory={"kv": "cuda", "aux": "cuda"})
    with pytest.raises(ValueError, match="device must be a CUDA device ordinal"):
        kvferry.describe_buffers([FakeCudaArray(a)], device=-1)


def sglang_kv_args(gpu_id, kv, aux):
    """SGLang's KVArgs' buffer fields and gpu_id (python/sglang/srt/disaggregation/base/conn.py)."""
    return types.SimpleNamespace(
        kv_data_ptrs=[x.ctypes.data for x in kv], kv_data_lens=[x.nbytes for x in kv],
        kv_item_lens=[x.nbytes // x.shape[0] for x in kv], aux_data_ptrs=[x.ctypes.data for x in aux],
        aux_data_lens=[x.nbytes for x in aux], aux_item_lens=[x.nbytes // x.shape[0] for x in aux],
        state_data_ptrs=[], state_data_lens=[], state_item_lens=[], gpu_id=gpu_id)


def test_kv_args_device_pointers_are_on_gpu_id():
    kv = [np.zeros((8, 64), np.uint8) for _ in range(2)]
    aux = [np.zeros((4, 16), np.uint8)]
    args = sglang_kv_args(2, kv, aux)
    b = kvferry.from_kv_args(args, memory={"kv": "cuda", "aux": "host", "state": "cuda"})
    assert [d.as_tuple() for d in b.descs] == [
        (kv[0].ctypes.data, 512, 64, "kv", "cuda", 2), (kv[1].ctypes.data, 512, 64, "kv", "cuda", 2),
        (aux[0].ctypes.data, 64, 16, "aux", "host", 0)]
    assert {d.device for d in kvferry.from_kv_args(args, memory="cuda", device=5).descs} == {5}
    assert {d.device for d in kvferry.from_kv_args(args).descs} == {0}  # host pointers
    args.gpu_id = -1
    with pytest.raises(ValueError, match="KVArgs.gpu_id must be a CUDA device ordinal"):
        kvferry.from_kv_args(args, memory="cuda")


GEO = dict(num_layers=1, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-device")
PAGES, PAGE_BYTES = 8, 4 * 2 * 16 * 2

# Device memory this process cannot back, by what the machine has: this kvferry built without CUDA;
# no usable CUDA device; no device of that ordinal; host memory posing as device memory (a GPU).
REFUSALS = r"(this kvferry was built without CUDA|no usable CUDA device|no such device|not device memory)"


def test_device_buffers_are_refused_naming_the_buffer_and_why():
    server = kvferry.BootstrapServer()
    kv = [np.zeros((PAGES, PAGE_BYTES // 2), np.float16) for _ in range(2)]
    aux = np.zeros((4, 64), np.uint8)
    for role in ("prefill", "decode"):
        with pytest.raises(ValueError, match=r"kv buffer 0 \(cuda device 1\): .*" + REFUSALS):
            kvferry.KVManager(role, buffers=kvferry.describe_buffers([FakeTensor(x, "cuda", 1) for x in kv], [aux]),
                              bootstrap_addr=f"127.0.0.1:{server.port}", transport="tcp", **GEO)
    # KVArgs pointers on gpu_id 3: the ordinal reaches registration.
    b = kvferry.from_kv_args(sglang_kv_args(3, kv, [aux]), memory={"kv": "cuda", "aux": "host"})
    with pytest.raises(ValueError, match=r"kv buffer 0 \(cuda device 3\): .*" + REFUSALS):
        kvferry.KVManager("prefill", buffers=b, bootstrap_addr=f"127.0.0.1:{server.port}", transport="tcp", **GEO)


def test_host_tensors_still_move_bytes():
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    arrays = {r: ([np.zeros((PAGES, PAGE_BYTES // 2), np.float16) for _ in range(2)], np.zeros((4, 64), np.uint8))
              for r in ("prefill", "decode")}
    mgrs = {}
    for role, (kv, aux) in arrays.items():
        b = kvferry.describe_buffers([FakeTensor(x, "cpu") for x in kv], [FakeTensor(aux, "cpu")])
        assert {(d.memory, d.device) for d in b.descs} == {("host", 0)}
        mgrs[role] = kvferry.KVManager(role, buffers=b, bootstrap_addr=addr, transport="tcp", **GEO)
    room, src, dst = 77, [1, 6, 3], [0, 5, 7]
    pkv, dkv = arrays["prefill"][0], arrays["decode"][0]
    content = np.random.default_rng(room).integers(0, 256, size=(2, 3, PAGE_BYTES), dtype=np.uint8)
    for b in range(2):
        pkv[b].view(np.uint8)[src] = content[b]
    rx = kvferry.KVReceiver(mgrs["decode"], room)
    rx.init(dst, aux_index=2)
    tx = kvferry.KVSender(mgrs["prefill"], room)
    assert wait_until(lambda: tx.poll() == kvferry.KVPoll.WaitingForInput)
    tx.init(len(src), aux_index=1)
    tx.send(src)
    assert wait_until(lambda: rx.poll() == kvferry.KVPoll.Success and tx.poll() == kvferry.KVPoll.Success)
    for b in range(2):
        assert np.array_equal(dkv[b].view(np.uint8)[dst], content[b])
    assert wait_until(lambda: tx.release_safe() and rx.release_safe())
    tx.close()
    rx.close()
    for m in mgrs.values():
        m.close()
