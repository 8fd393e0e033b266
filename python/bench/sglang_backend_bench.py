"""Per-room cost of kvferry's SGLang backend (kvferry.sglang), 1 prefill + 1 decode rank as
processes, one room at a time, driven as SGLang's schedulers drive it (KVSender / KVReceiver polls,
send_metadata, one send() of the whole room). Two measurements, each next to `kvferry bench` (the
C++ API) at the same geometry, transport and concurrency 1:

  control: 1 page of 1 layer per room (--layers 1 --tokens PAGE): send_metadata to Success on the
           decode rank, p50 / p99 ms;
  bulk:    TOKENS tokens per room, every layer: send_metadata to Success, and the room's bytes over
           that time (GB/s).

  PYTHONPATH=build/python /usr/bin/python3 python/bench/sglang_backend_bench.py [--transport tcp]
      [--model Llama-3.1-8B] [--tokens 4096] [--page-size 64] [--rooms 200] [--bulk-rooms 10]
      [--kvferry build/kvferry]

Prints one line per measurement and, with --kvferry, the same from `kvferry bench`. Host memory;
the KV is the model's real byte volume (data/models.json); nothing is verified here (the tests do).
"""
import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python", "tests", "fake_sglang"))  # ServerArgs / DisaggregationMode stand-ins

POLL_S = 0.0002  # a scheduler step between polls


def geometry(model):
    with open(os.path.join(ROOT, "data", "models.json")) as f:
        m = next(x for x in json.load(f) if x["model"] == model)
    return m["num_hidden_layers"], m["cache_tensors_per_layer"], m["cache_heads_per_layer"], \
        m["cache_entry_dim"] * m["dtype_bytes"]


def wait(obj, want, ks, what):
    deadline = time.monotonic() + 20
    while True:
        p = obj.poll()
        if p == want:
            return
        if p == ks.KVPoll.Failed:
            obj.failure_exception()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: still {int(p)} after 20 s")
        time.sleep(POLL_S)


def rank_main(role, cfg, results):
    os.environ.update({"KVFERRY_KV_MEMORY": "host", "KVFERRY_STATE_MEMORY": "host",
                       "KVFERRY_TRANSPORT": cfg["transport"], "KVFERRY_TOTAL_KV_HEADS": str(cfg["heads"]),
                       "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1"})
    import kvferry.sglang as ks
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.server_args import ServerArgs
    layers, tensors, heads, head_bytes = cfg["layers"], cfg["tensors"], cfg["heads"], cfg["head_bytes"]
    item = cfg["page"] * heads * head_bytes
    pages = cfg["pages"]
    # Touched now (filled), so the first room does not pay for first-touch page faults.
    kv = [np.full((pages, item), 7 if role == "prefill" else 0, np.uint8) for _ in range(layers * tensors)]
    aux = np.zeros((4, 64), np.uint8)
    a = ks.KVArgs()
    a.engine_rank, a.pp_rank, a.system_dp_rank, a.page_size = 0, 0, 0, cfg["page"]
    a.kv_data_ptrs, a.kv_data_lens = [x.ctypes.data for x in kv], [x.nbytes for x in kv]
    a.kv_item_lens = [item] * len(kv)
    a.aux_data_ptrs, a.aux_data_lens, a.aux_item_lens = [aux.ctypes.data], [aux.nbytes], [64]
    a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
    a.kv_cache_dtype_str = "auto"
    if role == "prefill":
        a.kv_head_num, a.total_kv_head_num = heads, heads
    sargs = ServerArgs(tp_size=1, disaggregation_bootstrap_port=cfg["port"], disaggregation_transfer_backend="kvferry",
                       disaggregation_mode=role)
    mode = DisaggregationMode.PREFILL if role == "prefill" else DisaggregationMode.DECODE
    mgr = ks.KVManager(a, mode, sargs, False)
    addr = f"127.0.0.1:{cfg['port']}"
    idx = np.arange(cfg["room_pages"], dtype=np.int32)
    times = []
    for room in range(1, cfg["rooms"] + 1):
        room += cfg["room_base"]
        if role == "prefill":
            s = ks.KVSender(mgr, addr, room, [0], 0)
            wait(s, ks.KVPoll.WaitingForInput, ks, f"prefill room {room}")
            s.init(len(idx), 0)
            s.send(idx, [], num_kv_tokens=len(idx) * cfg["page"])
            wait(s, ks.KVPoll.Success, ks, f"prefill room {room}")
            s.clear()
        else:
            r = ks.KVReceiver(mgr, addr, room)
            while not mgr.try_ensure_parallel_info(addr):
                time.sleep(POLL_S)
            r.init(0)
            wait(r, ks.KVPoll.WaitingForInput, ks, f"decode room {room}")
            t0 = time.perf_counter()
            r.send_metadata(idx, 0, [], decode_prefix_len=0)
            wait(r, ks.KVPoll.Success, ks, f"decode room {room}")
            times.append(time.perf_counter() - t0)
            r.clear()
    mgr.close()
    results.put((role, times))


