"""A 1+1 transfer between two Python processes (this one decode, prefill_peer.py prefill), over a
bootstrap service, ZeroMQ and UCX: bytes, injected and aborted failures with their
KVTransferError fields on both sides, and kvferry's log levels as seen through `logging`."""
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

import kvferry
from kv_test_util import (PAGES, ROOM_ABORT, ROOM_FAULT, ROOM_OK, ListHandler, error_fields, make_manager, make_pool,
                          pages_view, room_content, room_records, wait_for_records, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def kv_records():
    handler = ListHandler()
    logger = logging.getLogger("kvferry")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield handler.records
    logger.removeHandler(handler)
    logger.setLevel(old)


# shards: this decode rank's transfer worker shards (the prefill peer has 1: mixed counts).
@pytest.mark.parametrize("transport,shards", [("shm", 1), ("tcp", 1), ("shm", 2), ("tcp", 2)])
def test_two_process_transfer_and_failures(transport, shards, kv_records):
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    peer = subprocess.Popen([sys.executable, os.path.join(HERE, "prefill_peer.py"), addr, transport],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])})
    try:
        pool = make_pool()
        mgr = make_manager("decode", pool, addr, transport, transfer_shards=shards)
        assert mgr.rank == "decode/tp0"
        assert mgr.peers() == 1

        bad = kvferry.KVReceiver(mgr, 1004)
        with pytest.raises(ValueError, match=r"kv_indices\[1\] = 999 is out of range: the pool has 32 pages"):
            bad.init([0, 999], aux_index=0)
        with pytest.raises(ValueError, match="aux_index 8 is out of range"):
            bad.init([0, 1], aux_index=8)
        with pytest.raises(ValueError, match="appears twice"):
            bad.init([2, 2], aux_index=0)
        assert bad.poll() == kvferry.KVPoll.Bootstrapping  # nothing was sent
        bad.close()

        dest = {ROOM_OK: [20, 21, 5, 6, 30], ROOM_FAULT: [10, 11, 12], ROOM_ABORT: [14, 15]}
        aux = {ROOM_OK: 3, ROOM_FAULT: 4, ROOM_ABORT: 5}
        receivers = {room: kvferry.KVReceiver(mgr, room) for room in PAGES}
        for room, r in receivers.items():
            r.init(np.array(dest[room], dtype=np.int64), aux_index=aux[room])
            assert r.poll() == kvferry.KVPoll.WaitingForInput
        receivers[ROOM_ABORT].abort("client went away")

        terminal = (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)
        assert wait_until(lambda: all(r.poll() in terminal for r in receivers.values()))
        states = {room: r.poll() for room, r in receivers.items()}
        assert states == {ROOM_OK: kvferry.KVPoll.Success, ROOM_FAULT: kvferry.KVPoll.Failed,
                          ROOM_ABORT: kvferry.KVPoll.Failed}

        # Every byte of ROOM_OK at its destination pages; the aux record written last.
        got = pages_view(mgr, pool)[:, dest[ROOM_OK], :]
        assert np.array_equal(got, room_content(mgr, ROOM_OK))
        assert receivers[ROOM_OK].aux(aux[ROOM_OK]) == {"room": ROOM_OK, "cached_tokens": 20, "num_pages": 5}
        assert receivers[ROOM_OK].failure_exception() is None
        # The failed room's pages were never written.
        assert not pages_view(mgr, pool)[:, dest[ROOM_FAULT], :].any()

        fault = error_fields(receivers[ROOM_FAULT])
        assert fault["code"] == "transfer_error"
        assert fault["origin"] == "prefill/tp0"
        assert fault["is_from_another_rank"] is True
        assert fault["bootstrap_room"] == ROOM_FAULT
        assert "injected write failure" in fault["failure_reason"]
        assert fault["str"].startswith(f"room {ROOM_FAULT}: transfer_error at prefill/tp0 (from another rank): ")
        aborted = error_fields(receivers[ROOM_ABORT])
        assert (aborted["code"], aborted["origin"], aborted["is_from_another_rank"]) == ("aborted", "decode/tp0", False)
        assert aborted["failure_reason"] == "client went away"

        # Decode's log: the propagated failure only at debug, its own abort once at info.
        assert wait_for_records(kv_records, lambda recs: room_records(recs, ROOM_FAULT) and
                                room_records(recs, ROOM_ABORT, above_debug=True))
        assert room_records(kv_records, ROOM_FAULT, above_debug=True) == []
        fault_lines = [r for r in room_records(kv_records, ROOM_FAULT) if r["name"] == "kvferry.decode.connector"]
        assert [(r["level"], r["code"], r["origin"]) for r in fault_lines] == [("DEBUG", "transfer_error", "prefill/tp0")]
        abort_lines = room_records(kv_records, ROOM_ABORT, above_debug=True)
        assert [(r["name"], r["level"], r["code"]) for r in abort_lines] == [("kvferry.decode.connector", "INFO", "aborted")]

        out, err = peer.communicate(timeout=60)
        assert peer.returncode == 0, err
        seen = json.loads(out)
        for r in receivers.values():
            r.close()
        assert wait_until(lambda: mgr.live_rooms() == 0)
        mgr.close()
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait()

    # Prefill's view, from the other process.
    assert seen["rank"] == "prefill/tp0"
    assert seen["ready"] and seen["released"]
    assert "out of range" in seen["bad_send_error"]
    assert seen["states"] == {str(ROOM_OK): "Success", str(ROOM_FAULT): "Failed", str(ROOM_ABORT): "Failed"}
    assert seen["errors"][str(ROOM_OK)] is None
    f = seen["errors"][str(ROOM_FAULT)]
    assert (f["code"], f["origin"], f["is_from_another_rank"]) == ("transfer_error", "prefill/tp0", False)
    a = seen["errors"][str(ROOM_ABORT)]
    assert (a["code"], a["origin"], a["is_from_another_rank"]) == ("aborted", "decode/tp0", True)
    assert a["failure_reason"] == "client went away"
    # Prefill's log: its own transfer error once at warning, the propagated abort only at debug.
    recs = seen["records"]
    above = room_records(recs, ROOM_FAULT, above_debug=True)
    assert [(r["name"], r["level"], r["code"], r["origin"]) for r in above] == [
        ("kvferry.prefill.connector", "WARNING", "transfer_error", "prefill/tp0")]
    assert room_records(recs, ROOM_ABORT, above_debug=True) == []
    assert any(r["level"] == "DEBUG" and r["name"] == "kvferry.prefill.connector" for r in room_records(recs, ROOM_ABORT))


