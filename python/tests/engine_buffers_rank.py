"""One rank of test_two_by_two_buffers.py as its own Python process, over engine-owned numpy
buffers (kvferry.describe_buffers): 16 KV buffers (8 layers of K and V), 3 aux buffers, 1 state
buffer per rank, TP 2 on both engines.

argv: role (prefill|decode), tp_rank, bootstrap address, transport. The test drives the ranks
through stdin (one JSON command a line) and reads their events on stdout (one JSON object a line):

ROOM_OK    prefill sends 2 pages, 3 pages (last=False), then an empty last chunk carrying the state
           row; decode checks every byte of its KV buffers, aux buffers and state buffer.
ROOM_FAULT prefill/tp1's transport fails its writes (the origin); prefill/tp0 holds its writes in
           flight. The test hands prefill/tp1's KVTransferError to prefill/tp0 (fail_from_engine,
           as the prefill engine's agreement would), which tells decode/tp0; decode/tp1 hears it
           from prefill/tp1. decode/tp0 reports release_safe() while prefill/tp0's write is held
           (False: Failed does not imply release-safe); the test then releases the write and
           decode/tp0 waits until release_safe() is True.

Events: {"event": "failed", ...} (prefill/tp1, decode/tp0), {"event": "held"} (prefill/tp0), and
a final {"event": "done", ...} with states, KVTransferError fields and the byte checks.
Commands (prefill/tp0): {"fail_from_engine": {...}}, {"release": true}; (decode/tp0): {"go": true}.
"""
import json
import sys

import numpy as np

import kvferry
from kv_test_util import error_fields, wait_until

