"""kvferry's vLLM connector in engines of the fake vLLM (vllm_engine.py, vllm_cluster.py): a
prefill and a decode engine, each a scheduler process plus one worker process per TP rank, over
the tcp transport on loopback, requests flowing as vLLM's proxy sends them (prefill first, then
decode with prefill's kv_transfer_params). The calls follow vLLM's scheduler
(vllm/v1/core/sched/scheduler.py) and worker (vllm/v1/worker/kv_connector_model_runner_mixin.py).

Every successful request: decode's tokens are the model's, and every byte of the remote KV (each
layer, K and V or the MLA latent, each token but the last, this rank's heads) is checked on every
decode rank before its first forward; both engines get all their blocks back. Every failure: the
request takes vLLM's kv_load_failure_policy on decode, prefill frees its blocks, every rank names
the same origin and code, and kvferry logs exactly one line above debug for it, on its origin.
"""
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import vllm_cluster as C  # noqa: E402
import vllm_engine as E  # noqa: E402

PROMPTS = {n: [1000 + n] + list(range(n % 5 + 6)) for n in range(1, 40)}


@pytest.fixture
def cluster():
    made = []

    def make(*a, **kw):
        c = C.Cluster(*a, **kw)
        made.append(c)
        return c
    yield make
    for c in made:
        c.stop()


def check_success(c, n, out, decode_tp, max_tokens=3, mla=False):
    prompt = PROMPTS[n]
    assert out["token_ids"] == C.expected_tokens(prompt, max_tokens), out
    checks = c.checks(f"d-{n}")
    assert len(checks) == decode_tp, checks  # every decode rank checked its heads
    for chk in checks:
        assert chk == {"bytes": C.expected_bytes(len(prompt), decode_tp, mla), "bad": 0}, chk


def all_blocks_back(c):
    for role in ("prefill", "decode"):
        c.wait(role, lambda e: e[0] == "free_blocks" and e[1] == E.NUM_BLOCKS
               and c.free_blocks(role) == E.NUM_BLOCKS, what=f"{role}: every block free")


def failures(c, role, room):
    return [f for e in c.events[role] if e[0] == "kv" for f in e[1]["failures"] if f["room"] == room]


def one_line_at_origin(c, room, origin, code, level):
    """kvferry's lines above debug for the room: exactly one, on its origin, at `level`."""
    import kvferry  # noqa: F401  (records of the engines' processes are in their files)
    lines = c.lines_above_debug(room)
    assert len(lines) == 1, f"room {room}: {len(lines)} kvferry lines above debug: {lines}"
    assert lines[0]["proc"].replace("-", "/") == origin and lines[0]["level"] == level, lines[0]
    assert code in lines[0]["msg"] or lines[0]["code"] == code, lines[0]


@pytest.mark.parametrize("factory_rule", ["registry_first", "module_path_first"])
def test_one_prefill_one_decode(cluster, factory_rule):
    c = cluster(1, 1, factory_rule=factory_rule)
    for n in (1, 2, 3):
        kvp, out = c.request(n, PROMPTS[n])
        check_success(c, n, out, 1)
        assert kvp["kvferry_bootstrap"].startswith("127.0.0.1:") and kvp["tp_size"] == 1
    all_blocks_back(c)
    assert not c.lines_above_debug()


