"""Throughput of the Python module, 1+1 ranks in two processes (this one decode, a child prefill).

    PYTHONPATH=build/python /usr/bin/python3 python/bench/transfer_bench.py [--transport shm|tcp]
        [--room-mib 64] [--rooms 8]

Pools are numpy arrays registered as they are (no copy). Llama-3.1-8B geometry at TP 1 (32
layers, 8 KV heads of 128 bf16, 128 KiB per token), 64-token pages. Each room is sent in one
send() and checked byte-exact at decode; prints MB/s (10^6 B/s) from the first send to the last
Success, as seen by decode.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

import kvferry

GEO = dict(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2, page_size=64, model_name="Llama-3.1-8B")
SIZES = {k: v for k, v in GEO.items() if k != "model_name"}


def pages_view(mgr, pool):
    l = mgr.layout
    return pool[: l["num_buffers"] * l["buffer_bytes"]].reshape(l["num_buffers"], l["num_pages"], l["page_bytes"])


def prefill(addr, transport, rooms, pages):
    pool = np.zeros(kvferry.pool_nbytes(pages, **SIZES), dtype=np.uint8)
    mgr = kvferry.KVManager("prefill", pool, bootstrap_addr=addr, transport=transport, **GEO)
    view = pages_view(mgr, pool)
    view[:] = np.arange(view.shape[2], dtype=np.uint64).astype(np.uint8)  # same content for every page
    senders = [kvferry.KVSender(mgr, r) for r in range(1, rooms + 1)]
    for s in senders:
        s.init(pages)
    while any(s.poll() == kvferry.KVPoll.Bootstrapping for s in senders):
        time.sleep(0.001)
    t0 = time.monotonic()
    for s in senders:
        s.send(list(range(pages)))
    done = (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)
    while not all(s.poll() in done for s in senders):
        time.sleep(0.0002)
    secs = time.monotonic() - t0
    print(json.dumps({"states": [s.poll().name for s in senders], "secs": secs}), flush=True)
    sys.stdin.read()  # until decode has closed its manager
    mgr.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--room-mib", type=int, default=64)
    ap.add_argument("--rooms", type=int, default=8)
    ap.add_argument("--prefill", help=argparse.SUPPRESS)
    a = ap.parse_args()
    page_bytes = kvferry.pool_nbytes(1, aux_slots=0, **SIZES)
    pages = max(1, (a.room_mib << 20) // page_bytes)
    if a.prefill:
        return prefill(a.prefill, a.transport, a.rooms, pages)
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    child = subprocess.Popen([sys.executable, __file__, "--prefill", addr, "--transport", a.transport,
                              "--room-mib", str(a.room_mib), "--rooms", str(a.rooms)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    pool = np.zeros(kvferry.pool_nbytes(pages * a.rooms, **SIZES), dtype=np.uint8)
    mgr = kvferry.KVManager("decode", pool, bootstrap_addr=addr, transport=a.transport, **GEO)
    receivers = []
    for i in range(a.rooms):
        r = kvferry.KVReceiver(mgr, i + 1)
        r.init(range(i * pages, (i + 1) * pages), aux_index=i)
        receivers.append(r)
    done = (kvferry.KVPoll.Success, kvferry.KVPoll.Failed)
    while not all(r.poll() in done for r in receivers):
        time.sleep(0.001)
    states = [r.poll().name for r in receivers]
    view = pages_view(mgr, pool)
    expect = np.arange(view.shape[2], dtype=np.uint64).astype(np.uint8)
    bad = int((view[:, : pages * a.rooms, :] != expect).sum())
    moved = pages * a.rooms * page_bytes
    mgr.close()
    out, _ = child.communicate("", timeout=60)
    secs = json.loads(out)["secs"]
    print(f"{a.transport}: {a.rooms} rooms x {pages * page_bytes >> 20} MiB, states {set(states)}, "
          f"mismatched bytes {bad}, {moved / secs / 1e6:.0f} MB/s")
    return 0 if bad == 0 and set(states) == {"Success"} else 1


if __name__ == "__main__":
    sys.exit(main())
