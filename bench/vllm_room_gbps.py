#!/usr/bin/python3
"""GB/s of 4096-token rooms through kvferry's vLLM connector (kvferry.vllm), one room at a time
(issue 33, "Done when"). The C++ API's figure for the same room is `kvferry bench --concurrency 1`
(bench/compare.sh runs both; bench/summarize.py prints them side by side).

    PYTHONPATH=build/python /usr/bin/python3 bench/vllm_room_gbps.py [--rooms N] [--transport tcp|shm] [--json OUT]

A prefill and a decode engine of the fake vLLM (python/tests/fake_vllm: its Scheduler, the
connector loaded by module path through its factory) as two processes, each one scheduler and one
TP-1 worker connector stepped in vLLM's order (vllm/v1/worker/kv_connector_model_runner_mixin.py:
bind_connector_metadata, start_load_kv, per layer wait_for_layer_load / save_kv_layer,
wait_for_save, get_finished, get_block_ids_with_load_errors, get_kv_connector_stats). Host memory,
Llama-3.1-8B's geometry (32 layers, 8 KV heads, head size 128, 2-byte elements as bf16, block size
16: a 4096-token room is 256 blocks, 512 MiB). No model compute. Per room, in the proxy's two steps:
prefill runs the request (max_tokens 1) and returns kv_transfer_params; this process hands them
to decode, which adds the request; timed on decode: from the start of start_load_kv in the step
whose metadata opens the room until the request is in get_finished's finished_recving. Decode
steps without pause while a room is in flight (an engine with work does). GB/s = room bytes /
that time / 1e9. The next room starts once decode finished the request and prefill freed its
blocks (finished_sending). The first room's bytes are checked (CRC of every layer's K and V).
"""
import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "..", "python", "tests", "fake_vllm")