def test_two_prefill_two_decode_with_a_write_failure_and_an_abort(cluster):
    """2+2 as separate processes. Room 70001: every write of prefill/tp1 fails (kvferry's fault
    decorator): it fails on all four ranks with that origin; decode recomputes it (policy
    recompute). Room 70002: prefill's writes are held in flight when the client aborts the decode
    request: prefill is told at once, decode keeps the blocks until no write can land (vLLM frees
    them when get_finished reports the request)."""
    c = cluster(2, 2, faults={"prefill/tp1": {"write_failure": [70001]}, "prefill/tp0": {"hold": [70002]},
                              "prefill/tp1 ": {}})
    for n in (4, 5):
        _, out = c.request(n, PROMPTS[n])
        check_success(c, n, out, 2)
    # The write failure: the request is recomputed on decode (its tokens are still the model's).
    kvp, out = c.request(6, PROMPTS[6], params={"kvferry_room": 70001})
    assert kvp["kvferry_room"] == 70001
    assert out["token_ids"] == C.expected_tokens(PROMPTS[6], 3) and not c.checks("d-6")
    f_dec = failures(c, "decode", 70001)
    assert f_dec and all((f["code"], f["origin"], f["is_from_another_rank"]) ==
                         ("transfer_error", "prefill/tp1", True) for f in f_dec), f_dec
    one_line_at_origin(c, 70001, "prefill/tp1", "transfer_error", 30)
    # The abort on decode while prefill's writes are in flight.
    kvp = c.prefill(7, PROMPTS[7], params={"kvferry_room": 70002})
    c.add("decode", "d-7", PROMPTS[7], 3, kvp)
    c.wait("prefill", lambda e: e == ("held", 70002), what="writes of 70002 held in flight")
    c.send("decode", "abort", "d-7")
    c.kv("decode", lambda k: "d-7" in k["finished_recving"], what="d-7 reported once release-safe")
    c.kv("prefill", lambda k: "p-7" in k["finished_sending"], what="p-7's blocks freed on prefill")
    one_line_at_origin(c, 70002, "decode/tp0", "aborted", 20)
    all_blocks_back(c)


@pytest.mark.parametrize("prefill_tp,decode_tp,mla", [(2, 1, False), (1, 2, False), (2, 1, True)])
def test_unequal_tp_and_mla(cluster, prefill_tp, decode_tp, mla):
    c = cluster(prefill_tp, decode_tp, mla=mla)
    for n in (8, 9):
        _, out = c.request(n, PROMPTS[n])
        check_success(c, n, out, decode_tp, mla=mla)
    all_blocks_back(c)
    assert not c.lines_above_debug()


def test_layerwise_when_decode_is_ready_first(cluster):
    """A router that sends the request to decode first (with the room and prefill's bootstrap
    address it chose) and then to prefill: decode's metadata is there before prefill's forward
    pass (each layer's compute takes 100 ms here, kvferry applies decode's kept metadata to the new
    room within a few ms), so prefill sends the layers from save_kv_layer; the KV is whole all the same."""
    c = cluster(1, 1, layer_ms=100)
    c.request(10, PROMPTS[10])  # connects decode to prefill (the handshake) first
    prompt = PROMPTS[11]
    kvp = {"do_remote_prefill": True, "do_remote_decode": False, "kvferry_room": 70010, "tp_size": 1,
           "kvferry_bootstrap": f"127.0.0.1:{c.cfg['prefill']['extra']['kvferry_bootstrap_port']}",
           "kvferry_block_size": 4, "kvferry_num_tokens": len(prompt)}
    c.add("decode", "d-11", prompt, 3, kvp)
    time.sleep(0.5)  # lets decode's metadata reach prefill first (either order gives the same bytes)
    c.prefill(11, prompt, params={"kvferry_room": 70010})
    check_success(c, 11, c.output("decode", "d-11"), 1)
    c.kv("prefill", lambda k: k["layerwise"] == 1, what="room 70010 sent from save_kv_layer")
    all_blocks_back(c)


