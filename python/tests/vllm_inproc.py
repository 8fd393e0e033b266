"""In one process: prefill and decode engines of the fake vLLM (its Scheduler plus one TP-1 worker
connector each, numpy KV caches), stepped in vLLM's order (vllm/v1/core/sched/scheduler.py
Scheduler.schedule / update_from_output; vllm/v1/worker/kv_connector_model_runner_mixin.py).
For races that need several requests in one step (test_vllm_inproc.py); test_vllm_harness.py runs
engines as processes."""
import socket, time
import numpy as np
from vllm.config import VllmConfig, KVTransferConfig, CacheConfig, ModelConfig
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, FullAttentionSpec
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus  # noqa: F401 (tests use H.RequestStatus)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from kvferry.vllm import KvferryConnector

L, H, D, BS = 2, 4, 8, 16

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def cfg(role, port=None, blocks=64, bs=BS, extra=None, policy="recompute"):
    ex = {"kvferry_transport": "tcp", "kvferry_control_host": "127.0.0.1"}
    if port: ex.update(kvferry_bootstrap_host="127.0.0.1", kvferry_bootstrap_port=port)
    ex.update(extra or {})
    return VllmConfig(model_config=ModelConfig(num_layers=L, total_num_kv_heads=H, head_size=D),
                      cache_config=CacheConfig(block_size=bs, num_gpu_blocks=blocks),
                      kv_transfer_config=KVTransferConfig("KvferryConnector", role, "kvferry.vllm",
                                                          engine_id=role, kv_connector_extra_config=ex,
                                                          kv_load_failure_policy=policy))

def kv_value(tok, pos, layer, t):
    return np.uint8((tok * 31 + pos * 7 + layer * 13 + t * 101 + 5) & 0xff)

class Engine:
    def __init__(self, role, port=None, blocks=64, bs=BS, extra=None, policy="recompute"):
        self.bs = bs
        self.vc = cfg(role, port, blocks, bs, extra, policy)
        kcc = KVCacheConfig(num_blocks=blocks, kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.attn" for i in range(L)], FullAttentionSpec(bs))])
        self.sched = Scheduler(self.vc, kcc)
        self.w = KvferryConnector(self.vc, KVConnectorRole.WORKER, kcc)
        self.caches = {f"model.layers.{i}.attn": np.zeros((2, blocks, bs, H, D), np.uint8) for i in range(L)}
        self.w.register_kv_caches(self.caches)
        self.reqs = {}
        self.outputs = []
        self.layer_hook = None

    def add(self, rid, prompt, max_tokens=1, params=None):
        r = Request(rid, prompt, max_tokens, params)
        self.reqs[rid] = r
        self.sched.add_request(r)
        return r

    def fill(self, rid, start, n):
        r = self.reqs[rid]
        (ids,) = self.sched.kv_cache_manager.get_block_ids(rid)
        toks = r.prompt_token_ids + r.output_token_ids
        for p in range(start, start + n):
            b, o = ids[p // self.bs], p % self.bs
            for li, name in enumerate(self.caches):
                for t in range(2):
                    self.caches[name][t, b, o] = kv_value(toks[p], p, li, t)

    def check(self, rid, n):
        """bad positions among the first n tokens of rid's blocks"""
        r = self.reqs[rid]
        (ids,) = self.sched.kv_cache_manager.get_block_ids(rid)
        bad = []
        for p in range(n):
            b, o = ids[p // self.bs], p % self.bs
            for li, name in enumerate(self.caches):
                for t in range(2):
                    if not (self.caches[name][t, b, o] == kv_value(r.prompt_token_ids[p], p, li, t)).all():
                        bad.append((p, li, t)); break
        return bad

    def step(self, before_save=None):
        so = self.sched.schedule()
        c = self.w
        c.bind_connector_metadata(so.kv_connector_metadata)
        c.start_load_kv(None)
        # forward: write KV of scheduled tokens
        starts = {}
        for rid, n in so.num_scheduled_tokens.items():
            r = self.reqs[rid]
            starts[rid] = r.num_computed_tokens - n
        for li, name in enumerate(self.caches):
            c.wait_for_layer_load(name)
            if li == 0:
                for rid, n in so.num_scheduled_tokens.items():
                    self.fill(rid, starts[rid], n)
            c.save_kv_layer(name, self.caches[name], None)
        if before_save: before_save()
        c.wait_for_save()
        from vllm.v1.outputs import KVConnectorOutput
        kvo = KVConnectorOutput()
        kvo.finished_sending, kvo.finished_recving = c.get_finished(so.finished_req_ids)
        kvo.invalid_block_ids = c.get_block_ids_with_load_errors()
        kvo.kv_connector_stats = c.get_kv_connector_stats()
        c.clear_connector_metadata()
        mro = ModelRunnerOutput(req_ids=list(so.num_scheduled_tokens),
                                sampled_token_ids={rid: [1000 + len(self.reqs[rid].output_token_ids)] for rid in so.num_scheduled_tokens},
                                kv_connector_output=kvo)
        outs = self.sched.update_from_output(so, mro)
        self.outputs += outs
        self.last = (so, kvo)
        return so, kvo, outs

def run_until(engines, cond, deadline_s=30, dt=0.002):
    """Steps the engines until cond() holds (True) or the deadline passes (False)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        for e in engines: e.step()
        if cond(): return True
        time.sleep(dt)
    return False