LAYERS, HEADS, HEAD_SIZE, BS = 32, 8, 128, 16  # Llama-3.1-8B, bf16 (2 bytes), vLLM's default block size


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def engine_main(role, conn, transport, port, tokens):
    sys.path.insert(0, FAKE)
    import numpy as np
    from vllm.config import CacheConfig, KVTransferConfig, ModelConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    blocks = tokens // BS + 8
    ex = {"kvferry_transport": transport, "kvferry_control_host": "127.0.0.1", "kvferry_kv_memory": "host",
          "kvferry_bootstrap_host": "127.0.0.1", "kvferry_bootstrap_port": port}
    vc = VllmConfig(model_config=ModelConfig(num_layers=LAYERS, total_num_kv_heads=HEADS, head_size=HEAD_SIZE),
                    cache_config=CacheConfig(block_size=BS, num_gpu_blocks=blocks),
                    kv_transfer_config=KVTransferConfig("KvferryConnector", "kv_producer" if role == "prefill"
                                                        else "kv_consumer", "kvferry.vllm", engine_id=role,
                                                        kv_connector_extra_config=ex))
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    kcc = KVCacheConfig(num_blocks=blocks, kv_cache_groups=[KVCacheGroupSpec(names, FullAttentionSpec(BS))])
    caches = {n: np.zeros((2, blocks, BS, HEADS, HEAD_SIZE), np.uint16) for n in names}
    if role == "prefill":  # distinct bytes per layer, tensor, block, token, head
        base = np.arange(blocks * BS * HEADS * HEAD_SIZE, dtype=np.uint64).reshape(blocks, BS, HEADS, HEAD_SIZE)
        for li, n in enumerate(names):
            for t in range(2):
                caches[n][t] = ((base * 2654435761 + li * 40503 + t * 977) >> 7).astype(np.uint16)
    worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
    worker.register_kv_caches(caches)
    sched = Scheduler(vc, kcc)
    reqs, timing = {}, {}

    def digest(block_ids):
        c = 0
        for n in names:
            for t in range(2):
                c = zlib.crc32(np.ascontiguousarray(caches[n][t, block_ids]).tobytes(), c)
        return c

    def step():
        so = sched.schedule()
        opening = [rid for rid, r in reqs.items() if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS
                   and rid not in timing]
        worker.bind_connector_metadata(so.kv_connector_metadata)
        t0 = time.perf_counter()
        worker.start_load_kv(None)
        for rid in opening:
            timing[rid] = t0
        if so.num_scheduled_tokens:  # a forward pass: the attention layers' hooks
            for n in names:
                worker.wait_for_layer_load(n)
                worker.save_kv_layer(n, caches[n], None)
        # else vLLM's no-forward step (kv_connector_model_runner_mixin.py kv_connector_no_forward:
        # no layer hooks), which a decode engine waiting for remote KV runs back to back
        worker.wait_for_save()
        kvo = KVConnectorOutput()
        kvo.finished_sending, kvo.finished_recving = worker.get_finished(so.finished_req_ids)
        t1 = time.perf_counter()
        kvo.invalid_block_ids = worker.get_block_ids_with_load_errors()
        kvo.kv_connector_stats = worker.get_kv_connector_stats()
        worker.clear_connector_metadata()
        for rid in kvo.finished_recving or ():
            if rid in timing and isinstance(timing[rid], float):
                ok = not kvo.invalid_block_ids
                (ids,) = sched.kv_cache_manager.get_block_ids(rid)
                timing[rid] = (t1 - timing[rid], ok, ids[:tokens // BS])
        if kvo.invalid_block_ids or (kvo.kv_connector_stats and kvo.kv_connector_stats.data.get("failed")):
            conn.send(("error", f"{role}: a room failed: {kvo.kv_connector_stats and kvo.kv_connector_stats.data}"))
        mro = ModelRunnerOutput(req_ids=list(so.num_scheduled_tokens),
                                sampled_token_ids={rid: [7] for rid in so.num_scheduled_tokens}, kv_connector_output=kvo)
        for o in sched.update_from_output(so, mro):
            rid = o["request_id"]
            if role == "prefill":
                p = o["kv_transfer_params"]
                conn.send(("params", rid, p, digest(p["remote_block_ids"]) if reqs[rid].verify else None))
            else:
                dt, ok, ids = timing.pop(rid)
                conn.send(("done", rid, dt, ok, digest(ids) if reqs[rid].verify else None))
            reqs.pop(rid, None)
        if role == "prefill":
            for rid in kvo.finished_sending or ():
                conn.send(("freed", rid))

    conn.send(("ready",))
    try:
        while True:
            busy = sched.has_work()
            if conn.poll(0 if busy else 0.05):
                msg = conn.recv()
                if msg[0] == "stop":
                    break
                _, rid, params, verify = msg
                r = Request(rid, [(i * 7) % 50000 for i in range(tokens)], 1, params)
                r.verify = verify
                reqs[rid] = r
                sched.add_request(r)
            if sched.has_work():
                step()
    finally:
        worker.shutdown()
        sched.connector.shutdown()


def expect(conn, kind, timeout_s=120):
    if not conn.poll(timeout_s):
        raise SystemExit(f"vllm_room_gbps: no {kind} within {timeout_s} s")
    msg = conn.recv()
    if msg[0] == "error":
        raise SystemExit(f"vllm_room_gbps: {msg[1]}")
    if msg[0] != kind:
        raise SystemExit(f"vllm_room_gbps: expected {kind}, got {msg!r}")
    return msg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rooms", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--transport", default="tcp", choices=["tcp", "shm"])
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    port = free_port()
    pipes, procs = {}, {}
    for role in ("prefill", "decode"):
        mine, theirs = ctx.Pipe()
        pipes[role] = mine
        procs[role] = ctx.Process(target=engine_main, args=(role, theirs, a.transport, port, a.tokens), daemon=True)
        procs[role].start()
        expect(mine, "ready")
    P, D = pipes["prefill"], pipes["decode"]
    room_bytes = a.tokens * LAYERS * 2 * HEADS * HEAD_SIZE * 2
    secs = []
    try:
        for i in range(a.warmup + a.rooms):
            rid = f"req-{i}"
            P.send(("add", rid, {"do_remote_decode": True}, i == 0))
            _, _, params, pcrc = expect(P, "params")
            D.send(("add", rid, dict(params), i == 0))
            _, _, dt, ok, dcrc = expect(D, "done")
            if not ok:
                raise SystemExit(f"vllm_room_gbps: room of {rid} failed on decode")
            if i == 0 and pcrc != dcrc:
                raise SystemExit(f"vllm_room_gbps: the first room's bytes differ (crc {pcrc:#x} sent, {dcrc:#x} landed)")
            expect(P, "freed")
            if i >= a.warmup:
                secs.append(dt)
    finally:
        for c in pipes.values():
            try:
                c.send(("stop",))
            except OSError:
                pass
        for p in procs.values():
            p.join(10)
            if p.is_alive():
                p.kill()
    gbps = [room_bytes / s / 1e9 for s in secs]
    out = {"transport": a.transport, "rooms": a.rooms, "tokens": a.tokens, "room_bytes": room_bytes,
           "gb_per_s": statistics.median(gbps), "gb_per_s_min": min(gbps), "gb_per_s_max": max(gbps),
           "room_ms_p50": statistics.median(secs) * 1e3, "room_ms": [round(s * 1e3, 2) for s in secs]}
    print(f"vllm connector, {a.tokens}-token room ({room_bytes / 2**20:.0f} MiB), {a.transport}, {a.rooms} rooms one at "
          f"a time: median {out['gb_per_s']:.3f} GB/s (min {out['gb_per_s_min']:.3f}, max {out['gb_per_s_max']:.3f}); "
          f"room p50 {out['room_ms_p50']:.1f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