def test_prefill_abort_keeps_blocks_while_a_layerwise_write_is_held(cluster):
    """Issue 33 attack F9: decode waits first (as above), so prefill sends room 70021's layers from
    save_kv_layer; its writes stay held in flight (reading prefill's blocks) when the client aborts
    the prefill request (vLLM's Scheduler.finish_requests -> _free_request -> request_finished).
    The connector asks vLLM to keep the blocks (delay_free_blocks) and reports the request in
    get_finished only once kvferry says no write reads them (release_safe): while the writes are
    held the blocks are not free; once they are released, vLLM frees every block. Before the fix
    request_finished returned False for an aborted request and vLLM freed the blocks at once."""
    c = cluster(1, 1, layer_ms=100, faults={"prefill/tp0": {"hold_kept": [70021]}})
    c.request(10, PROMPTS[10])  # connects decode to prefill (the handshake) first
    all_blocks_back(c)
    prompt = PROMPTS[21]
    kvp = {"do_remote_prefill": True, "do_remote_decode": False, "kvferry_room": 70021, "tp_size": 1,
           "kvferry_bootstrap": f"127.0.0.1:{c.cfg['prefill']['extra']['kvferry_bootstrap_port']}",
           "kvferry_block_size": 4, "kvferry_num_tokens": len(prompt)}
    c.add("decode", "d-21", prompt, 3, kvp)
    time.sleep(0.5)  # lets decode's metadata reach prefill first (as in the test above)
    # max_tokens 5: the request still runs after its prompt's step, so the client can abort it
    c.add("prefill", "p-21", prompt, 5, {**C.PREFILL_PARAMS, "kvferry_room": 70021})
    c.wait("prefill", lambda e: e == ("held", 70021), what="layer-wise writes of 70021 held in flight")
    c.send("prefill", "abort", "p-21")
    # decode learns of the abort from prefill: prefill has run request_finished by then
    c.kv("decode", lambda k: k["invalid"], what="decode's blocks of 70021 reported as load errors")
    n = len(c.events["prefill"])
    c.send("prefill", "count_free")
    free = c.wait("prefill", lambda e: e[0] == "free_now" and c.events["prefill"].index(e) >= n)[1]
    assert free < E.NUM_BLOCKS, "prefill's blocks were freed while a write still read them"
    assert not any(e[0] == "kv" and "p-21" in e[1]["finished_sending"] for e in c.events["prefill"])
    c.send("prefill", "release_holds")
    c.kv("prefill", lambda k: "p-21" in k["finished_sending"], what="p-21 reported once no write reads its blocks")
    f = failures(c, "prefill", 70021)
    assert [(x["code"], x["origin"]) for x in f] == [("aborted", "prefill/tp0")], f
    assert c.output("decode", "d-21")["token_ids"] == C.expected_tokens(prompt, 3)  # recomputed on decode
    all_blocks_back(c)


def test_write_failure_with_policy_fail_has_one_line(cluster):
    """kv_load_failure_policy=fail: a prefill write failure fails the decode request
    (FINISHED_ERROR: vLLM's Scheduler._handle_invalid_blocks finishes it before the workers report
    it in finished_recving, so request_finished still finds it loading). The failure has its one
    line, at its origin (prefill/tp0); decode added a second, wrong "aborted"
    info line for the request's end before (issue 33 attack F7)."""
    c = cluster(1, 1, policy="fail", faults={"prefill/tp0": {"write_failure": [70022]}})
    _, out = c.request(22, PROMPTS[22], params={"kvferry_room": 70022})
    assert out["finish_reason"] == "error" and out["token_ids"] == [], out
    f = c.kv("decode", lambda k: k["failures"], what="decode's failure record of 70022")["failures"]
    assert [(x["room"], x["code"], x["origin"]) for x in f] == [(70022, "transfer_error", "prefill/tp0")], f
    all_blocks_back(c)
    deadline = time.monotonic() + 10  # lines reach the records on each process's own time
    while not c.lines_above_debug(70022) and time.monotonic() < deadline:
        time.sleep(0.05)
    one_line_at_origin(c, 70022, "prefill/tp0", "transfer_error", 30)