def run(cfg):
    import kvferry.sglang as ks
    ctx = mp.get_context("spawn")
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    cfg = {**cfg, "port": server.port}
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(role, cfg, results)) for role in ("prefill", "decode")]
    for p in procs:
        p.start()
    out = {}
    while len(out) < len(procs):
        try:
            role, times = results.get(timeout=1)
            out[role] = times
        except Exception:  # noqa: BLE001 (queue.Empty: is a rank gone?)
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead:
                for p in procs:
                    p.kill()
                raise SystemExit(f"a rank exited with {dead[0].exitcode} (its traceback is above)")
    for p in procs:
        p.join(timeout=60)
    return out["decode"]


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def cpp_bench(kvferry, args, layers, tokens):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "bench.json")
        cmd = [kvferry, "bench", "--model", args.model, "--tokens", str(tokens), "--page-size", str(args.page_size),
               "--concurrency", "1", "--transport", args.transport, "--duration", "5", "--out", out]
        if layers:
            cmd += ["--layers", str(layers)]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--model", default="Llama-3.1-8B")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--rooms", type=int, default=200)
    ap.add_argument("--bulk-rooms", type=int, default=10)
    ap.add_argument("--kvferry", default="", help="the kvferry CLI, to run `kvferry bench` beside")
    args = ap.parse_args()
    layers, tensors, heads, head_bytes = geometry(args.model)
    base = {"transport": args.transport, "tensors": tensors, "heads": heads, "head_bytes": head_bytes,
            "page": args.page_size}
    ctl = run({**base, "layers": 1, "pages": 4, "room_pages": 1, "rooms": args.rooms, "room_base": 1000})[5:]
    print(f"sglang backend control ({args.model}, 1 page of {args.page_size} tokens, 1 layer, {args.transport}): "
          f"send_metadata to Success p50 {pct(ctl, 0.5) * 1e3:.2f} ms, p99 {pct(ctl, 0.99) * 1e3:.2f} ms "
          f"over {len(ctl)} rooms")
    room_pages = args.tokens // args.page_size
    bulk = run({**base, "layers": layers, "pages": room_pages, "room_pages": room_pages, "rooms": args.bulk_rooms + 1,
                "room_base": 5000})[1:]
    room_bytes = room_pages * args.page_size * heads * head_bytes * tensors * layers
    gbs = [room_bytes / t / 1e9 for t in bulk]
    print(f"sglang backend bulk ({args.model}, {args.tokens} tokens = {room_bytes / 2**20:.0f} MiB per room, "
          f"{args.transport}): send_metadata to Success p50 {pct(bulk, 0.5) * 1e3:.1f} ms, "
          f"{pct(gbs, 0.5):.3f} GB/s (p50 over {len(bulk)} rooms)")
    if args.kvferry:
        def lat(j, key):
            x = j.get(key, {})
            return f"p50 {x.get('p50', 0):.2f} ms, p99 {x.get('p99', 0):.2f} ms"
        c = cpp_bench(args.kvferry, args, 1, args.page_size)
        print(f"kvferry bench control (C++ API, same geometry, concurrency 1): decode room (registration to "
              f"Success) {lat(c, 'room_latency_ms')}; prefill first send() to Success {lat(c, 'transfer_latency_ms')}")
        b = cpp_bench(args.kvferry, args, 0, args.tokens)
        print(f"kvferry bench bulk (C++ API, same geometry, concurrency 1): {b['gb_per_s']:.3f} GB/s; decode room "
              f"{lat(b, 'room_latency_ms')}")

if __name__ == "__main__":
    main()
