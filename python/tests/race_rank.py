"""One rank of test_simultaneous_failures.py as its own Python process: a TP-2 prefill engine and
a TP-1 decode engine (the toy model's 2 KV heads: each prefill rank sources one head of the one
decode rank, so decode/tp0 hears from both prefill ranks about every room).

argv: role (prefill|decode), tp_rank, bootstrap address, transport, log file, rooms (JSON list).

Every room has local failures on two ranks, set off by a "go" command per kind that the test
writes to the ranks' stdin back to back:
  kind "two_prefill": both prefill ranks' transports fail the room's writes, while decode/tp0 is
                      stopped (both ranks observe a local transfer_error, neither hears of the
                      other's first);
  kind "decode_vs_prefill": prefill/tp1's transport fails the room's writes while decode/tp0 aborts
                      the room (a local abort on decode racing a local transfer_error on prefill).
                      prefill/tp0 sends too, without a fault: if every one of its writes lands
                      before the failure reaches it, its room is at Success, a terminal state it
                      keeps (the engine has freed the room's KV by then); otherwise Failed with
                      the one origin. Which one is timing (seen: Success once in a CI run).
Each rank prints {"event": "ready"} once every room is waiting for input (prefill) or its metadata
was sent (decode), then per kind reads {"go": KIND}, lets the failures happen and prints
{"event": "local"} (prefill: once its rooms of that kind failed); then a final
{"event": "done", "errors": {room: KVTransferError fields}} once every room is release-safe and
released; its log file (JSON lines) holds its failure lines.
"""
import json
import sys

import numpy as np

import kvferry
from kv_test_util import error_fields, wait_until

GEOMETRY = dict(num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-race")
NUM_PAGES = 64
PAGES = 2
DEADLINES = {"heartbeat_timeout_ms": 5000, "lookup_timeout_ms": 20000, "drain_timeout_ms": 60000}
TIMEOUT = 60


def emit(**fields):
    print(json.dumps(fields), flush=True)


def settled(h, may_succeed):
    st = h.poll()
    return st == kvferry.KVPoll.Failed or (may_succeed and st == kvferry.KVPoll.Success)


def phase(role, tp_rank, rooms, handles, kind):
    if json.loads(sys.stdin.readline()).get("go") != kind:
        raise SystemExit(f"expected go {kind}")
    mine = []
    for i, (room, k) in enumerate(rooms):
        if k != kind:
            continue
        h = handles[room]
        if role == "prefill":
            h.send([2 * i, 2 * i + 1])
            mine.append(h)
        elif kind == "decode_vs_prefill":
            h.abort("aborted by the decode engine")
    # The ranks that fail on their own must reach Failed; prefill/tp0 in a "decode_vs_prefill" room
    # has no failure of its own and only has to settle (Failed, or Success if its writes won).
    may_succeed = role == "prefill" and kind == "decode_vs_prefill" and tp_rank == 0
    local = wait_until(lambda: all(settled(h, may_succeed) for h in mine), TIMEOUT)
    # The state of each of this kind's rooms (KVPoll names), for the test's message if one is not Failed.
    states = {str(room): kvferry.KVPoll(handles[room].poll()).name for room, k in rooms if k == kind}
    emit(event="local", kind=kind, failed=local, states=states)


def main():
    role, tp_rank, addr, transport, log_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    rooms = json.loads(sys.argv[6])  # [[room, kind], ...]
    tp_size = 2 if role == "prefill" else 1
    n = kvferry.pool_nbytes(NUM_PAGES, aux_slots=8, **{k: v for k, v in GEOMETRY.items() if k != "model_name"},
                            tp_rank=tp_rank, tp_size=tp_size)
    pool = np.zeros(n, dtype=np.uint8)
    mgr = kvferry.KVManager(role, pool, bootstrap_addr=addr, transport=transport, aux_slots=8, deadlines=DEADLINES,
                            tp_rank=tp_rank, tp_size=tp_size, peer_tp_size=3 - tp_size, log_file=log_file,
                            fault_injection=True, **GEOMETRY)
    handles = {}
    if role == "prefill":
        for i, (room, kind) in enumerate(rooms):
            if kind == "two_prefill" or tp_rank == 1:
                mgr.inject_write_failure(room, "transfer_error", f"injected write failure on prefill/tp{tp_rank}")
            handles[room] = kvferry.KVSender(mgr, room)
            handles[room].init(PAGES, aux_index=i % 8)
        ready = wait_until(lambda: all(h.poll() == kvferry.KVPoll.WaitingForInput for h in handles.values()), TIMEOUT)
    else:
        for i, (room, _) in enumerate(rooms):
            handles[room] = kvferry.KVReceiver(mgr, room)
            handles[room].init([2 * i, 2 * i + 1], aux_index=i % 8)
        ready = True
    emit(event="ready", ready=ready)
    # Phase 1, "two_prefill" rooms: the test stops decode/tp0 (SIGSTOP) before "go" and continues
    # it only after both prefill ranks said "local", so neither prefill rank can hear of the other's
    # failure (decode/tp0 is the only path between them) before failing on its own.
    phase(role, tp_rank, rooms, handles, "two_prefill")
    # Phase 2, "decode_vs_prefill" rooms: prefill/tp1's failing writes race decode/tp0's abort.
    phase(role, tp_rank, rooms, handles, "decode_vs_prefill")
    may = {room: role == "prefill" and tp_rank == 0 and k == "decode_vs_prefill" for room, k in rooms}
    failed = wait_until(lambda: all(settled(handles[room], may[room]) for room in handles), TIMEOUT)
    safe = wait_until(lambda: all(h.release_safe() for h in handles.values()), TIMEOUT)
    errors = {str(room): error_fields(h) for room, h in handles.items()}  # None: the room is at Success
    for h in handles.values():
        h.close()
    released = wait_until(lambda: mgr.live_rooms() == 0, TIMEOUT)
    rank = mgr.rank
    mgr.close()
    emit(event="done", rank=rank, failed=failed, release_safe=safe, released=released, errors=errors)


if __name__ == "__main__":
    main()
