"""One engine of a fake vLLM (fake_vllm/) for test_vllm_harness.py: a scheduler process and one
worker process per TP rank, as vLLM's EngineCore and its multiprocess executor run them; the
kvferry connector is loaded by module path through the stand-in's factory in every process.

Workers start first and register their KV caches (vLLM initializes the KV cache before it builds
the scheduler); every step the scheduler's SchedulerOutput goes to each worker, which runs the
model (per layer: wait_for_layer_load, write this step's KV, save_kv_layer) inside the KV
connector calls of vllm/v1/worker/kv_connector_model_runner_mixin.py; the workers' outputs are
merged by KVOutputAggregator and handed to Scheduler.update_from_output.

The model writes, for token t of a request, layer l, tensor k (K, V; MLA: the latent) and global
KV head h, values derived from (request seed, l, k, t, h): a head on the wrong rank, a token in the
wrong block or a layer swapped is a mismatch. A decode request whose prompt KV came from prefill
is checked, every byte of this rank's heads, before its first forward (checks in the output).

Test hooks (never the connector's): each process logs every record to a JSON-lines file; a
worker's fault plan injects kvferry faults through the connector's manager (kvferry's documented
switch, KVFERRY_FAULT_INJECTION=1): "write_failure" rooms, "hold" rooms (writes stay in flight
until the room failed on this rank; the worker tells the engine once they are held).
"""
import json
import logging
import multiprocessing as mp
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_vllm"))

from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,  # noqa: E402
                         SchedulerConfig, VllmConfig)
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402

LAYERS, HEADS, HEAD_SIZE, NUM_BLOCKS = 2, 4, 8, 48
STEP_IDLE_S = 0.002


def make_config(cfg, tp: int):
    ktc = KVTransferConfig(kv_connector="KvferryConnector", kv_connector_module_path="kvferry.vllm",
                           kv_role=cfg["kv_role"], engine_id=cfg["role"],
                           kv_connector_extra_config=dict(cfg.get("extra", {})),
                           kv_load_failure_policy=cfg.get("policy", "recompute"))
    return VllmConfig(model_config=ModelConfig(num_layers=LAYERS, total_num_kv_heads=HEADS, head_size=HEAD_SIZE,
                                               use_mla=cfg.get("mla", False)),
                      cache_config=CacheConfig(block_size=cfg.get("block_size", 4)),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp), scheduler_config=SchedulerConfig(),
                      kv_transfer_config=ktc)


def kv_cache_config(cfg):
    names = [f"model.layers.{l}.self_attn.attn" for l in range(LAYERS)]
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_groups=[KVCacheGroupSpec(names,
                                                                                 FullAttentionSpec(cfg.get("block_size", 4)))])


def content(seed: int, layer: int, tensor: int, tokens, heads):
    t = np.asarray(tokens, np.int64)[:, None, None]
    h = np.asarray(heads, np.int64)[None, :, None]
    d = np.arange(HEAD_SIZE, dtype=np.int64)[None, None, :]
    return ((seed * 7919 + layer * 104729 + tensor * 1299709 + t * 31 + h * 131 + d * 3) % 65521).astype(np.uint16)


def token_at(seed: int, pos: int) -> int:
    return (seed * 7 + pos) % 50000


class JsonLog(logging.Handler):
    def __init__(self, path, proc):
        super().__init__(logging.DEBUG)
        self.f, self.proc = open(path, "a", buffering=1), proc

    def emit(self, r):
        room = getattr(r, "room", None)
        self.f.write(json.dumps({"proc": self.proc, "name": r.name, "level": r.levelno, "msg": r.getMessage(),
                                 "room": None if room is None else int(room), "code": getattr(r, "code", None),
                                 "origin": getattr(r, "origin", None), "t": time.monotonic()}) + "\n")


def _setup_logging(cfg, proc):
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    root.addHandler(JsonLog(os.path.join(cfg["log_dir"], f"{proc}.jsonl"), proc))
    for k, v in cfg.get("env", {}).items():
        os.environ[k] = v


