"""kvferry's vLLM connector in fake-vLLM engines inside one process (vllm_inproc.py): several
requests in one step, preemption, duplicate rooms, a quarantined room's abort. Each test waits for
events with a deadline (run_until), never for a wall-clock window.
"""
import logging
import os
import sys
import types

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "fake_vllm"))

import vllm_inproc as H  # noqa: E402
from kvferry.vllm.metadata import EndSpec, RecvSpec  # noqa: E402
from kvferry.vllm.params import manager_key  # noqa: E402
from kvferry.vllm.worker import _Recv  # noqa: E402
from kvferry.engine_id import derive  # noqa: E402


@pytest.fixture
def engines():
    made = []

    def make(*a, **kw):
        e = H.Engine(*a, **kw)
        made.append(e)
        return e
    yield make
    for e in made:
        e.w.shutdown()


def failed(e) -> int:
    st = e.last[1].kv_connector_stats
    return st.data["failed"] if st is not None else 0


def load_all(P, D, prompts, params):
    """Adds every decode request, steps until each runs; returns (their bad KV positions, failures)."""
    for rid, pr in prompts.items():
        D.add("d" + rid, pr, 2, dict(params[rid]))
    loaded, nfailed = {}, [0]

    def cond():
        nfailed[0] += failed(D) + failed(P)
        for rid, r in D.reqs.items():
            if rid not in loaded and r.status == H.RequestStatus.RUNNING:
                loaded[rid] = sorted({p for p, _, _ in D.check(rid, len(r.prompt_token_ids))})
        return len(loaded) == len(D.reqs)
    assert H.run_until([P, D], cond), f"{len(loaded)} of {len(D.reqs)} decode requests loaded"
    return loaded, nfailed[0]


def test_many_rooms_at_once_each_with_its_own_aux_row(engines):
    """Finding 1 (issue 33): 24 rooms in flight at once, one per aux row on each side: every byte
    exact, no room failed (they shared aux row 0 before: all but one failed the guard check)."""
    n = 24
    port = H.free_port()
    P, D = engines("kv_producer", port, blocks=n * 4 + 8), engines("kv_consumer", blocks=n * 4 + 8)
    lens = [1, 15, 16, 17, 33, 48]
    prompts = {f"r{i}": [((i * 37 + j) % 250) + 1 for j in range(lens[i % len(lens)])] for i in range(n)}
    for rid, pr in prompts.items():
        P.add(rid, pr, 1, {"do_remote_decode": True})
    assert H.run_until([P], lambda: len(P.outputs) == n)
    params = {o["request_id"]: o["kv_transfer_params"] for o in P.outputs}
    loaded, nfailed = load_all(P, D, prompts, params)
    assert nfailed == 0
    assert {rid: b for rid, b in loaded.items() if b} == {}
    assert H.run_until([P, D], lambda: not P.sched.requests)  # every prefill block freed
    # every row is free again once vLLM freed the blocks
    assert not P.sched.connector._scheduler._aux_of


def test_aux_rows_run_out_decode_waits(engines):
    """With 2 aux rows per manager, 5 rooms at once: decode asks again later for the ones without
    a row, prefill offers decode only rooms it has a row for; every loaded byte exact."""
    port = H.free_port()
    P = engines("kv_producer", port, blocks=40, extra={"kvferry_aux_rows": 8})
    D = engines("kv_consumer", blocks=40, extra={"kvferry_aux_rows": 2})
    prompts = {f"r{i}": [i + 1] * 20 for i in range(5)}
    for rid, pr in prompts.items():
        P.add(rid, pr, 1, {"do_remote_decode": True})
    assert H.run_until([P], lambda: len(P.outputs) == 5)
    params = {o["request_id"]: o["kv_transfer_params"] for o in P.outputs}
    loaded, nfailed = load_all(P, D, prompts, params)
    assert nfailed == 0 and all(not b for b in loaded.values())


