"""kvferry.describe_buffers / from_kv_args: engine-owned buffers (numpy arrays or KVArgs-shaped
pointers) become the manager's buffer descriptions, with every bad shape named."""
import gc
import types
import weakref

import numpy as np
import pytest

import kvferry


def engine_arrays(num_layers=3, pages=12, page_bytes=256, aux_rows=8, state_rows=4):
    kv = [np.zeros((pages, page_bytes // 2), dtype=np.float16) for _ in range(2 * num_layers)]
    aux = [np.zeros((aux_rows, 2), dtype=np.int32), np.zeros((aux_rows, 12), dtype=np.float32)]
    state = [np.zeros((state_rows, 96), dtype=np.uint8)]
    return kv, aux, state


def test_numpy_buffers_give_their_addresses_sizes_and_row_sizes():
    kv, aux, state = engine_arrays()
    b = kvferry.describe_buffers(kv, aux, state)
    assert [d.kind for d in b.descs] == ["kv"] * 6 + ["aux"] * 2 + ["state"]
    for d, a in zip(b.descs, kv + aux + state):
        assert (d.address, d.nbytes, d.memory) == (a.ctypes.data, a.nbytes, "host")
    assert [d.item_bytes for d in b.of("kv")] == [256] * 6
    assert [(d.item_bytes, d.items) for d in b.of("aux")] == [(8, 8), (48, 8)]
    assert [(d.item_bytes, d.items) for d in b.of("state")] == [(96, 4)]
    assert b.of("kv")[0].as_tuple() == (kv[0].ctypes.data, 12 * 256, 256, "kv", "host", 0)


def test_buffer_objects_stay_alive_until_release():
    kv = np.zeros((4, 256), dtype=np.uint8)
    alive = weakref.ref(kv)
    b = kvferry.describe_buffers([kv])
    address = kv.ctypes.data
    del kv
    gc.collect()
    assert alive() is not None and alive().ctypes.data == address  # held by the description
    b.release()
    gc.collect()
    assert alive() is None


def test_bad_buffers_are_named():
    kv, aux, state = engine_arrays()
    ro = np.zeros((4, 64), dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"kv\[1\] is read-only"):
        kvferry.describe_buffers([kv[0], ro])
    with pytest.raises(ValueError, match=r"aux\[0\] is not C-contiguous"):
        kvferry.describe_buffers(kv, [np.zeros((8, 4), dtype=np.int32)[:, ::2]])
    with pytest.raises(ValueError, match=r"state\[0\]: give its item length \(state_item_lens\) for a 1-D buffer"):
        kvferry.describe_buffers(kv, aux, [np.zeros(64, dtype=np.uint8)])
    with pytest.raises(ValueError, match=r"KV buffers must all have one item length \(a page\), not \[128, 256\]"):
        kvferry.describe_buffers([kv[0], np.zeros((12, 64), dtype=np.float16)])
    with pytest.raises(ValueError, match="no KV buffer"):
        kvferry.describe_buffers(None, aux)
    with pytest.raises(ValueError, match=r"kv\[0\]: item length 4096 exceeds its 3072 bytes"):
        kvferry.describe_buffers(kv[:1], kv_item_lens=[4096])
    with pytest.raises(ValueError, match="kv: 1 item lengths for 6 buffers"):
        kvferry.describe_buffers(kv, kv_item_lens=[256])
    with pytest.raises(ValueError, match=r"kv\[0\] is empty"):
        kvferry.describe_buffers([np.zeros((0, 4))])
    with pytest.raises(TypeError):
        kvferry.describe_buffers([object()])


def test_pointer_lists_as_kv_args_carries_them():
    args = types.SimpleNamespace(
        kv_data_ptrs=[0x10000, 0x20000], kv_data_lens=[4096, 4096], kv_item_lens=[512, 512],
        aux_data_ptrs=[0x30000, 0x31000, 0x32000], aux_data_lens=[640, 64, 256], aux_item_lens=[10, 1, 4],
        state_data_ptrs=[], state_data_lens=[], state_item_lens=[])
    b = kvferry.from_kv_args(args)
    assert [d.as_tuple() for d in b.descs] == [
        (0x10000, 4096, 512, "kv", "host", 0), (0x20000, 4096, 512, "kv", "host", 0),
        (0x30000, 640, 10, "aux", "host", 0), (0x31000, 64, 1, "aux", "host", 0), (0x32000, 256, 4, "aux", "host", 0)]
    assert [d.items for d in b.descs] == [8, 8, 64, 64, 64]
    # A KVArgs without state fields at all, and device pointers.
    del args.state_data_ptrs, args.state_data_lens, args.state_item_lens
    assert {d.memory for d in kvferry.from_kv_args(args, memory="cuda").descs} == {"cuda"}


def test_bad_pointer_lists_are_named():
    with pytest.raises(ValueError, match="kv: 2 pointers, 1 lengths, 2 item lengths"):
        kvferry.describe_buffers(kv_ptrs=[1, 2], kv_lens=[8], kv_item_lens=[4, 4])
    with pytest.raises(ValueError, match="kv: pointers need kv_data_lens and kv_item_lens"):
        kvferry.describe_buffers(kv_ptrs=[1])
    with pytest.raises(ValueError, match=r"aux\[0\] address must be positive, not 0"):
        kvferry.describe_buffers(kv_ptrs=[1], kv_lens=[8], kv_item_lens=[8], aux_ptrs=[0], aux_lens=[8],
                                 aux_item_lens=[8])
    with pytest.raises(ValueError, match=r"kv\[0\] item length must be an integer, not 'x'"):
        kvferry.describe_buffers(kv_ptrs=[1], kv_lens=[8], kv_item_lens=["x"])
    with pytest.raises(ValueError, match="memory must be one of"):
        kvferry.describe_buffers(kv_ptrs=[1], kv_lens=[8], kv_item_lens=[8], memory="rocm")
    kv, _, _ = engine_arrays()
    with pytest.raises(ValueError, match="kv: give buffer objects or pointers, not both"):
        kvferry.describe_buffers(kv, kv_ptrs=[1], kv_lens=[8], kv_item_lens=[8])
    with pytest.raises(ValueError, match=r"kv\[0\] is host memory, not cuda"):
        kvferry.describe_buffers(kv, memory="cuda")


def test_manager_over_engine_buffers_holds_them_until_close():
    server = kvferry.BootstrapServer()
    geo = dict(num_layers=3, num_kv_heads=2, head_dim=32, dtype_bytes=2, page_size=2, model_name="tiny-buffers")
    kv, aux, state = engine_arrays()  # pages of 2 tokens x 2 heads x 32 x 2 bytes = 256 bytes
    with pytest.raises(ValueError, match="give kv_pool or buffers"):
        kvferry.KVManager("prefill", np.zeros(1 << 16, np.uint8), buffers=kvferry.describe_buffers(kv),
                          bootstrap_addr=f"127.0.0.1:{server.port}", **geo)
    with pytest.raises(ValueError, match="give kv_pool or buffers"):
        kvferry.KVManager("prefill", bootstrap_addr=f"127.0.0.1:{server.port}", **geo)
    alive = weakref.ref(kv[0])
    mgr = kvferry.KVManager("prefill", buffers=kvferry.describe_buffers(kv, aux, state),
                            bootstrap_addr=f"127.0.0.1:{server.port}", transport="tcp", **geo)
    assert mgr.layout["num_pages"] == 12 and mgr.layout["aux_slots"] == 8
    sender = kvferry.KVSender(mgr, 7)
    assert sender.release_safe() is True  # nothing was sent: nothing can land
    with pytest.raises(ValueError, match="aux_index 8 is out of range"):
        sender.init(2, aux_index=8)
    sender.init(2, aux_index=1)
    with pytest.raises(ValueError, match="send\\(\\) of no pages that is not the last chunk"):
        sender.send([], last=False)
    with pytest.raises(ValueError, match="state indices go with the last chunk only"):
        sender.send([0], state_indices=[1])
    with pytest.raises(ValueError, match=r"state_indices\[0\] = -1 is negative"):
        sender.send([0, 1], state_indices=[-1])
    sender.close()
    del kv, aux, state
    gc.collect()
    assert alive() is not None  # registered: held by the manager
    mgr.close()
    gc.collect()
    assert alive() is None


def test_fault_injection_is_off_unless_asked_for():
    # Issue 31: the module built every manager with the fault-injecting transport and its hooks.
    server = kvferry.BootstrapServer()
    geo = dict(num_layers=3, num_kv_heads=2, head_dim=32, dtype_bytes=2, page_size=2, model_name="tiny-faults")
    kv, aux, state = engine_arrays()
    mgr = kvferry.KVManager("prefill", buffers=kvferry.describe_buffers(kv, aux, state),
                            bootstrap_addr=f"127.0.0.1:{server.port}", transport="tcp", **geo)
    for hook in (lambda: mgr.inject_write_failure(7), lambda: mgr.hold_writes(7),
                 lambda: mgr.release_held_writes(7), lambda: mgr.held_writes(7)):
        with pytest.raises(ValueError, match="fault injection is off"):
            hook()
    mgr.close()
    mgr = kvferry.KVManager("prefill", buffers=kvferry.describe_buffers(kv, aux, state),
                            bootstrap_addr=f"127.0.0.1:{server.port}", transport="tcp", fault_injection=True,
                            **geo)
    mgr.hold_writes(7)
    assert mgr.held_writes(7) == 0
    mgr.release_held_writes(7)
    mgr.inject_write_failure(7)
    mgr.close()
