#!/usr/bin/python3
"""One-page rooms through kvferry's SGLang backend (kvferry.sglang), one at a time (issue 30 item 4).

    PYTHONPATH=build/python /usr/bin/python3 bench/sglang_room_latency.py [--rooms N] [--transport tcp|shm] [--json OUT]

A prefill and a decode KVManager in this process behind one KVBootstrapServer, built as SGLang
builds them (SGLang's stand-in types from python/tests/fake_sglang: ServerArgs, DisaggregationMode),
host memory. Per room, in SGLang's order (docs/sglang.md "Calls"): KVSender and KVReceiver created,
receiver init(0); then, timed: decode's send_metadata(one page), prefill's poll() until
WaitingForInput, init(1, aux_index), send(the page, state_indices=[] : the last chunk), decode's
poll() until Success. Both sides poll in a loop, as SGLang's event loops do between steps (its
decode loop polls each step; at concurrency 1 it spins). Reported: p50 / p90 / p99 / max in us of
that span and of its stages (meta: send_metadata until prefill's WaitingForInput; land: the send's
return until decode's Success); the C++ API's figure for the same room is
build/bench/kvferry_micro_room_latency.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests", "fake_sglang"))

from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402  (the stand-in)
from sglang.srt.server_args import ServerArgs  # noqa: E402

import kvferry.sglang as ks  # noqa: E402

PAGE, PAGES, HEADS, HEAD_BYTES, LAYERS, AUX_ROWS = 16, 64, 2, 128, 2, 64


def kv_args(keep, decode):
    a = ks.KVArgs()
    kv = [np.zeros((PAGES, PAGE * HEADS * HEAD_BYTES), np.uint8) for _ in range(2 * LAYERS)]
    aux = [np.zeros((AUX_ROWS, 64), np.uint8)]
    keep.extend(kv + aux)
    a.engine_rank, a.pp_rank, a.system_dp_rank, a.page_size = 0, 0, 0, PAGE
    a.kv_data_ptrs = [x.ctypes.data for x in kv]
    a.kv_data_lens = [x.nbytes for x in kv]
    a.kv_item_lens = [x.nbytes // PAGES for x in kv]
    a.aux_data_ptrs = [x.ctypes.data for x in aux]
    a.aux_data_lens = [x.nbytes for x in aux]
    a.aux_item_lens = [x.nbytes // AUX_ROWS for x in aux]
    a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
    a.kv_cache_dtype_str = "auto"
    if not decode:
        a.kv_head_num, a.total_kv_head_num = HEADS, HEADS
    return a


def spin(pred, what, timeout_s=10.0):
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise SystemExit(f"sglang_room_latency: no {what} within {timeout_s} s")


def pct(v, q):
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rooms", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--transport", default="tcp", choices=["tcp", "shm"])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    os.environ.update({"KVFERRY_KV_MEMORY": "host", "KVFERRY_STATE_MEMORY": "host", "KVFERRY_TRANSPORT": a.transport,
                       "KVFERRY_TOTAL_KV_HEADS": str(HEADS), "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"})
    keep = []
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    sargs = ServerArgs(disaggregation_bootstrap_port=server.port, disaggregation_transfer_backend="kvferry")
    p = ks.KVManager(kv_args(keep, False), DisaggregationMode.PREFILL, sargs, False)
    d = ks.KVManager(kv_args(keep, True), DisaggregationMode.DECODE, sargs, False)
    addr = f"127.0.0.1:{server.port}"
    spin(lambda: d.try_ensure_parallel_info(addr), "prefill instance at the bootstrap")
    total, meta, land = [], [], []
    try:
        for i in range(a.warmup + a.rooms):
            room = 1000 + i
            s = ks.KVSender(p, addr, room, [0], 0)
            r = ks.KVReceiver(d, addr, room)
            r.init(0)
            page = np.array([i % PAGES], np.int32)
            t0 = time.perf_counter()
            r.send_metadata(page, i % AUX_ROWS, [])
            spin(lambda: s.poll() == ks.KVPoll.WaitingForInput, f"WaitingForInput for room {room}")
            t1 = time.perf_counter()
            s.init(1, i % AUX_ROWS)
            s.send(np.array([(i + 7) % PAGES], np.int32), [])
            t2 = time.perf_counter()
            spin(lambda: r.poll() in (ks.KVPoll.Success, ks.KVPoll.Failed), f"an end of room {room}")
            t3 = time.perf_counter()
            if r.poll() != ks.KVPoll.Success:
                raise SystemExit(f"sglang_room_latency: room {room} failed: {r.failure_exception()}")
            spin(lambda: s.poll() == ks.KVPoll.Success, f"prefill's Success for room {room}")
            s.clear()
            r.clear()
            if i >= a.warmup:
                total.append((t3 - t0) * 1e6)
                meta.append((t1 - t0) * 1e6)
                land.append((t3 - t2) * 1e6)
    finally:
        p.close()
        d.close()
    out = {"transport": a.transport, "rooms": a.rooms, "p50_us": pct(total, 0.5), "p90_us": pct(total, 0.9),
           "p99_us": pct(total, 0.99), "max_us": max(total), "meta_p50_us": pct(meta, 0.5),
           "land_p50_us": pct(land, 0.5)}
    print(f"sglang adapter, 1-page room, {a.transport}, {a.rooms} rooms: p50 {out['p50_us']:.0f} p90 "
          f"{out['p90_us']:.0f} p99 {out['p99_us']:.0f} max {out['max_us']:.0f} us (meta p50 "
          f"{out['meta_p50_us']:.0f}, land p50 {out['land_p50_us']:.0f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