def test_preempted_prefill_sends_its_final_blocks(engines):
    """Finding 2: a prefill request preempted after its first step (its layer-wise room held the
    first allocation's blocks) is recomputed in other blocks; its old room ends, decode gets the
    final blocks' KV, byte-exact, while another request owns the old blocks."""
    port = H.free_port()
    P, D = engines("kv_producer", port, blocks=8), engines("kv_consumer")
    prompt = list(range(1, 41))
    P.add("p1", prompt, 3, {"do_remote_decode": True})
    P.step()
    first = P.sched.kv_cache_manager.get_block_ids("p1")[0]
    P.sched.preempt("p1")
    P.step()
    final = P.sched.kv_cache_manager.get_block_ids("p1")[0]
    assert set(first) != set(final)
    P.add("x", [200 + i for i in range(40)], 5)  # takes some of p1's first blocks
    P.step()
    assert set(P.sched.kv_cache_manager.get_block_ids("x")[0]) & set(first)
    assert H.run_until([P], lambda: any(o["request_id"] == "p1" for o in P.outputs))
    params = next(o for o in P.outputs if o["request_id"] == "p1")["kv_transfer_params"]
    assert params["remote_block_ids"] == final
    loaded, _ = load_all(P, D, {"p1": prompt}, {"p1": params})
    assert loaded["dp1"] == []


def test_a_refused_room_is_never_offered_to_decode(engines, caplog):
    """Finding 3 and 15: a second request naming a room another request holds gets no
    kv_transfer_params (vLLM frees its blocks), the warning is logged once; the first loads."""
    port = H.free_port()
    P, D = engines("kv_producer", port), engines("kv_consumer")
    a, b = [5] * 20, [9] * 20
    caplog.set_level(logging.WARNING, logger="kvferry.vllm")
    P.add("a", a, 1, {"do_remote_decode": True, "kvferry_room": 4242})
    P.add("b", b, 1, {"do_remote_decode": True, "kvferry_room": 4242})
    assert H.run_until([P], lambda: len(P.outputs) == 2)
    out = {o["request_id"]: o["kv_transfer_params"] for o in P.outputs}
    assert out["b"] is None and out["a"]["kvferry_room"] == 4242
    assert len([r for r in caplog.records if "4242" in r.getMessage()]) == 1
    loaded, nfailed = load_all(P, D, {"a": a}, {"a": out["a"]})
    assert loaded["da"] == [] and nfailed == 0
    assert H.run_until([P], lambda: not P.sched.requests)
    P.add("c", a, 1, {"do_remote_decode": True, "kvferry_room": 4242})  # a room that ended: refused too
    assert H.run_until([P], lambda: len(P.outputs) == 3)
    assert P.outputs[-1]["request_id"] == "c" and P.outputs[-1]["kv_transfer_params"] is None


def test_abort_of_a_quarantined_request_waits_for_reclaim():
    """Finding 4: a request whose room was released quarantined and is then aborted opens no new
    receiver and is not reported until kvferry reclaims the room; then once."""
    from kvferry.vllm.config import settings_of
    vc = H.cfg("kv_consumer")
    w = H.KvferryConnector(vc, H.KVConnectorRole.WORKER, None)._worker
    w.register_kv_caches({f"model.layers.{i}.attn": np.zeros((2, 8, H.BS, H.H, H.D), np.uint8) for i in range(H.L)})
    spec = RecvSpec(77, "127.0.0.1:1", [0, 1], 20, 1, 0)
    key = manager_key(spec.bootstrap)
    w._quarantined[(key, 77)] = _Recv(spec, types.SimpleNamespace(), "d1", True, False)
    w._end("d1", EndSpec(77, spec.bootstrap, "aborted", "client abort", True, 1))
    assert not w._recvs and not w.decode  # no receiver, no manager for that prefill
    assert w.get_finished(set()) == (None, None)
    w.decode[key] = types.SimpleNamespace(take_reclaimed_rooms=lambda: [77], close=lambda: None)
    assert w.get_finished(set()) == (None, {"d1"})
    w.decode[key] = types.SimpleNamespace(take_reclaimed_rooms=lambda: [77], close=lambda: None)
    assert w.get_finished(set()) == (None, None)
    w.shutdown()
    assert settings_of(vc).aux_rows == 4096


