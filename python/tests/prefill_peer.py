"""The prefill rank of test_transfer.py, as its own Python process.

argv: bootstrap address, transport. Sends ROOM_OK (two chunks), has its transport fail every write
of ROOM_FAULT, leaves ROOM_ABORT to decode's abort; prints one JSON object with what it saw
(states, KVTransferError fields, kvferry's log records captured through `logging`) and exits 0.
"""
import json
import logging
import sys

import kvferry
from kv_test_util import (PAGES, ROOM_ABORT, ROOM_FAULT, ROOM_OK, ListHandler, error_fields, make_manager,
                          make_pool, pages_view, room_content, wait_for_records, wait_until)


def main():
    addr, transport = sys.argv[1], sys.argv[2]
    handler = ListHandler()
    logging.getLogger("kvferry").addHandler(handler)
    logging.getLogger("kvferry").setLevel(logging.DEBUG)
    pool = make_pool()
    mgr = make_manager("prefill", pool, addr, transport)
    out = {"rank": mgr.rank}
    senders = {room: kvferry.KVSender(mgr, room) for room in PAGES}
    mgr.inject_write_failure(ROOM_FAULT, "transfer_error", "injected write failure")
    for room, s in senders.items():
        s.init(PAGES[room])
    try:
        senders[ROOM_OK].send([10**6])
    except ValueError as e:
        out["bad_send_error"] = str(e)
    ready = lambda s: s.poll() in (kvferry.KVPoll.WaitingForInput, kvferry.KVPoll.Failed)
    out["ready"] = wait_until(lambda: all(ready(s) for s in senders.values()))

    # ROOM_OK: its pages sit at scattered local pages, sent in two chunks.
    local = [7, 3, 9, 0, 12]
    view = pages_view(mgr, pool)
    content = room_content(mgr, ROOM_OK)
    for i, p in enumerate(local):
        view[:, p, :] = content[:, i, :]
    senders[ROOM_OK].send(local[:3])
    senders[ROOM_OK].send(local[3:])
    if senders[ROOM_FAULT].poll() == kvferry.KVPoll.WaitingForInput:
        senders[ROOM_FAULT].send([1, 2, 4])

    terminal = (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)
    wait_until(lambda: all(s.poll() in terminal for s in senders.values()))
    out["states"] = {str(room): s.poll().name for room, s in senders.items()}
    out["errors"] = {str(room): error_fields(s) for room, s in senders.items()}
    # The failure lines are logged by the manager's thread once it sees the room Failed.
    wait_for_records(handler.records, lambda recs: any(r["room"] == ROOM_ABORT for r in recs) and
                     any(r["room"] == ROOM_FAULT and r["level"] != "DEBUG" for r in recs))
    for s in senders.values():
        s.close()
    out["released"] = wait_until(lambda: mgr.live_rooms() == 0, timeout=15)
    mgr.close()
    kvferry.flush_logs()
    out["records"] = handler.records
    print(json.dumps(out))


if __name__ == "__main__":
    main()