class Model:
    """One TP rank: the model runner with vLLM's connector calls (KVConnectorModelRunnerMixin)."""

    def __init__(self, cfg, rank: int, tp: int):
        from vllm.distributed import parallel_state
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
        from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
        parallel_state.init(rank, tp)
        KVConnectorFactory.rule = cfg.get("factory_rule", "module_path_first")
        self.cfg, self.rank, self.tp = cfg, rank, tp
        self.mla = cfg.get("mla", False)
        self.bs = cfg.get("block_size", 4)
        self.heads = [0] if self.mla else list(range(rank * HEADS // tp, (rank + 1) * HEADS // tp))
        self.tensors = 1 if self.mla else 2
        shape = (NUM_BLOCKS, self.bs, HEAD_SIZE) if self.mla else (2, NUM_BLOCKS, self.bs, len(self.heads), HEAD_SIZE)
        self.names = [f"model.layers.{l}.self_attn.attn" for l in range(LAYERS)]
        self.kv = {n: np.zeros(shape, np.uint16) for n in self.names}
        self.connector = KVConnectorFactory.create_connector(make_config(cfg, tp), KVConnectorRole.WORKER,
                                                             kv_cache_config(cfg))
        self.connector.register_kv_caches(self.kv)
        self.mixin = KVConnectorModelRunnerMixin()
        self.mixin.connector = self.connector
        self.reqs = {}  # req_id -> [seed, block ids]

    def _view(self, layer: int, tensor: int, block: int):
        a = self.kv[self.names[layer]]
        return a[block] if self.mla else a[tensor, block]  # [block_size, heads, head] (MLA: [block_size, head])

    def _tokens(self, req, first: int, n: int, check: bool):
        seed, ids = req
        bad = 0
        for l in range(LAYERS):
            for k in range(self.tensors):
                want = content(seed, l, k, range(first, first + n), self.heads)
                for i, tok in enumerate(range(first, first + n)):
                    blk, off = ids[tok // self.bs], tok % self.bs
                    view = self._view(l, k, blk)
                    w = want[i, 0] if self.mla else want[i]
                    if check:
                        bad += int(np.count_nonzero(view[off] != w))
                    else:
                        view[off] = w
        return bad

    def execute(self, so):
        from vllm.v1.outputs import ModelRunnerOutput
        checks = {}
        for rid in so.finished_req_ids | so.preempted_req_ids:
            self.reqs.pop(rid, None)
        for n in so.scheduled_new_reqs:
            self.reqs[n.req_id] = [n.prompt_token_ids[0], list(n.block_ids[0])]
            if n.num_computed_tokens:  # KV computed elsewhere: every byte of this rank's heads
                bad = self._tokens(self.reqs[n.req_id], 0, n.num_computed_tokens, True)
                nbytes = LAYERS * self.tensors * n.num_computed_tokens * len(self.heads) * HEAD_SIZE * 2
                checks[n.req_id] = {"bytes": nbytes, "bad": bad}
        for rid, (ids, _) in so.scheduled_cached_reqs.items():
            self.reqs[rid][1] = list(ids[0])
        computed = {n.req_id: n.num_computed_tokens for n in so.scheduled_new_reqs}
        computed.update({rid: nc for rid, (_, nc) in so.scheduled_cached_reqs.items()})
        with self.mixin._get_kv_connector_output(so, wait_for_save=bool(so.total_num_scheduled_tokens)) as kvo:
            if so.total_num_scheduled_tokens:
                for l, name in enumerate(self.names):
                    self.connector.wait_for_layer_load(name)
                    time.sleep(self.cfg.get("layer_ms", 0) / 1000)  # the layer's compute
                    for rid, n in so.num_scheduled_tokens.items():
                        seed, ids = self.reqs[rid]
                        for k in range(self.tensors):
                            for tok in range(computed[rid], computed[rid] + n):
                                v = content(seed, l, k, [tok], self.heads)[0]
                                self._view(l, k, ids[tok // self.bs])[tok % self.bs] = v[0] if self.mla else v
                    self.connector.save_kv_layer(name, self.kv[name], None)
        sampled = {rid: [token_at(self.reqs[rid][0], computed[rid] + n)] for rid, n in so.num_scheduled_tokens.items()}
        return ModelRunnerOutput(list(so.num_scheduled_tokens), sampled, kvo, extra={"checks": checks})


def worker_main(cfg, rank, tp, conn):
    _setup_logging(cfg, f"{cfg['role']}-tp{rank}")
    try:
        model = Model(cfg, rank, tp)
    except Exception as e:  # noqa: BLE001
        logging.getLogger("test").exception("worker start failed")
        conn.send(("error", repr(e)))
        return
    faults = cfg.get("faults", {}).get(f"{cfg['role']}/tp{rank}", {})
    mgr = model.connector.kvferry_manager() if cfg["role"] == "prefill" else None
    for room in faults.get("write_failure", []):
        mgr.inject_write_failure(room)
    holds = set(faults.get("hold", []))
    kept = set(faults.get("hold_kept", []))  # held until the test says release_holds, even if the room fails
    for room in holds | kept:
        mgr.hold_writes(room)
    told = set()
    conn.send(("ready", os.getpid()))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            break
        if msg[0] == "release":
            for room in kept:
                mgr.release_held_writes(room)
            kept = set()
            conn.send(("released",))
            continue
        mro = model.execute(msg[1])
        events = []
        for room in list(kept):
            if room not in told and mgr.held_writes(room) > 0:
                told.add(room)
                events.append(("held", room))
        for room in list(holds):
            if room not in told and mgr.held_writes(room) > 0:
                told.add(room)
                events.append(("held", room))
            try:
                failed = mgr.room_poll(room) == 0
            except ValueError:
                failed = room in told
            if failed and room in told:
                mgr.release_held_writes(room)
                holds.discard(room)
        conn.send(("out", mro, events))
    model.connector.shutdown()
    import kvferry
    kvferry.flush_logs()
    conn.send(("stopped",))


def engine_main(cfg, in_q, out_q):
    """The engine: its workers, then its scheduler; steps while there is work."""
    _setup_logging(cfg, f"{cfg['role']}-scheduler")
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request, RequestStatus
    KVConnectorFactory.rule = cfg.get("factory_rule", "module_path_first")
    tp = cfg["tp"]
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for r in range(tp):
        a, b = ctx.Pipe()
        p = ctx.Process(target=worker_main, args=(cfg, r, tp, b), daemon=True)
        p.start()
        conns.append(a)
        procs.append(p)
    pids = []
    for c in conns:
        m = c.recv()
        if m[0] != "ready":
            out_q.put(("error", m[1]))
            return
        pids.append(m[1])
    sched = Scheduler(make_config(cfg, tp), kv_cache_config(cfg))
    agg = KVOutputAggregator.from_connector(sched.connector, tp)
    out_q.put(("ready", cfg["role"], pids + [os.getpid()]))
    free = None
    taken = []
    while True:
        stop = False
        while not in_q.empty():
            cmd = in_q.get()
            if cmd[0] == "add":
                _, rid, prompt, max_tokens, params = cmd
                sched.add_request(Request(rid, prompt, max_tokens, params))
            elif cmd[0] == "abort":
                sched.finish_requests([cmd[1]], RequestStatus.FINISHED_ABORTED)
            elif cmd[0] == "preempt":
                out_q.put(("preempted", cmd[1], sched.preempt(cmd[1])))
            elif cmd[0] == "take_blocks":  # test hook: other requests hold every free block
                taken = list(sched.kv_cache_manager.free_blocks)
                sched.kv_cache_manager.free_blocks.clear()
                out_q.put(("blocks_taken", len(taken)))
            elif cmd[0] == "release_holds":  # test hook: the "hold_kept" writes of every rank go on
                for c in conns:
                    c.send(("release",))
                    c.recv()
                out_q.put(("holds_released",))
            elif cmd[0] == "count_free":  # test hook: the free blocks now, stepping or not
                out_q.put(("free_now", len(sched.kv_cache_manager.free_blocks)))
            elif cmd[0] == "give_blocks":
                sched.kv_cache_manager.free_blocks.extend(taken)
                taken = []
            elif cmd[0] == "stop":
                stop = True
        if stop:
            break
        if not sched.has_work():
            time.sleep(STEP_IDLE_S)
            continue
        so = sched.schedule()
        for c in conns:
            c.send(("step", so))
        mros = []
        for c in conns:
            _, mro, events = c.recv()
            mros.append(mro)
            for e in events:
                out_q.put(e)
            for rid, chk in mro.extra.get("checks", {}).items():
                out_q.put(("check", rid, chk))
        mro = agg.aggregate(mros)
        for o in sched.update_from_output(so, mro):
            out_q.put(("output", o))
        kvo = mro.kv_connector_output
        if kvo is not None and not kvo.is_empty():
            stats = kvo.kv_connector_stats
            out_q.put(("kv", {"finished_sending": sorted(kvo.finished_sending or ()),
                              "finished_recving": sorted(kvo.finished_recving or ()),
                              "invalid": sorted(kvo.invalid_block_ids or ()),
                              "failures": list(stats.data.get("failures", [])) if stats else [],
                              "succeeded": stats.data.get("succeeded", 0) if stats else 0,
                              "layerwise": stats.data.get("layerwise", 0) if stats else 0}))
        if len(sched.kv_cache_manager.free_blocks) != free:
            free = len(sched.kv_cache_manager.free_blocks)
            out_q.put(("free_blocks", free))
        if not so.total_num_scheduled_tokens:
            time.sleep(STEP_IDLE_S)
    for c in conns:
        c.send(("stop",))
    for c in conns:
        try:
            c.recv()
        except EOFError:
            pass
    for p in procs:
        p.join(timeout=10)
    if sched.connector is not None:
        sched.connector.shutdown()
    out_q.put(("stopped", cfg["role"]))
