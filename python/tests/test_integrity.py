"""KVManager(integrity=True): a prefill and a decode manager in this process; a verified room
succeeds, and a byte flipped in flight (KVManager.corrupt_next_write, the transport reports
success) fails the room with code "integrity_error", origin the decode rank, on both sides."""
import numpy as np
import pytest

import kvferry
from kv_test_util import error_fields, wait_until, kv_view, tiny_pool

GEO = dict(num_layers=4, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-integrity")
POOL_PAGES = 16
AUX = 8


def pool():
    return tiny_pool(GEO, POOL_PAGES, AUX)


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_verified_room_succeeds_and_a_flipped_byte_fails_it(transport):
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    ppool, dpool = pool(), pool()
    pre = kvferry.KVManager("prefill", ppool, bootstrap_addr=addr, transport=transport, aux_slots=AUX,
                            fault_injection=True, integrity=True, **GEO)
    dec = kvferry.KVManager("decode", dpool, bootstrap_addr=addr, transport=transport, aux_slots=AUX,
                            integrity=True, **GEO)
    pv, dv = kv_view(pre, ppool), kv_view(dec, dpool)
    src = [2, 0, 5]
    pv[:, src, :] = np.random.default_rng(7).integers(0, 256, size=(8, 3, pre.layout["page_bytes"]), dtype=np.uint8)

    def room(room_id, dst, aux, corrupt):
        rx = kvferry.KVReceiver(dec, room_id)
        rx.init(dst, aux_index=aux)
        tx = kvferry.KVSender(pre, room_id)
        assert wait_until(lambda: tx.poll() == kvferry.KVPoll.WaitingForInput)
        tx.init(3, aux_index=0)
        if corrupt:
            pre.corrupt_next_write(room_id)
        tx.send(src[:1])
        tx.send(src[1:])
        terminal = (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)
        assert wait_until(lambda: rx.poll() in terminal and tx.poll() in terminal)
        return rx, tx

    rx, tx = room(101, [7, 9, 1], 3, corrupt=False)
    assert rx.poll() == kvferry.KVPoll.Success and tx.poll() == kvferry.KVPoll.Success
    assert np.array_equal(dv[:, [7, 9, 1], :], pv[:, src, :])

    rx, tx = room(102, [10, 11, 12], 4, corrupt=True)
    assert rx.poll() == kvferry.KVPoll.Failed
    assert wait_until(lambda: tx.poll() == kvferry.KVPoll.Failed)
    d, p = error_fields(rx), error_fields(tx)
    assert d["code"] == "integrity_error" and d["origin"] == "decode/tp0" and not d["is_from_another_rank"]
    assert "do not match its digest" in d["failure_reason"]
    assert p["code"] == "integrity_error" and p["origin"] == "decode/tp0" and p["is_from_another_rank"]
    assert int((dv[:, [10, 11, 12], :] != pv[:, src, :]).sum()) == 1  # the one flipped byte
    assert wait_until(lambda: rx.release_safe() and tx.release_safe())
    for h in (rx, tx):
        h.close()
    pre.close()
    dec.close()


def test_corrupt_next_write_needs_fault_injection():
    server = kvferry.BootstrapServer()
    mgr = kvferry.KVManager("prefill", pool(), bootstrap_addr=f"127.0.0.1:{server.port}", aux_slots=AUX,
                            integrity=True, **GEO)
    with pytest.raises(ValueError, match="fault injection is off"):
        mgr.corrupt_next_write(5)
    mgr.close()