TP = 2
GEOMETRY = dict(num_layers=8, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-buffers")
PAGE_BYTES = 4 * 1 * 16 * 2  # page_size tokens x this rank's 1 head x head_dim x dtype_bytes
NUM_PAGES = 24
AUX_ROWS = 8
AUX_ITEMS = [(2, np.int32), (16, np.float32), (3, np.uint8)]  # e.g. first token + cached count; logprobs; flags
STATE_ROWS = 4
STATE_ITEM = 96
DEADLINES = {"heartbeat_timeout_ms": 5000, "lookup_timeout_ms": 20000, "drain_timeout_ms": 120000}

ROOM_OK = 3001
ROOM_FAULT = 3002
FAULT_RANK = 1   # prefill/tp1's writes of ROOM_FAULT fail
HOLD_RANK = 0    # prefill/tp0's writes of ROOM_FAULT are held in flight
PAGES = {ROOM_OK: 5, ROOM_FAULT: 3}
SRC = {ROOM_OK: [7, 3, 9, 0, 12], ROOM_FAULT: [1, 2, 4]}
DST = {ROOM_OK: [20, 21, 5, 6, 13], ROOM_FAULT: [10, 11, 12]}
SRC_AUX = {ROOM_OK: 5, ROOM_FAULT: 6}
DST_AUX = {ROOM_OK: 3, ROOM_FAULT: 4}
SRC_STATE = {ROOM_OK: [2], ROOM_FAULT: [3]}
DST_STATE = {ROOM_OK: [1], ROOM_FAULT: [0]}


def engine_arrays(seed=None):
    """One rank's buffers: zeros, or (seed) random bytes everywhere."""
    rng = np.random.default_rng(seed)

    def arr(rows, cols, dtype):
        a = np.zeros((rows, cols), dtype=dtype)
        if seed is not None:
            a.view(np.uint8)[...] = rng.integers(0, 256, size=a.view(np.uint8).shape, dtype=np.uint8)
        return a

    kv = [arr(NUM_PAGES, PAGE_BYTES // 2, np.float16) for _ in range(2 * GEOMETRY["num_layers"])]
    aux = [arr(AUX_ROWS, n, dt) for n, dt in AUX_ITEMS]
    state = [arr(STATE_ROWS, STATE_ITEM, np.uint8)]
    return kv, aux, state


def prefill_seed(tp_rank):
    return 100 + tp_rank


def emit(**fields):
    print(json.dumps(fields), flush=True)


def command():
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the test closed stdin")
    return json.loads(line)


def manager(role, tp_rank, addr, transport, arrays):
    buffers = kvferry.describe_buffers(*arrays)
    return kvferry.KVManager(role, buffers=buffers, bootstrap_addr=addr, transport=transport, deadlines=DEADLINES,
                             tp_rank=tp_rank, tp_size=TP, fault_injection=True, **GEOMETRY)


def terminal(room_obj):
    return room_obj.poll() in (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)


def prefill(tp_rank, addr, transport):
    arrays = engine_arrays(prefill_seed(tp_rank))
    mgr = manager("prefill", tp_rank, addr, transport, arrays)
    senders = {room: kvferry.KVSender(mgr, room) for room in PAGES}
    if tp_rank == FAULT_RANK:
        mgr.inject_write_failure(ROOM_FAULT, "transfer_error", "injected write failure")
    else:
        mgr.hold_writes(ROOM_FAULT)
    for room, s in senders.items():
        s.init(PAGES[room], aux_index=SRC_AUX[room])
    out = {"ready": wait_until(lambda: all(s.poll() == kvferry.KVPoll.WaitingForInput for s in senders.values()), 30)}
    ok = senders[ROOM_OK]
    ok.send(SRC[ROOM_OK][:2])                                # last inferred: False
    ok.send(SRC[ROOM_OK][2:], last=False)                    # every page, but not the last chunk
    ok.send([], state_indices=SRC_STATE[ROOM_OK])            # empty last chunk (inferred) with the state row
    fault = senders[ROOM_FAULT]
    fault.send(SRC[ROOM_FAULT][:1])
    fault.send(SRC[ROOM_FAULT][1:], state_indices=SRC_STATE[ROOM_FAULT])
    if tp_rank == FAULT_RANK:
        wait_until(lambda: fault.poll() == kvferry.KVPoll.Failed, 30)
        emit(event="failed", error=error_fields(fault))
    else:
        out["held_seen"] = wait_until(lambda: mgr.held_writes(ROOM_FAULT) > 0, 30)
        emit(event="held")
        e = command()["fail_from_engine"]
        fault.fail_from_engine(kvferry.KVTransferError(e["bootstrap_room"], e["failure_reason"], True, e["origin"],
                                                       e["code"]))
        out["failed_after_agreement"] = wait_until(lambda: fault.poll() == kvferry.KVPoll.Failed, 30)
        out["safe_while_held"] = fault.release_safe()
        command()  # {"release": true}
        mgr.release_held_writes(ROOM_FAULT)
    out["done"] = wait_until(lambda: all(terminal(s) for s in senders.values()), 30)
    out["release_safe"] = wait_until(lambda: all(s.release_safe() for s in senders.values()), 30)
    return mgr, senders, out


def check_bytes(got, want, dst, src):
    """Rows `dst` of every array in `got` equal rows `src` of `want`."""
    return all(np.array_equal(g.view(np.uint8)[dst], w.view(np.uint8)[src]) for g, w in zip(got, want))


def untouched(arrays, written_rows):
    """Every row of every array outside `written_rows` is still zero."""
    return all(not np.delete(a.view(np.uint8), written_rows, axis=0).any() for a in arrays)


def decode(tp_rank, addr, transport):
    arrays = engine_arrays()
    mgr = manager("decode", tp_rank, addr, transport, arrays)
    receivers = {room: kvferry.KVReceiver(mgr, room) for room in PAGES}
    for room, r in receivers.items():
        r.send_metadata(DST[room], DST_AUX[room], DST_STATE[room])
    ok, fault = receivers[ROOM_OK], receivers[ROOM_FAULT]
    out = {"ok_done": wait_until(lambda: terminal(ok), 30)}
    kv, aux, state = arrays
    want_kv, want_aux, want_state = engine_arrays(prefill_seed(tp_rank))
    out["kv_match"] = check_bytes(kv, want_kv, DST[ROOM_OK], SRC[ROOM_OK])
    out["aux_match"] = check_bytes(aux, want_aux, [DST_AUX[ROOM_OK]], [SRC_AUX[ROOM_OK]])
    out["state_match"] = check_bytes(state, want_state, DST_STATE[ROOM_OK], SRC_STATE[ROOM_OK])
    out["failed"] = wait_until(lambda: fault.poll() == kvferry.KVPoll.Failed, 30)
    if tp_rank == HOLD_RANK:
        emit(event="failed", release_safe=fault.release_safe(), quarantined=fault.quarantined(),
             error=error_fields(fault))
        command()  # {"go": true}: prefill/tp0's held write was released
    out["release_safe"] = wait_until(lambda: all(r.release_safe() for r in receivers.values()), 30)
    out["quarantined"] = fault.quarantined()
    # Once release-safe nothing more lands. The failed room's pages, aux and state rows: never
    # written (tp1, its writes failed) or by the released writes (tp0); every other row of every
    # buffer is still zero.
    out["others_untouched"] = (untouched(kv, DST[ROOM_OK] + DST[ROOM_FAULT]) and
                               untouched(aux, [DST_AUX[ROOM_OK], DST_AUX[ROOM_FAULT]]) and
                               untouched(state, DST_STATE[ROOM_OK] + DST_STATE[ROOM_FAULT]))
    out["fault_pages_untouched"] = not any(a.view(np.uint8)[DST[ROOM_FAULT]].any() for a in kv)
    return mgr, receivers, out


def main():
    role, tp_rank, addr, transport = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    mgr, rooms, out = (prefill if role == "prefill" else decode)(tp_rank, addr, transport)
    out["rank"] = mgr.rank
    out["states"] = {str(room): r.poll().name for room, r in rooms.items()}
    out["errors"] = {str(room): error_fields(r) for room, r in rooms.items()}
    for r in rooms.values():
        r.close()
    out["released"] = wait_until(lambda: mgr.live_rooms() == 0, 30)
    mgr.close()
    emit(event="done", **out)


if __name__ == "__main__":
    main()
