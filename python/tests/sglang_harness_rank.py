"""One rank of an SGLang-shaped scheduler for test_sglang_harness.py, run as its own process.

It makes the calls SGLang's prefill and decode event loops make on kvferry's backend classes, in
their order (python/sglang/srt/disaggregation/{prefill,decode}.py in SGLang), over host numpy
buffers shaped as SGLang's KVArgs describes them:

prefill, every step: new requests -> KVSender, bootstrap queue; poll the bootstrap queue (MIN over
  the engine's ranks) -> WaitingForInput: pop_decode_prefix_len(), init(num_pages, aux row), fill
  the pages; Failed: handle as SGLang's handle_bootstrap_failure. Then one chunk per running
  request (full pages, the last chunk with state_indices, possibly with no pages; should_send_kv_chunk
  first); poll the inflight queue (MIN) -> Success: clear(), free; Failed: failure_exception(), log
  at debug if is_from_another_rank else warning, free.
decode, every step: new requests -> KVReceiver; try_ensure_parallel_info, init(prefill_dp_rank);
  poll the handshake (MIN) -> WaitingForInput: allocate pages, aux row, state row, send_metadata;
  Failed: log (debug / error). Poll the transfer queue (metadata gate: Success only once the aux
  room row landed; then MIN) -> Success: check every byte, free; Failed: failure_exception(), log at
  debug if is_from_another_rank else error; abort_notified: defer the release until the manager's
  is_abort_release_safe(), else free now. Every free records whether the room was release-safe.

Faults (the plan the test passes): "write_failure" (prefill: every write of the room fails),
"hold" (prefill: writes stay in flight until the room failed here and a decode rank deferred its
release), "abort" (decode: the receiver is aborted once its metadata went out and, if a prefill
rank holds the room, once its held writes are in flight). The ranks tell each other these events
through marker files in the run's events directory, so the deferred release is certain, not a race.

DP attention (cfg dp_size > 1, SGLang's --enable-dp-attention): the engine's tp_size ranks form
dp_size attention DP ranks of attn_tp = tp_size // dp_size ranks each (layers/dp_attention.py
compute_dp_attention_world_info: tp_rank = attn_dp_rank * attn_tp + attn_tp_rank). KVArgs as
prefill.py / decode.py _init_kv_manager set them: engine_rank the global TP rank on prefill, the
rank in its attention TP group on decode; system_dp_rank the scheduler's DP rank (the attention DP
rank, data_parallel_controller.py launch_tensor_parallel_group). The DP controller gives each
request to one DP rank (data_parallel_controller.py: follow_bootstrap_room_scheduler room % dp,
round_robin_scheduler in arrival order, an external routed DP rank first:
maybe_external_dp_rank_routing); a request's "prefill_dp" is such a routed rank, and the router
then gives decode the same (req.disagg_prefill_dp_rank; prefill.py passes
req_has_disagg_prefill_dp_rank to the KVSender). The poll MIN is over the attention TP group only
(prefill.py poll_and_all_reduce_attn_cp_tp_group over attn_tp_cpu_group; decode.py's gloo_group is
the scheduler's attn_tp_cpu_group, scheduler.py). Decode resolves a room's prefill DP rank as
decode.py DecodePreallocQueue._resolve_prefill_dp_rank / _resolve_pending_reqs do: the request's
own, else 0 for a prefill of DP 1, else room % dp with follow_bootstrap_room, else the bootstrap
service's query_prefill_dp_ranks for the rooms still unresolved (retried every step).
"""
import logging
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_sglang"))  # the stand-in's DisaggregationMode / ServerArgs

from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402  (stand-in)
from sglang.srt.server_args import ServerArgs  # noqa: E402  (stand-in)

PAGE = 4
HEAD_BYTES = 16
LAYERS = 2
NUM_PAGES = 64
AUX_ROWS = 16
AUX_ITEM = 64
STATE_ROWS = 8
STATE_ITEM = 48
STEP_S = 0.002
LOG_NAMES = {"prefill": "sglang.srt.disaggregation.prefill", "decode": "sglang.srt.disaggregation.decode"}


class Group:
    """The engine's CPU group: all_reduce MIN over its ranks (shared memory and a barrier)."""

    def __init__(self, rank, size, barrier, arr, width):
        self.rank, self.size, self.barrier, self.arr, self.width = rank, size, barrier, arr, width

    def min(self, values):
        values = [int(v) for v in values]
        assert len(values) <= self.width
        base = self.rank * self.width
        for i, v in enumerate(values):
            self.arr[base + i] = v
        self.barrier.wait()
        out = [min(self.arr[r * self.width + i] for r in range(self.size)) for i in range(len(values))]
        self.barrier.wait()
        return out