def test_kvpoll_and_error_shape():
    assert [(p.name, int(p)) for p in kvferry.KVPoll] == [
        ("Failed", 0), ("Bootstrapping", 1), ("WaitingForInput", 2), ("Transferring", 3), ("Success", 4)]
    e = kvferry.KVTransferError(7, "peer went away", True, "decode/tp1", "peer_unreachable")
    assert isinstance(e, Exception)
    assert (e.bootstrap_room, e.failure_reason, e.is_from_another_rank, e.origin, e.code) == (
        7, "peer went away", True, "decode/tp1", "peer_unreachable")
    assert str(e) == "room 7: peer_unreachable at decode/tp1 (from another rank): peer went away"


def test_pool_must_be_writable_and_large_enough():
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    with pytest.raises(BufferError):
        make_manager("prefill", bytes(1 << 16), addr, "tcp")  # read-only
    with pytest.raises(ValueError, match="role must be"):
        make_manager("router", make_pool(), addr, "tcp")
    with pytest.raises(ValueError, match="KV pool of 100 bytes"):
        make_manager("prefill", np.zeros(100, dtype=np.uint8), addr, "tcp")
    with pytest.raises(ValueError, match=r"transfer_shards must be in 1\.\.8"):
        make_manager("prefill", make_pool(), addr, "tcp", transfer_shards=9)
    pool = make_pool()
    mgr = make_manager("prefill", pool, addr, "tcp")
    sender = kvferry.KVSender(mgr, 9)
    with pytest.raises(ValueError, match="a KVReceiver needs a decode manager"):
        kvferry.KVReceiver(mgr, 10)
    with pytest.raises(ValueError, match="room 9 is already open"):
        kvferry.KVSender(mgr, 9)
    with pytest.raises(ValueError, match="send\\(\\) before init") as refused:
        sender.send([0])
    assert refused.value.code == "invalid_argument"  # the C++ error's code, never parsed from the text
    mgr.close()
    with pytest.raises(RuntimeError, match="the manager is closed"):
        sender.poll()
    sender.close()  # after the manager: nothing to release, no error
    pool.resize(10, refcheck=False)  # the pool is no longer held by the manager


EXIT_SCRIPT = """
import logging, sys
import kvferry
from kv_test_util import make_manager, make_pool
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
server = kvferry.BootstrapServer()
pool = memoryview(bytearray(len(make_pool())))  # any writable buffer will do
mgr = make_manager("prefill", pool, f"127.0.0.1:{server.port}", "shm")
sender = kvferry.KVSender(mgr, 5)
sender.init(2)
sender.abort("engine shutting down")
assert sender.poll() == kvferry.KVPoll.Failed
print("leaving with a live manager")
"""


def test_interpreter_exit_with_a_live_manager_and_room():
    """No close(): atexit stops the log thread, then the rank is torn down; nothing hangs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=30, env=env,
                       cwd=HERE)
    assert p.returncode == 0, p.stderr
    assert p.stdout == "leaving with a live manager\n"
    assert "INFO:kvferry.prefill.connector:room 5 failed: aborted at prefill/tp0: engine shutting down" in p.stderr
