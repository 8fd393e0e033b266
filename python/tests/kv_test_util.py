"""Shared by the pytest tests and the prefill peer process: geometry, rooms, page content."""
import json
import logging
import time

import numpy as np

import kvferry

GEOMETRY = dict(num_layers=2, num_kv_heads=2, head_dim=16, dtype_bytes=2, page_size=4, model_name="tiny-test")
NUM_PAGES = 32
AUX_SLOTS = 8
# Fast failure detection is not under test here; generous heartbeats keep a loaded machine quiet.
DEADLINES = {"heartbeat_timeout_ms": 5000, "lookup_timeout_ms": 20000}

ROOM_OK = 1001     # 5 pages, sent in two chunks, must arrive byte-exact
ROOM_FAULT = 1002  # prefill's transport fails its writes: origin prefill/tp0, transfer_error
ROOM_ABORT = 1003  # decode aborts it: origin decode/tp0, aborted
PAGES = {ROOM_OK: 5, ROOM_FAULT: 3, ROOM_ABORT: 2}


def make_pool():
    n = kvferry.pool_nbytes(NUM_PAGES, aux_slots=AUX_SLOTS, **{k: v for k, v in GEOMETRY.items() if k != "model_name"})
    return np.zeros(n, dtype=np.uint8)


def make_manager(role, pool, bootstrap_addr, transport, transfer_shards=1):
    return kvferry.KVManager(role, pool, bootstrap_addr=bootstrap_addr, transport=transport, aux_slots=AUX_SLOTS,
                             deadlines=DEADLINES, transfer_shards=transfer_shards, fault_injection=True,
                             **GEOMETRY)


def room_content(mgr, room):
    """What the room's pages hold: [buffer, page of the room, byte of the page]."""
    l = mgr.layout
    rng = np.random.default_rng(room)
    return rng.integers(0, 256, size=(l["num_buffers"], PAGES[room], l["page_bytes"]), dtype=np.uint8)


def pages_view(mgr, pool):
    """The pool's KV part as [buffer, page, byte]."""
    l = mgr.layout
    kv = pool[: l["num_buffers"] * l["buffer_bytes"]]
    return kv.reshape(l["num_buffers"], l["num_pages"], l["page_bytes"])


def wait_until(pred, timeout=15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.005)
    return pred()


def error_fields(room_obj):
    try:
        room_obj.failure_exception()
    except kvferry.KVTransferError as e:
        return {"bootstrap_room": e.bootstrap_room, "code": e.code, "origin": e.origin,
                "is_from_another_rank": e.is_from_another_rank, "failure_reason": e.failure_reason,
                "str": str(e)}
    return None


class ListHandler(logging.Handler):
    """Keeps kvferry's records as plain dicts (JSON-able, for the peer process)."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append({"name": record.name, "level": record.levelname, "msg": record.getMessage(),
                             "room": getattr(record, "room", None), "code": getattr(record, "code", None),
                             "origin": getattr(record, "origin", None)})


def room_records(records, room, above_debug=False):
    return [r for r in records if r["room"] == room and (not above_debug or r["level"] not in ("DEBUG", "TRACE"))]


def wait_for_records(records, pred, timeout=5.0):
    return wait_until(lambda: (kvferry.flush_logs(), pred(records))[1], timeout)


def dump(obj):
    return json.dumps(obj, sort_keys=True)


def tiny_pool(geo, pages, aux):
    """A zeroed numpy pool for `pages` pages of geometry `geo` (KVManager's keyword arguments) with
    `aux` aux slots."""
    return np.zeros(kvferry.pool_nbytes(pages, aux_slots=aux, **{k: v for k, v in geo.items() if k != "model_name"}),
                    dtype=np.uint8)


def kv_view(mgr, p):
    """The KV part of pool `p` of manager `mgr` as [buffer, page, page bytes]."""
    l = mgr.layout
    return p[: l["num_buffers"] * l["buffer_bytes"]].reshape(l["num_buffers"], l["num_pages"], l["page_bytes"])
