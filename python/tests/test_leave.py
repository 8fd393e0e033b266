"""Joining and leaving while serving (KVManager.leave()/drained(), ``Manager::leave``): a prefill
rank that leaves with a room in flight finishes it byte-exact, opens no new room, and its bootstrap
entry goes once no room is live; a decode rank that leaves opens no new room; both are drained once their rooms are
closed."""
import numpy as np
import pytest

import kvferry
from kv_test_util import make_manager, make_pool, pages_view, wait_until


def test_leave_refuses_new_rooms_and_drains():
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    pool_p, pool_d = make_pool(), make_pool()
    prefill = make_manager("prefill", pool_p, addr, "shm")
    decode = make_manager("decode", pool_d, addr, "shm")
    try:
        assert server.registered() == 1
        room = 0x1EAF5
        rx = kvferry.KVReceiver(decode, room)
        tx = kvferry.KVSender(prefill, room)
        rx.init(np.array([7, 8], dtype=np.int64), aux_index=1)
        assert wait_until(lambda: tx.poll() == kvferry.KVPoll.WaitingForInput)

        prefill.leave()
        assert server.registered() == 1  # a room is live: the entry stays until it ends
        assert not prefill.drained()
        with pytest.raises(ValueError, match="leaving"):
            kvferry.KVSender(prefill, room + 1)

        pages_view(prefill, pool_p)[:, [3, 4], :] = 0x5A
        tx.init(2, aux_index=2)
        tx.send(np.array([3, 4], dtype=np.int64))
        assert wait_until(lambda: rx.poll() == kvferry.KVPoll.Success and tx.poll() == kvferry.KVPoll.Success)
        assert (pages_view(decode, pool_d)[:, [7, 8], :] == 0x5A).all()

        decode.leave()
        with pytest.raises(ValueError, match="leaving"):
            kvferry.KVReceiver(decode, room + 2)
        tx.close()
        rx.close()
        assert wait_until(prefill.drained)
        assert server.registered() == 0
        assert wait_until(decode.drained)
    finally:
        decode.close()
        prefill.close()
