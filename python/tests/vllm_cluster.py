"""A prefill and a decode engine of the fake vLLM (vllm_engine.py), each a scheduler process plus a
worker process per TP rank, and the proxy's two-step request flow between them
(tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in vLLM: the request goes to prefill
with kv_transfer_params {"do_remote_decode": True, ...} and max_tokens 1; the kv_transfer_params of
prefill's output go with the same request to decode). Waits are on events the engines report
(outputs, finished transfers, held writes, free blocks), each with a deadline.
"""
import glob
import json
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import time

import vllm_engine as E

DEADLINE_S = 90
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, prefill_tp=1, decode_tp=1, *, mla=False, faults=None, extra=None, env=None, policy="recompute",
                 decode_block_size=None, factory_rule="module_path_first", layer_ms=0):
        self.log_dir = tempfile.mkdtemp(prefix="kvf-vllm-")
        port = free_port()
        base_env = {"KVFERRY_FAULT_INJECTION": "1", "KVFERRY_TRANSPORT": "tcp", "KVFERRY_LOOKUP_TIMEOUT_MS": "30000",
                    "KVFERRY_HEARTBEAT_TIMEOUT_MS": "10000", **(env or {})}
        common = {"mla": mla, "faults": faults or {}, "log_dir": self.log_dir, "env": base_env, "policy": policy,
                  "factory_rule": factory_rule, "layer_ms": layer_ms}
        self.cfg = {
            "prefill": {**common, "role": "prefill", "kv_role": "kv_producer", "tp": prefill_tp,
                        "extra": {"kvferry_bootstrap_port": port, "kvferry_decode_tp_size": decode_tp, **(extra or {})}},
            "decode": {**common, "role": "decode", "kv_role": "kv_consumer", "tp": decode_tp,
                       "block_size": decode_block_size or 4, "extra": dict(extra or {})}}
        ctx = mp.get_context("spawn")
        self.q = {r: (ctx.Queue(), ctx.Queue()) for r in self.cfg}
        self.procs, self.pids = {}, {}
        self.events = {r: [] for r in self.cfg}
        for role in ("prefill", "decode"):  # prefill first: its TP rank 0 runs the bootstrap service
            p = ctx.Process(target=E.engine_main, args=(self.cfg[role], *self.q[role]))
            p.start()
            self.procs[role] = p
            ev = self.wait(role, lambda e: e[0] in ("ready", "error"))
            assert ev[0] == "ready", ev
            self.pids[role] = ev[2]

    def send(self, role, *cmd):
        self.q[role][0].put(cmd)

    def _drain(self, role, timeout):
        try:
            self.events[role].append(self.q[role][1].get(timeout=timeout))
        except queue.Empty:
            pass

    def wait(self, role, pred, deadline_s=DEADLINE_S, what=""):
        """The first event of `role` (past or future) matching pred, within the deadline."""
        end = time.monotonic() + deadline_s
        seen = 0
        while True:
            for e in self.events[role][seen:]:
                if pred(e):
                    return e
            seen = len(self.events[role])
            p = self.procs.get(role)
            if p is not None and not p.is_alive() and self.q[role][1].empty():
                raise AssertionError(f"{role}: the engine exited (code {p.exitcode}) before {what or pred}; "
                                     f"events: {self.events[role][-20:]}")
            if time.monotonic() > end:
                raise AssertionError(f"{role}: no event {what or pred} within {deadline_s} s; events: "
                                     f"{self.events[role][-20:]}")
            self._drain(role, 0.05)

    def add(self, role, rid, prompt, max_tokens, params):
        self.send(role, "add", rid, list(prompt), max_tokens, dict(params) if params is not None else None)

    def output(self, role, rid, deadline_s=DEADLINE_S):
        return self.wait(role, lambda e: e[0] == "output" and e[1]["request_id"] == rid, deadline_s,
                         f"output of {rid}")[1]

    def prefill(self, n, prompt, params=None):
        """Step 1 of the proxy: the request on prefill (max_tokens 1); its kv_transfer_params."""
        self.add("prefill", f"p-{n}", prompt, 1, {**PREFILL_PARAMS, **(params or {})})
        return self.output("prefill", f"p-{n}")["kv_transfer_params"]

    def request(self, n, prompt, max_tokens=3, params=None):
        """Both steps of the proxy: prefill, then decode with prefill's kv_transfer_params."""
        kvp = self.prefill(n, prompt, params)
        assert kvp and kvp["do_remote_prefill"] is True, kvp
        self.add("decode", f"d-{n}", prompt, max_tokens, kvp)
        return kvp, self.output("decode", f"d-{n}")

    def kv(self, role, pred, deadline_s=DEADLINE_S, what=""):
        return self.wait(role, lambda e: e[0] == "kv" and pred(e[1]), deadline_s, what)[1]

    def checks(self, rid):
        return [e[2] for e in self.events["decode"] if e[0] == "check" and e[1] == rid]

    def free_blocks(self, role):
        """The engine's free blocks now (after every event so far)."""
        self._drain(role, 0.0)
        f = [e[1] for e in self.events[role] if e[0] == "free_blocks"]
        return f[-1] if f else None

    def kill(self, role):
        for pid in self.pids[role]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.procs[role].join(timeout=10)
        self.procs.pop(role)

    def records(self):
        out = []
        for path in glob.glob(os.path.join(self.log_dir, "*.jsonl")):
            with open(path) as f:
                out += [json.loads(line) for line in f if line.strip()]
        return out

    def lines_above_debug(self, room=None, prefix="kvferry"):
        return [r for r in self.records() if r["level"] > 10 and r["name"].startswith(prefix)
                and (room is None or r["room"] == room)]

    def stop(self):
        for role, p in list(self.procs.items()):
            self.send(role, "stop")
        for role, p in list(self.procs.items()):
            try:
                self.wait(role, lambda e: e[0] == "stopped", 30)
            except AssertionError:
                pass
            p.join(timeout=10)
            if p.is_alive():
                self.kill(role)


def expected_tokens(prompt, max_tokens):
    return [E.token_at(prompt[0], len(prompt) + i) for i in range(max_tokens)]


def expected_bytes(prompt_len, decode_tp, mla=False):
    """Bytes of remote KV one decode rank checks for a request (every token but the last)."""
    heads = 1 if mla else E.HEADS // decode_tp
    return E.LAYERS * (1 if mla else 2) * (prompt_len - 1) * heads * E.HEAD_SIZE * 2
