"""One rank of test_two_by_two.py as its own Python process: a 2-rank prefill engine and a 2-rank
decode engine, each rank a process, as a serving engine runs them.

argv: role (prefill|decode), tp_rank, bootstrap address, transport. Prefill sends ROOM_OK in two
chunks from scattered local pages (its own head slice, content seeded by room and tp_rank) and
ROOM_FAULT, whose writes fail on prefill/tp1 only; decode offers destination pages and checks
every byte of its slice of ROOM_OK. Prints one JSON object: rank, states, KVTransferError fields,
whether the bytes matched, whether the failed room's pages stayed untouched; exits 0.
"""
import json
import sys

import numpy as np

import kvferry
from kv_test_util import AUX_SLOTS, DEADLINES, GEOMETRY, NUM_PAGES, error_fields, pages_view, wait_until

TP = 2
ROOM_OK = 2001     # 5 pages: every byte checked on both decode ranks
ROOM_FAULT = 2002  # 3 pages: prefill/tp1's transport fails its writes
PAGES = {ROOM_OK: 5, ROOM_FAULT: 3}
SRC = {ROOM_OK: [7, 3, 9, 0, 12], ROOM_FAULT: [1, 2, 4]}
DST = {ROOM_OK: [20, 21, 5, 6, 30], ROOM_FAULT: [10, 11, 12]}
AUX = {ROOM_OK: 3, ROOM_FAULT: 4}
FAULT_RANK = 1


def content(mgr, room, tp_rank):
    """This rank's head slice of the room: [buffer, page of the room, byte of the page]."""
    l = mgr.layout
    rng = np.random.default_rng(room * 100 + tp_rank)
    return rng.integers(0, 256, size=(l["num_buffers"], PAGES[room], l["page_bytes"]), dtype=np.uint8)


def manager(role, tp_rank, addr, transport):
    g = {k: v for k, v in GEOMETRY.items() if k != "model_name"}
    n = kvferry.pool_nbytes(NUM_PAGES, aux_slots=AUX_SLOTS, tp_rank=tp_rank, tp_size=TP, **g)
    pool = np.zeros(n, dtype=np.uint8)
    mgr = kvferry.KVManager(role, pool, bootstrap_addr=addr, transport=transport, aux_slots=AUX_SLOTS,
                            deadlines=DEADLINES, tp_rank=tp_rank, tp_size=TP, fault_injection=True, **GEOMETRY)
    return mgr, pool


def terminal(room_obj):
    return room_obj.poll() in (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)


def send_chunk(sender, pages):
    """A chunk; a room that failed meanwhile (its writes fail) refuses it, as it should."""
    try:
        sender.send(pages)
    except ValueError:
        if sender.poll() != kvferry.KVPoll.Failed:
            raise


def prefill(tp_rank, addr, transport):
    mgr, pool = manager("prefill", tp_rank, addr, transport)
    senders = {room: kvferry.KVSender(mgr, room) for room in PAGES}
    if tp_rank == FAULT_RANK:
        mgr.inject_write_failure(ROOM_FAULT, "transfer_error", "injected write failure")
    for room, s in senders.items():
        s.init(PAGES[room])
    ready = wait_until(lambda: all(s.poll() == kvferry.KVPoll.WaitingForInput for s in senders.values()), 30)
    view = pages_view(mgr, pool)
    for room, s in senders.items():
        view[:, SRC[room], :] = content(mgr, room, tp_rank)
        send_chunk(s, SRC[room][:2])
        send_chunk(s, SRC[room][2:])
    done = wait_until(lambda: all(terminal(s) for s in senders.values()), 30)
    return mgr, senders, {"ready": ready, "done": done}


def decode(tp_rank, addr, transport):
    mgr, pool = manager("decode", tp_rank, addr, transport)
    receivers = {room: kvferry.KVReceiver(mgr, room) for room in PAGES}
    for room, r in receivers.items():
        r.init(DST[room], aux_index=AUX[room])
    done = wait_until(lambda: all(terminal(r) for r in receivers.values()), 30)
    view = pages_view(mgr, pool)
    out = {"done": done,
           "bytes_match": bool(np.array_equal(view[:, DST[ROOM_OK], :], content(mgr, ROOM_OK, tp_rank))),
           "fault_pages_untouched": not view[:, DST[ROOM_FAULT], :].any(),
           "aux": receivers[ROOM_OK].aux(AUX[ROOM_OK])}
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
    print(json.dumps(out))


if __name__ == "__main__":
    main()
