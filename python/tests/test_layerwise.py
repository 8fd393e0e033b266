"""KVSender.send(..., layers=(begin, end)): a room sent layer by layer between a prefill and a
decode manager in this process (each with its own progress thread) lands byte-exact, `last` is
inferred once every layer has every page, and bad layer ranges raise ValueError naming them."""
import numpy as np
import pytest

import kvferry
from kv_test_util import wait_until, kv_view, tiny_pool

GEO = dict(num_layers=4, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-layers")
POOL_PAGES = 16
AUX = 8


def pool():
    return tiny_pool(GEO, POOL_PAGES, AUX)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_room_sent_layer_by_layer_arrives_byte_exact(transport):
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    ppool, dpool = pool(), pool()
    pre = kvferry.KVManager("prefill", ppool, bootstrap_addr=addr, transport=transport, aux_slots=AUX, **GEO)
    dec = kvferry.KVManager("decode", dpool, bootstrap_addr=addr, transport=transport, aux_slots=AUX, **GEO)
    room, src, dst = 4242, [2, 0, 5], [7, 9, 1]
    content = np.random.default_rng(room).integers(0, 256, size=(8, 3, pre.layout["page_bytes"]), dtype=np.uint8)
    pv, dv = kv_view(pre, ppool), kv_view(dec, dpool)
    for i, page in enumerate(src):
        pv[:, page, :] = content[:, i, :]
    rx = kvferry.KVReceiver(dec, room)
    rx.init(dst, aux_index=3)
    tx = kvferry.KVSender(pre, room)
    assert wait_until(lambda: tx.poll() == kvferry.KVPoll.WaitingForInput)
    tx.init(3, aux_index=0)
    with pytest.raises(ValueError, match=r"layers \(3, 5\) is not a range"):
        tx.send(src, layers=(3, 5))
    with pytest.raises(ValueError, match=r"layers \(2, 2\) is not a range"):
        tx.send(src, layers=(2, 2))
    # Layer 0 of pages 0-1, then of page 2; then layers 1-2 together; layer 3 last (inferred).
    tx.send(src[:2], layers=(0, 1))
    with pytest.raises(ValueError, match=r"layers 0 and 1 of the range \[0, 2\) stand at pages 2 and 0"):
        tx.send(src[2:], layers=(0, 2))
    tx.send(src[2:], layers=(0, 1))
    tx.send(src, layers=(1, 3))
    layers = GEO["num_layers"]
    # Layers 0-2 (buffers l and 4 + l) land before the last call; layer 3 is still empty.
    assert wait_until(lambda: all(np.array_equal(dv[b][dst], content[b]) for l in range(3) for b in (l, layers + l)))
    assert not dv[3][dst].any() and not dv[layers + 3][dst].any()
    assert rx.poll() != kvferry.KVPoll.Success
    tx.send(src, layers=(3, 4))  # every layer complete: inferred last
    assert wait_until(lambda: rx.poll() == kvferry.KVPoll.Success and tx.poll() == kvferry.KVPoll.Success)
    for i, page in enumerate(dst):
        assert np.array_equal(dv[:, page, :], content[:, i, :])
    assert rx.aux(3)["room"] == room
    with pytest.raises(ValueError, match="after the last chunk"):
        tx.send(src, layers=(0, 1))
    assert wait_until(lambda: tx.release_safe() and rx.release_safe())
    tx.close()
    rx.close()


def test_completed_sends_come_back_once_after_their_writes():
    """KVSender.take_completed_sends(): a send's number comes back only once its writes ended (held
    in flight by the fault decorator here, so the window is certain), each number once."""
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    ppool, dpool = pool(), pool()
    pre = kvferry.KVManager("prefill", ppool, bootstrap_addr=addr, aux_slots=AUX, fault_injection=True, **GEO)
    dec = kvferry.KVManager("decode", dpool, bootstrap_addr=addr, aux_slots=AUX, **GEO)
    room = 77
    rx = kvferry.KVReceiver(dec, room)
    rx.init([3, 4, 5], aux_index=1)
    tx = kvferry.KVSender(pre, room)
    assert wait_until(lambda: tx.poll() == kvferry.KVPoll.WaitingForInput)
    tx.init(3, aux_index=0)
    pre.hold_writes(room)
    tx.send([0, 1], last=False)   # send 0: held
    tx.send([2], last=False)      # send 1: held
    tx.send([], last=True)        # send 2: the last, no pages: ends at once
    assert wait_until(lambda: pre.held_writes(room) > 0)
    assert tx.take_completed_sends() == [2], "sends 0 and 1 are held"
    pre.release_held_writes(room)
    done = []
    assert wait_until(lambda: done.extend(tx.take_completed_sends()) or sorted(done) == [0, 1])
    assert wait_until(lambda: tx.poll() == kvferry.KVPoll.Success)
    assert sorted(done) == [0, 1]
    assert tx.take_completed_sends() == []
    tx.close()
    rx.close()