def test_lease_expires_when_decode_never_comes(cluster):
    """kv_lease_duration 1 s: prefill frees the blocks at its end (bootstrap_timeout, origin
    prefill, one warning there); a decode that comes later is told that failure and recomputes."""
    c = cluster(1, 1, extra={"kv_lease_duration": 1})
    kvp = c.prefill(12, PROMPTS[12], params={"kvferry_room": 70012})
    c.kv("prefill", lambda k: "p-12" in k["finished_sending"], what="p-12 freed at the lease's end")
    f = failures(c, "prefill", 70012)
    assert [(x["code"], x["origin"]) for x in f] == [("bootstrap_timeout", "prefill/tp0")], f
    c.add("decode", "d-12", PROMPTS[12], 3, kvp)
    out = c.output("decode", "d-12")
    assert out["token_ids"] == C.expected_tokens(PROMPTS[12], 3)
    f = failures(c, "decode", 70012)
    assert [(x["code"], x["origin"], x["is_from_another_rank"]) for x in f] == \
        [("bootstrap_timeout", "prefill/tp0", True)], f
    one_line_at_origin(c, 70012, "prefill/tp0", "bootstrap_timeout", 30)
    all_blocks_back(c)


def test_lease_renewed_while_decode_waits_for_blocks(cluster):
    """kv_lease_duration 2 s, and the decode request waits for blocks (other requests hold every
    free one: vLLM's Scheduler.schedule stops at the waiting request whose allocate_slots returns
    None) for two leases past prefill's lease expiry. Decode's worker opened its room at
    on_new_request (vLLM's Scheduler.add_request calls it), so kvferry renews the lease at prefill
    every third of it, as NIXL's decode heartbeats do (docs/vllm.md "The lease"): prefill keeps the
    blocks, and once decode has blocks the room succeeds with every byte right and no line above
    debug. Without the renewal prefill frees them at the lease (as in the test above)."""
    c = cluster(1, 1, extra={"kv_lease_duration": 2})
    kvp = c.prefill(17, PROMPTS[17], params={"kvferry_room": 70017})
    c.send("decode", "take_blocks")
    c.wait("decode", lambda e: e[0] == "blocks_taken", what="decode's blocks taken")
    c.add("decode", "d-17", PROMPTS[17], 3, kvp)
    end = kvp["kvferry_lease_expiry"] + 4.0  # the lease's deadline, and two more leases
    while time.time() < end:
        c._drain("prefill", 0.05)
    freed = [e for e in c.events["prefill"] if e[0] == "kv" and "p-17" in e[1]["finished_sending"]]
    assert not freed and not failures(c, "prefill", 70017), (freed, failures(c, "prefill", 70017))
    c.send("decode", "give_blocks")
    check_success(c, 17, c.output("decode", "d-17"), 1)
    c.kv("prefill", lambda k: "p-17" in k["finished_sending"], what="p-17 freed once written")
    assert not failures(c, "prefill", 70017) and not failures(c, "decode", 70017)
    all_blocks_back(c)
    assert not c.lines_above_debug()