class Records(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.items = []

    def emit(self, r):
        room = getattr(r, "room", None)
        self.items.append({"name": r.name, "level": r.levelno, "msg": r.getMessage(),
                           "room": None if room is None else int(room)})


def room_content(room, pages, heads, tensors):
    """The room's KV as [buffer, page, token, head, byte] (every rank slices its heads)."""
    rng = np.random.default_rng(room)
    return rng.integers(0, 256, size=(LAYERS * tensors, pages, PAGE, heads, HEAD_BYTES), dtype=np.uint8)


def aux_content(room):
    return np.random.default_rng(room + 1).integers(0, 256, size=AUX_ITEM, dtype=np.uint8)


def state_content(room):
    return np.random.default_rng(room + 2).integers(0, 256, size=STATE_ITEM, dtype=np.uint8)


# The decode server's kvferry engine_id (kvferry.engine_id): given by KVFERRY_ENGINE_ID, which
# every decode rank process of the harness sets, so that the names below are known in advance.
DECODE_ENGINE = 77


def rank_name(role, attn_tp_rank, dp_rank):
    """As kvferry names a rank (RankId::str): "decode77/tp1", "prefill/tp0/dp1"."""
    engine = DECODE_ENGINE if role == "decode" else ""
    return f"{role}{engine}/tp{attn_tp_rank}" + (f"/dp{dp_rank}" if dp_rank else "")


def place(cfg):
    """(attention TP size, attention TP rank, attention DP rank) of the rank cfg describes."""
    attn_tp = cfg["tp_size"] // cfg.get("dp_size", 1)
    return attn_tp, cfg["tp_rank"] % attn_tp, cfg["tp_rank"] // attn_tp


class Rank:
    def __init__(self, cfg, group, records):
        import kvferry.sglang as ks
        if cfg["role"] == "decode":
            os.environ["KVFERRY_ENGINE_ID"] = str(DECODE_ENGINE)  # this rank's process only
        self.ks, self.cfg, self.group, self.records = ks, cfg, group, records
        self.role, self.engine_tp, self.engine_tp_size = cfg["role"], cfg["tp_rank"], cfg["tp_size"]
        self.dp_size = cfg.get("dp_size", 1)
        self.tp_size, self.tp, self.dp = place(cfg)  # attention TP size and rank, attention DP rank
        self.name = rank_name(self.role, self.tp, self.dp)
        self.log = logging.getLogger(LOG_NAMES[self.role])
        self.mla = cfg["mla"]
        self.tensors = 1 if self.mla else 2
        self.total_heads = 1 if self.mla else cfg["total_heads"]
        self.heads = 1 if self.mla else self.total_heads // self.tp_size
        self.first_head = 0 if self.mla else self.tp * self.heads
        item = PAGE * self.heads * HEAD_BYTES
        self.kv = [np.zeros((NUM_PAGES, item), np.uint8) for _ in range(LAYERS * self.tensors)]
        self.aux = np.zeros((AUX_ROWS, AUX_ITEM), np.uint8)
        self.aux_room = np.zeros((AUX_ROWS, 8), np.uint64)  # SGLang's bootstrap_room metadata buffer
        self.state = np.zeros((STATE_ROWS, STATE_ITEM), np.uint8) if cfg["state"] else None
        a = ks.KVArgs()
        # prefill.py _init_kv_manager: engine_rank = tp_rank; decode.py: tp_rank % attn_tp_size.
        a.engine_rank = self.engine_tp if self.role == "prefill" else self.tp
        a.pp_rank, a.system_dp_rank, a.page_size = 0, self.dp, PAGE
        a.kv_data_ptrs = [x.ctypes.data for x in self.kv]
        a.kv_data_lens = [x.nbytes for x in self.kv]
        a.kv_item_lens = [item] * len(self.kv)
        aux = [self.aux, self.aux_room]
        a.aux_data_ptrs = [x.ctypes.data for x in aux]
        a.aux_data_lens = [x.nbytes for x in aux]
        a.aux_item_lens = [x.nbytes // AUX_ROWS for x in aux]
        if self.state is not None:
            a.state_types = ["mamba"]
            a.state_data_ptrs, a.state_data_lens = [[self.state.ctypes.data]], [[self.state.nbytes]]
            a.state_item_lens = [[STATE_ITEM]]
        else:
            a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
        a.kv_cache_dtype_str = "auto"
        if self.role == "prefill" and not self.mla:  # SGLang's prefill sets them, its decode does not
            a.kv_head_num, a.total_kv_head_num = self.heads, self.total_heads
        # Across hosts (cfg "host": this rank's address) the bootstrap service is on the prefill's
        # host (cfg "bootstrap_host"), as SGLang's --host of the prefill server gives it.
        bootstrap_host = cfg.get("bootstrap_host", "127.0.0.1")
        sargs = ServerArgs(tp_size=self.engine_tp_size, dp_size=self.dp_size,
                           enable_dp_attention=self.dp_size > 1,
                           load_balance_method=cfg.get("load_balance_method", "auto"),
                           disaggregation_bootstrap_port=cfg["bootstrap_port"],
                           disaggregation_transfer_backend="kvferry", disaggregation_mode=self.role,
                           host=bootstrap_host)
        self.lbm = ks.settings.load_balance_method(sargs, self.role)
        mode = DisaggregationMode.PREFILL if self.role == "prefill" else DisaggregationMode.DECODE
        self.mgr = ks.KVManager(a, mode, sargs, self.mla)
        self.addr = f"{bootstrap_host}:{cfg['bootstrap_port']}"
        self.free_pages = list(range(NUM_PAGES))
        self.free_aux = list(range(AUX_ROWS))
        self.free_state = list(range(STATE_ROWS))
        self.out = {"rooms": {}, "frees": [], "bytes_ok": {}, "overhead_ms": {}, "latency_s": {},
                    "rank_ip": self.mgr.rank_ip, "served": [], "prefill_dp": {}}

    def mine(self, index, req):
        """Whether the engine's DP controller gives request `index` of the run to this DP rank
        (data_parallel_controller.py: maybe_external_dp_rank_routing, then the method)."""
        if self.dp_size == 1:
            return True
        if self.role == "prefill" and req.get("prefill_dp") is not None:
            return req["prefill_dp"] == self.dp
        if self.lbm == "follow_bootstrap_room":
            return req["room"] % self.dp_size == self.dp
        assert self.lbm == "round_robin", self.lbm  # its counter counts the requests it dispatched itself
        own = [r for r in self.cfg["requests"][:index] if self.role == "decode" or r.get("prefill_dp") is None]
        return len(own) % self.dp_size == self.dp

    def requests(self):
        reqs = [dict(r) for i, r in enumerate(self.cfg["requests"]) if self.mine(i, r)]
        self.out["served"] = [r["room"] for r in reqs]
        return reqs

    # -- helpers ---------------------------------------------------------------------------------------
    def faults(self, room):
        return self.cfg["faults"].get(self.name, {}).get(str(room), [])

    def alloc(self, req):
        n = req["pages"]
        req["kv_pages"], self.free_pages = self.free_pages[:n], self.free_pages[n:]
        req["aux_row"] = self.free_aux.pop(0)
        req["state_row"] = self.free_state.pop(0) if self.state is not None else None

    def budget(self):
        """Pages, aux rows and state rows every rank of the attention TP group can still allocate
        (a collective: every rank calls it once a step). SGLang takes a request off its queue only
        when memory allows (decode.py DecodePreallocQueue.pop_preallocated: allocatable tokens and
        req_to_token slots; prefill.py PrefillBootstrapQueue: a free metadata buffer index), alike on
        every rank of the group; a deferred release may leave ranks with different free counts."""
        big = 1 << 30
        return self.group.min([len(self.free_pages), len(self.free_aux),
                               len(self.free_state) if self.state is not None else big])

    @staticmethod
    def fits(budget, req):
        """Takes the request's pages and rows off `budget` if it fits; else it waits in its queue."""
        if budget[0] < req["pages"] or budget[1] < 1 or budget[2] < 1:
            return False
        budget[0], budget[1], budget[2] = budget[0] - req["pages"], budget[1] - 1, budget[2] - 1
        return True

    def free(self, req, obj, how):
        safe = obj.release_safe()
        self.out["frees"].append({"room": req["room"], "release_safe": safe, "how": how})
        for p in req.get("kv_pages", []):
            for b in self.kv:
                b[p] = 0
        self.free_pages += req.get("kv_pages", [])
        if req.get("aux_row") is not None:
            self.aux[req["aux_row"]] = 0
            self.aux_room[req["aux_row"]] = 0
            self.free_aux.append(req["aux_row"])
        if req.get("state_row") is not None:
            self.state[req["state_row"]] = 0
            self.free_state.append(req["state_row"])
        req["kv_pages"], req["aux_row"], req["state_row"] = [], None, None

    def fail_log(self, req, obj, what, local_level):
        msg = f"{what} failed for request rank={self.engine_tp} bootstrap_room={req['room']}"
        exc = None
        try:
            obj.failure_exception()
        except Exception as e:  # noqa: BLE001 (SGLang catches everything here)
            exc = e
            msg += f" with exception {e}"
        level = logging.DEBUG if getattr(exc, "is_from_another_rank", False) else local_level
        self.log.log(level, msg, extra={"room": req["room"]})
        self.out["rooms"][str(req["room"])] = {
            "state": "Failed", "code": getattr(exc, "code", None), "origin": getattr(exc, "origin", None),
            "is_from_another_rank": getattr(exc, "is_from_another_rank", None),
            "bootstrap_room": getattr(exc, "bootstrap_room", None), "type": type(exc).__name__,
            "reason": getattr(exc, "failure_reason", None)}

    # -- prefill -----------------------------------------------------------------------------------------
    def prefill_run(self):
        ks, reqs = self.ks, self.requests()
        pending, bootstrap, running, inflight = list(reqs), [], [], []
        deadline = time.monotonic() + self.cfg["timeout_s"]
        step = 0
        while pending or bootstrap or running or inflight:
            assert time.monotonic() < deadline, "prefill: rooms never concluded: " + repr(
                [(r["room"], int(r["obj"].poll())) for r in bootstrap + running + inflight])
            for req in [r for r in pending if r["arrive"] <= step]:
                pending.remove(req)
                req["obj"] = ks.KVSender(self.mgr, self.addr, req["room"], [self.tp], 0,
                                         req_has_disagg_prefill_dp_rank=req.get("prefill_dp") is not None)
                for f in self.faults(req["room"]):
                    if f == "write_failure":
                        self.mgr._mgr.inject_write_failure(req["room"], "transfer_error", "injected write failure")
                    elif f == "hold":
                        self.mgr._mgr.hold_writes(req["room"])
                        req["held"] = True
                bootstrap.append(req)
            polls = self.group.min([r["obj"].poll() for r in bootstrap])
            budget = self.budget()
            for req, p in list(zip(bootstrap, polls)):
                if p == ks.KVPoll.Failed:
                    self.fail_log(req, req["obj"], "Prefill bootstrap", logging.WARNING)
                    self.free(req, req["obj"], "bootstrap_failure")
                    bootstrap.remove(req)
                elif p == ks.KVPoll.WaitingForInput and self.fits(budget, req):
                    assert req["obj"].pop_decode_prefix_len() == 0
                    self.alloc(req)
                    req["obj"].init(req["pages"], req["aux_row"])
                    self.fill(req)
                    req["chunks"] = list(req["chunks"])
                    bootstrap.remove(req)
                    running.append(req)
            for req in list(running):
                n = req["chunks"].pop(0)
                last = not req["chunks"]
                sent = req.setdefault("sent", 0)
                pages = req["kv_pages"][sent:sent + n]
                req["sent"] = sent + n
                state = ([np.array([req["state_row"]], np.int32)] if self.state is not None else []) if last else None
                if req["obj"].should_send_kv_chunk(len(pages), last):
                    req["obj"].send(np.array(pages, np.int32), state, num_kv_tokens=n * PAGE)
                if last:
                    running.remove(req)
                    inflight.append(req)
                    if req.get("held"):
                        self.mark("held", req["room"])
            for req in inflight:  # a held room's writes go out once it failed here and decode deferred it
                if (req.get("held") and req["obj"]._room.poll() == ks.KVPoll.Failed and
                        self.marked("deferred", req["room"])):
                    self.mgr._mgr.release_held_writes(req["room"])
                    req["held"] = False
            polls = self.group.min([r["obj"].poll() for r in inflight])
            for req, p in list(zip(inflight, polls)):
                if p == ks.KVPoll.Success:
                    self.out["rooms"][str(req["room"])] = {"state": "Success"}
                    # SGLang's order (scheduler, process_disagg_prefill_inflight_queue): clear() at
                    # Success, get_transfer_metric() after it for the done requests.
                    req["obj"].clear()
                    self.out["latency_s"][str(req["room"])] = req["obj"].get_transfer_metric().transfer_latency_s
                    self.free(req, req["obj"], "success")
                    inflight.remove(req)
                elif p == ks.KVPoll.Failed:
                    if req.get("held"):
                        self.mgr._mgr.release_held_writes(req["room"])
                    self.fail_log(req, req["obj"], "Prefill transfer", logging.WARNING)
                    req["obj"].clear()
                    self.free(req, req["obj"], "transfer_failure")
                    inflight.remove(req)
            step += 1
            time.sleep(STEP_S)

    # Events between the ranks' processes: a file per event in the run's events directory.
    def mark(self, what, room):
        open(os.path.join(self.cfg["events_dir"], f"{what}_{room}"), "w").close()

    def held_somewhere(self, room):
        return any("hold" in per.get(str(room), []) for rank, per in self.cfg["faults"].items()
                   if rank.startswith("prefill/"))

    def marked(self, what, room):
        return os.path.exists(os.path.join(self.cfg["events_dir"], f"{what}_{room}"))

    def fill(self, req):
        g = room_content(req["room"], req["pages"], self.total_heads, self.tensors)
        for b, buf in enumerate(self.kv):
            for i, p in enumerate(req["kv_pages"]):
                buf[p] = g[b, i, :, self.first_head:self.first_head + self.heads, :].reshape(-1)
        self.aux[req["aux_row"]] = aux_content(req["room"])
        self.aux_room[req["aux_row"], 0] = req["room"]
        if self.state is not None:
            self.state[req["state_row"]] = state_content(req["room"])

    # -- decode ------------------------------------------------------------------------------------------
    def decode_run(self):
        ks, reqs = self.ks, self.requests()
        pending, prealloc, transfer, deferred = list(reqs), [], [], []
        deadline = time.monotonic() + self.cfg["timeout_s"]
        step = 0
        while pending or prealloc or transfer or deferred:
            assert time.monotonic() < deadline, "decode: rooms never concluded: " + repr(
                [(r["room"], int(r["obj"].poll())) for r in prealloc + transfer + deferred])
            for req in [r for r in pending if r["arrive"] <= step]:
                pending.remove(req)
                req["obj"] = ks.KVReceiver(self.mgr, self.addr, req["room"])
                req["init"] = False
                prealloc.append(req)
            self.resolve_prefill_dp(prealloc)
            polls = self.group.min([r["obj"].poll() if r["init"] else ks.KVPoll.Bootstrapping for r in prealloc])
            budget = self.budget()
            for req, p in list(zip(prealloc, polls)):
                if p == ks.KVPoll.Failed:
                    self.fail_log(req, req["obj"], "Decode handshake", logging.ERROR)
                    self.free(req, req["obj"], "handshake_failure")
                    prealloc.remove(req)
                elif p == ks.KVPoll.WaitingForInput and self.fits(budget, req):
                    self.alloc(req)
                    state = [np.array([req["state_row"]], np.int32)] if self.state is not None else []
                    req["t_meta"] = time.perf_counter()
                    req["obj"].send_metadata(np.array(req["kv_pages"], np.int32), req["aux_row"], state,
                                             decode_prefix_len=0)
                    prealloc.remove(req)
                    transfer.append(req)
            for req in transfer:  # the abort, once the held prefill writes are in flight
                if ("abort" in self.faults(req["room"]) and not req.get("aborted") and
                        (not self.held_somewhere(req["room"]) or self.marked("held", req["room"]))):
                    req["obj"].abort()
                    req["aborted"] = True
            raw = []
            for req in transfer:
                p = req["obj"].poll()
                if p == ks.KVPoll.Success and int(self.aux_room[req["aux_row"], 0]) == 0:
                    p = ks.KVPoll.Transferring  # SGLang's metadata gate
                if p == ks.KVPoll.Success and "t_done" not in req:
                    req["t_done"] = time.perf_counter()
                raw.append(p)
            polls = self.group.min(raw)
            for req, p in list(zip(transfer, polls)):
                if p == ks.KVPoll.Success:
                    self.out["rooms"][str(req["room"])] = {"state": "Success"}
                    self.out["bytes_ok"][str(req["room"])] = self.check(req)
                    self.out["overhead_ms"][str(req["room"])] = (req["t_done"] - req["t_meta"]) * 1e3
                    req["obj"].clear()
                    self.free(req, req["obj"], "success")
                    transfer.remove(req)
                elif p == ks.KVPoll.Failed:
                    self.fail_log(req, req["obj"], "Decode transfer", logging.ERROR)
                    transfer.remove(req)
                    if req["obj"].abort_notified:
                        self.mark("deferred", req["room"])
                        deferred.append(req)
                    else:
                        req["obj"].clear()
                        self.free(req, req["obj"], "transfer_failure")
            for req in list(deferred):
                if self.mgr.is_abort_release_safe(req["room"], len(req["obj"].bootstrap_infos)):
                    self.mgr.clear_deferred_abort_state(req["room"])
                    self.free(req, req["obj"], "deferred")
                    req["obj"].clear()
                    deferred.remove(req)
            step += 1
            time.sleep(STEP_S)

    def resolve_prefill_dp(self, prealloc):
        """SGLang's pending queue: parallel info, the room's prefill DP rank, then
        init(prefill_dp_rank) (decode.py _resolve_prefill_dp_rank, _resolve_pending_reqs)."""
        waiting = [r for r in prealloc if not r["init"]]
        if not waiting or not self.mgr.try_ensure_parallel_info(self.addr):
            return
        info = self.mgr.prefill_info_table[self.addr]
        resolved, need_query = [], []
        for req in waiting:
            if req.get("prefill_dp") is not None:
                resolved.append((req, req["prefill_dp"]))
            elif info.dp_size == 1:
                resolved.append((req, 0))
            elif info.follow_bootstrap_room:
                resolved.append((req, req["room"] % info.dp_size))
            else:
                need_query.append(req)
        if need_query:
            got = self.ks.KVReceiver.query_prefill_dp_ranks(self.addr, [r["room"] for r in need_query])
            resolved += [(r, int(got[str(r["room"])])) for r in need_query if str(r["room"]) in got]
        for req, dp in resolved:
            self.out["prefill_dp"][str(req["room"])] = dp
            req["obj"].init(dp)
            req["init"] = True

    def check(self, req):
        g = room_content(req["room"], req["pages"], self.total_heads, self.tensors)
        kv = all(np.array_equal(buf[p], g[b, i, :, self.first_head:self.first_head + self.heads, :].reshape(-1))
                 for b, buf in enumerate(self.kv) for i, p in enumerate(req["kv_pages"]))
        aux = (np.array_equal(self.aux[req["aux_row"]], aux_content(req["room"])) and
               int(self.aux_room[req["aux_row"], 0]) == req["room"])
        state = self.state is None or np.array_equal(self.state[req["state_row"]], state_content(req["room"]))
        return {"kv": bool(kv), "aux": bool(aux), "state": bool(state)}


def enter_netns(name):
    """Moves this process (its only thread, before any socket exists) into network namespace `name`
    (/var/run/netns/NAME, made by tests/hosts/hosts.sh): the rank then runs on that test host, as
    `ip netns exec` would start it. Threads started later inherit it."""
    import ctypes
    clone_newnet = 0x40000000
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, clone_newnet) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
    finally:
        os.close(fd)


def bootstrap_main(netns, host, ports):
    """The prefill engine's bootstrap service on a test host; its port goes to `ports`, then it
    serves until the process is killed."""
    enter_netns(netns)
    import kvferry.sglang as ks
    server = ks.KVBootstrapServer(host, 0)
    ports.put(server.port)
    while True:
        time.sleep(1)


def main(cfg, barrier, arr, width, results, all_done):
    if cfg.get("netns"):
        enter_netns(cfg["netns"])
    os.environ.update(cfg["env"])
    os.environ["KVFERRY_FAULT_INJECTION"] = "1"  # the harness injects write failures and holds writes
    records = Records()
    root = logging.getLogger()
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    rank = None
    try:
        attn_tp, attn_tp_rank, _ = place(cfg)  # the MIN is over the attention TP group
        rank = Rank(cfg, Group(attn_tp_rank, attn_tp, barrier, arr, width), records)
        rank.prefill_run() if cfg["role"] == "prefill" else rank.decode_run()
        import kvferry
        kvferry.flush_logs()
        done = len(records.items)  # what follows is teardown (a peer closing first may be noticed)
        all_done.wait()  # every rank of both engines is done before any closes
        rank.mgr.close()
        kvferry.flush_logs()
        results.put({"rank": rank.name, "ok": True, **rank.out, "records": records.items,
                     "work_records": done})
    except BaseException as e:  # noqa: BLE001 (reported to the test)
        import traceback
        barrier.abort()
        all_done.abort()
        results.put({"rank": rank_name(cfg["role"], *place(cfg)[1:]), "ok": False, "error": traceback.format_exc(),
                     "records": records.items, "exc": repr(e)})