def test_a_wrong_tp_size_or_another_name_does_not_break_the_prefill(engines, monkeypatch):
    """Findings 7 and 11: a request naming a wrong tp_size for a TP-1 prefill fails alone: first
    (the handshake refuses it; the manager it made is closed) or later (refused: the manager's TP
    size differs), and other requests to that prefill load; the prefill named localhost:P and
    127.0.0.1:P is one instance (one manager). Every loaded byte exact."""
    monkeypatch.setenv("KVFERRY_LOOKUP_TIMEOUT_MS", "1500")
    port = H.free_port()
    P, D = engines("kv_producer", port), engines("kv_consumer")
    prompts = {f"r{i}": [i + 3] * 20 for i in range(4)}

    def prefill(rid, tp=None, addr=None):
        P.add(rid, prompts[rid], 1, {"do_remote_decode": True})
        assert H.run_until([P], lambda: any(o["request_id"] == rid for o in P.outputs))
        p = dict(next(o for o in P.outputs if o["request_id"] == rid)["kv_transfer_params"])
        p.update({k: v for k, v in (("tp_size", tp), ("kvferry_bootstrap", addr)) if v is not None})
        return p

    def decode(rid, p):
        D.add("d" + rid, prompts[rid], 2, p)
        assert H.run_until([P, D], lambda: D.reqs["d" + rid].status == H.RequestStatus.RUNNING)
        return sorted({x for x, _, _ in D.check("d" + rid, 20)}), failed(D)

    decode("r0", prefill("r0", tp=2))  # refused at the handshake, recomputed on decode
    assert D.w._worker.decode == {}
    assert decode("r1", prefill("r1")) == ([], 0)
    decode("r2", prefill("r2", tp=2))  # refused: the manager serves a TP-1 prefill
    assert decode("r3", prefill("r3", addr=f"localhost:{port}")) == ([], 0)
    assert sorted(D.w._worker.decode) == [f"127.0.0.1:{port}"]


def _failures(e, into):
    st = e.last[1].kv_connector_stats
    if st is not None:
        into += st.data["failures"]
    return into


def _params_naming(P, rid, prompt, addr):
    P.add(rid, prompt, 1, {"do_remote_decode": True})
    assert H.run_until([P], lambda: any(o["request_id"] == rid for o in P.outputs))
    p = dict(next(o for o in P.outputs if o["request_id"] == rid)["kv_transfer_params"])
    if addr:
        p["kvferry_bootstrap"] = addr
    return p


def test_an_unreachable_prefill_never_blocks_the_decode_step(engines, monkeypatch):
    """Finding 5 (issue 33): a request naming a prefill address where nothing answers waits
    (WAITING_FOR_REMOTE_KVS) while kvferry's lookup runs off vLLM's step: a request of a live
    prefill added after it loads meanwhile, byte-exact; the first then fails through vLLM's path
    (load errors, get_finished: recomputed) with kvferry's bootstrap_timeout, origin decode."""
    monkeypatch.setenv("KVFERRY_LOOKUP_TIMEOUT_MS", "10000")
    port = H.free_port()
    P, D = engines("kv_producer", port), engines("kv_consumer")
    bad, good = [7] * 20, [8] * 20
    D.add("dbad", bad, 2, _params_naming(P, "bad", bad, f"127.0.0.1:{H.free_port()}"))  # nothing listens
    fails = []
    D.step()
    _failures(D, fails)
    D.add("dgood", good, 2, _params_naming(P, "good", good, None))
    assert H.run_until([P, D], lambda: _failures(D, fails) is not None and
                       D.reqs["dgood"].status == H.RequestStatus.RUNNING)
    # the event order: the live prefill's request loaded while the other one still waited
    assert D.reqs["dbad"].status == H.RequestStatus.WAITING_FOR_REMOTE_KVS and fails == []
    assert D.check("dgood", 20) == []
    assert H.run_until([P, D], lambda: _failures(D, fails) is not None and
                       D.reqs["dbad"].status != H.RequestStatus.WAITING_FOR_REMOTE_KVS)
    assert [(f["request_id"], f["code"], f["origin"]) for f in fails] == [("dbad", "bootstrap_timeout", f"decode{derive('kv_consumer')}/tp0")]
    assert D.reqs["dbad"].status == H.RequestStatus.RUNNING  # recomputed on decode (policy recompute)
    assert list(D.w._worker.decode) == [f"127.0.0.1:{port}"]  # the failed instance is forgotten