def test_prefill_killed_while_holding_blocks(cluster):
    """Prefill's writes of room 70013 are held in flight when the prefill engine is killed: decode
    fails the room (peer_unreachable, origin the dead prefill rank) by its heartbeat timeout, long
    before any transfer deadline, and reports its blocks as load errors at once (one line above
    debug, on decode, for the dead peer). The room is released quarantined at the drain deadline
    (1 s here: the dead rank never confirmed its drain); kvferry reclaims it once that rank's
    process is proven gone (its control endpoint refuses connects), though it never comes back
    (issue 33 finding 10: before, the request waited for good), so the request is reported and
    recomputed on decode (docs/vllm.md "Failures")."""
    c = cluster(1, 1, faults={"prefill/tp0": {"hold": [70013]}},
                env={"KVFERRY_HEARTBEAT_TIMEOUT_MS": "800", "KVFERRY_WAITING_TIMEOUT_MS": "120000",
                     "KVFERRY_TRANSFER_TIMEOUT_MS": "120000", "KVFERRY_DRAIN_TIMEOUT_MS": "1000"})
    kvp = c.prefill(13, PROMPTS[13], params={"kvferry_room": 70013})
    c.add("decode", "d-13", PROMPTS[13], 3, kvp)
    c.wait("prefill", lambda e: e == ("held", 70013), what="writes of 70013 held in flight")
    c.kill("prefill")
    # The deadline: far below the 120 s waiting and transfer deadlines (only the heartbeat path fits).
    k = c.kv("decode", lambda k: k["invalid"], deadline_s=60, what="the room's blocks reported as load errors")
    f = c.kv("decode", lambda k: k["failures"], deadline_s=60, what="the room's failure")["failures"]
    assert [(x["room"], x["code"], x["origin"]) for x in f] == [(70013, "peer_unreachable", "prefill/tp0")], f
    assert len(k["invalid"]) == 3, k
    c.kv("decode", lambda k: "d-13" in (k["finished_recving"] or ()), deadline_s=60,
         what="d-13 reported once kvferry reclaimed its quarantined room")
    assert c.output("decode", "d-13")["token_ids"] == C.expected_tokens(PROMPTS[13], 3)  # recomputed
    lines = c.lines_above_debug()
    assert len(lines) == 1 and lines[0]["proc"] == "decode-tp0" and "prefill/tp0" in lines[0]["msg"], lines


def test_preempted_on_decode_after_the_transfer(cluster):
    """A decode request preempted after its KV arrived recomputes locally (vLLM flipped
    do_remote_prefill at allocation): no second room, no line above debug, the same tokens."""
    c = cluster(1, 1)
    kvp = c.prefill(14, PROMPTS[14], params={"kvferry_room": 70014})
    c.add("decode", "d-14", PROMPTS[14], 40, kvp)
    c.wait("decode", lambda e: e[0] == "check" and e[1] == "d-14", what="d-14's KV checked")
    c.send("decode", "preempt", "d-14")
    assert c.wait("decode", lambda e: e[0] == "preempted" and e[1] == "d-14")[2] is True
    out = c.output("decode", "d-14")
    assert out["token_ids"] == C.expected_tokens(PROMPTS[14], 40)
    assert len(c.checks("d-14")) == 1  # the recompute read no remote KV
    all_blocks_back(c)
    assert not c.lines_above_debug()


def test_block_size_mismatch_is_refused(cluster):
    """Decode's block size (8) differs from prefill's (4): decode refuses the request's params and
    computes it (one error line on decode naming both sizes). kvferry's compatibility handshake
    (docs/failure-model.md "Compatibility") tells prefill too: decode's registration is refused on its
    fingerprint (one error line on prefill naming the field and both values, not tied to a room) and
    the room bound for it fails there with incompatible_peer, so its blocks are freed without waiting
    for the lease and without a line of the room above debug."""
    c = cluster(1, 1, decode_block_size=8, extra={"kv_lease_duration": 1})
    kvp, out = c.request(15, PROMPTS[15], params={"kvferry_room": 70015})
    assert out["token_ids"] == C.expected_tokens(PROMPTS[15], 3) and not c.checks("d-15")
    c.kv("prefill", lambda k: "p-15" in k["finished_sending"], what="p-15 freed")
    # Each process's lines reach the records on their own time: wait for both sides' (a deadline,
    # not a window), then check that nothing else came.
    deadline = time.monotonic() + 30
    while True:
        lines = c.lines_above_debug(70015)
        dec = [r for r in lines if r["proc"] == "decode-tp0"]
        told = [r for r in c.lines_above_debug() if r["proc"] == "prefill-tp0" and "incompatible" in r["msg"]]
        if (dec and told) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(dec) == 1 and dec[0]["level"] == 40 and "block size mismatch: prefill 4 tokens, decode 8" in \
        dec[0]["msg"], lines
    assert [r for r in lines if r not in dec] == [], lines
    assert len(told) == 1 and told[0]["level"] == 40 and "page_size: ours 4, theirs 8" in told[0]["msg"], told