@pytest.mark.parametrize("status", [401, 403])
def test_a_wrong_secret_fails_at_once_not_as_a_timeout(engines, monkeypatch, status):
    """Finding 5 (issue 33): a bootstrap service that refuses decode's request MAC (401/403: another
    cluster secret) fails the room at once, not after KVFERRY_LOOKUP_TIMEOUT_MS as
    bootstrap_timeout: kvferry's invalid_argument naming the refusal, through vLLM's path."""
    import http.server
    import threading

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()
        do_PUT = do_POST = do_GET

        def log_message(self, *a):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("KVFERRY_LOOKUP_TIMEOUT_MS", "20000")
    try:
        port = H.free_port()
        P, D = engines("kv_producer", port), engines("kv_consumer")
        prompt = [9] * 20
        D.add("d1", prompt, 2, _params_naming(P, "r1", prompt, f"127.0.0.1:{srv.server_address[1]}"))
        fails = []
        assert H.run_until([D], lambda: _failures(D, fails) is not None and
                           D.reqs["d1"].status != H.RequestStatus.WAITING_FOR_REMOTE_KVS)
        assert [(f["request_id"], f["code"]) for f in fails] == [("d1", "invalid_argument")]
        assert f"not authorized (HTTP {status}" in fails[0]["reason"]
        assert D.reqs["d1"].status == H.RequestStatus.RUNNING  # recomputed on decode
    finally:
        srv.shutdown()


def test_a_reused_request_id_loads_again(engines):
    """Attack on issue 33, finding 5: a decode request id used a second time (older vLLM does not
    suffix its request ids) loads its KV like any request; it was never reported finished_recving
    again (the id was among those already reported), so it waited for ever with its blocks pinned."""
    port = H.free_port()
    P, D = engines("kv_producer", port), engines("kv_consumer")
    prompts = {"r0": [(j * 7) % 250 + 1 for j in range(17)], "r1": [(j * 11) % 250 + 1 for j in range(33)]}
    for rid, pr in prompts.items():
        P.add(rid, pr, 1, {"do_remote_decode": True})
    assert H.run_until([P], lambda: len(P.outputs) == 2)
    params = {o["request_id"]: o["kv_transfer_params"] for o in P.outputs}
    for rid in ("r0", "r1"):
        D.add("same", prompts[rid], 2, dict(params[rid]))
        bad = []

        def running():
            r = D.reqs["same"]
            if r.status == H.RequestStatus.RUNNING:
                bad.append(D.check("same", len(r.prompt_token_ids)))
                return True
            return False
        assert H.run_until([P, D], running), f"{rid}'s KV never loaded under the reused request id"
        assert bad == [[]]
        assert H.run_until([P, D], lambda: "same" not in D.sched.requests)


def test_finished_requests_kvferry_never_held_are_not_kept(engines):
    """Issue 33 attack F8: vLLM names every finished request in get_finished(finished_req_ids),
    most of them never kvferry's; the worker kept each name for good. Now it keeps only requests
    it still holds a room for: after 200 plain requests and one kvferry request on prefill, nothing."""
    port = H.free_port()
    P, D = engines("kv_producer", port), engines("kv_consumer")
    for i in range(200):
        P.add(f"plain{i}", [i % 250 + 1] * 3, 1)
    assert H.run_until([P], lambda: len(P.outputs) == 200)
    prompt = [7] * 20
    P.add("k", prompt, 1, {"do_remote_decode": True})
    assert H.run_until([P], lambda: len(P.outputs) == 201)
    loaded, nfailed = load_all(P, D, {"k": prompt}, {"k": P.outputs[-1]["kv_transfer_params"]})
    assert loaded["dk"] == [] and nfailed == 0
    assert H.run_until([P, D], lambda: not P.sched.requests)  # "k" reported and freed
    assert P.w._worker._finished == set() and D.w._worker._finished == set()
