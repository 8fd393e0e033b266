"""kvferry's SGLang backend driven the way SGLang's schedulers drive it (sglang_harness_rank.py),
every rank its own process, over the tcp transport on loopback and across two test hosts (network
namespaces): 2 prefill + 2 decode ranks with faults injected on each rank, unequal TP both ways, and MLA.

For every run: each room ends the same on every rank (Success, or Failed with one code and origin);
every byte of KV pages, aux rows and state rows of every successful room is right on every decode
rank; each failed room is logged above debug exactly once over all ranks (SGLang's scheduler line on
its origin rank; kvferry logs nothing above debug for it), each successful room not at all; no
decode rank frees a room's pages before the room is release-safe.
"""
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import kvferry.sglang as ks  # noqa: E402
import sglang_harness_rank as harness  # noqa: E402

TIMEOUT_S = 90
ENV = {"KVFERRY_KV_MEMORY": "host", "KVFERRY_STATE_MEMORY": "host", "KVFERRY_TRANSPORT": "tcp",
       "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1", "KVFERRY_LOOKUP_TIMEOUT_MS": "30000",
       "KVFERRY_HEARTBEAT_TIMEOUT_MS": "10000", "KVFERRY_TOTAL_KV_HEADS": "4"}


def req(room, pages, chunks, arrive=0):
    assert sum(chunks) == pages
    return {"room": room, "pages": pages, "chunks": chunks, "arrive": arrive}


def run(prefill_tp, decode_tp, requests, faults, mla=False, state=False, hosts=None, prefill_dp=1, decode_dp=1,
        prefill_lbm="auto"):
    """`hosts`: {"prefill": (netns, address), "decode": (netns, address)} to place each engine on a
    test host (tests/hosts/hosts.sh); the bootstrap service then runs on the prefill's host.
    `prefill_dp`, `decode_dp`: DP attention (--dp-size with --enable-dp-attention; each DP rank is
    tp // dp ranks); `prefill_lbm`: the prefill's --load-balance-method (decode with DP uses
    follow_bootstrap_room, which kvferry's backend requires there)."""
    ctx = mp.get_context("spawn")
    bootstrap_proc, server = None, None
    if hosts:
        ports = ctx.Queue()
        bootstrap_proc = ctx.Process(target=harness.bootstrap_main, args=(*hosts["prefill"], ports), daemon=True)
        bootstrap_proc.start()
        bootstrap_port, bootstrap_host = ports.get(timeout=60), hosts["prefill"][1]
    else:
        server = ks.KVBootstrapServer("127.0.0.1", 0)
        bootstrap_port, bootstrap_host = server.port, "127.0.0.1"
    width = len(requests) + 1
    results = ctx.Queue()
    procs, shared = [], []  # the engines' barriers and arrays live until the ranks are done
    events_dir = tempfile.mkdtemp(prefix="kvf-sglang-events-")  # held/deferred markers (harness)
    all_done = ctx.Barrier(prefill_tp + decode_tp, timeout=TIMEOUT_S)
    for role, tp_size, dp_size in (("prefill", prefill_tp, prefill_dp), ("decode", decode_tp, decode_dp)):
        attn_tp = tp_size // dp_size
        for tp in range(tp_size):
            if tp % attn_tp == 0:  # each attention DP rank's CPU group (its poll MIN)
                barrier, arr = ctx.Barrier(attn_tp, timeout=TIMEOUT_S), ctx.Array("q", attn_tp * width, lock=False)
                shared.append((barrier, arr))
            env = ({**ENV, "KVFERRY_PEER_TP_SIZE": str(decode_tp // decode_dp), "KVFERRY_PEER_DP_SIZE": str(decode_dp)}
                   if role == "prefill" else dict(ENV))
            if hosts:  # each rank binds and advertises its host's address
                env["KVFERRY_CONTROL_HOST"] = hosts[role][1]
            lbm = prefill_lbm if role == "prefill" else ("follow_bootstrap_room" if dp_size > 1 else "auto")
            cfg = {"role": role, "tp_rank": tp, "tp_size": tp_size, "dp_size": dp_size, "load_balance_method": lbm,
                   "mla": mla, "state": state, "total_heads": 4,
                   "bootstrap_port": bootstrap_port, "bootstrap_host": bootstrap_host, "requests": requests,
                   "faults": faults,
                   # A prefill engine is told the decode engine's TP size (docs/sglang.md); decode
                   # learns the prefill's from the bootstrap service.
                   "env": env, "netns": hosts[role][0] if hosts else None,
                   "timeout_s": TIMEOUT_S, "events_dir": events_dir}
            p = ctx.Process(target=harness.main, args=(cfg, barrier, arr, width, results, all_done), daemon=True)
            p.start()
            procs.append(p)
    try:
        out = {}
        for _ in procs:
            r = results.get(timeout=TIMEOUT_S + 30)
            out[r["rank"]] = r
        for p in procs:
            p.join(timeout=30)
        bad = {k: v for k, v in out.items() if not v["ok"]}
        assert not bad, "\n".join(f"{k}: {v['error']}" for k, v in bad.items())
        return out
    finally:
        for p in procs + ([bootstrap_proc] if bootstrap_proc else []):
            if p.is_alive():
                p.kill()
        shutil.rmtree(events_dir, ignore_errors=True)


def check_run(out, requests, failed, serving=None):
    """`failed`: room -> (code, origin) of the rooms that must fail. `serving`: room -> the ranks
    whose DP rank serves it (default: every rank)."""
    for room in (r["room"] for r in requests):
        key = str(room)
        ranks = sorted(serving[room]) if serving else sorted(out)
        assert sorted(r for r, res in out.items() if room in res["served"]) == ranks, (room, ranks)
        decode = [k for k in ranks if k.startswith("decode")]
        for rank in ranks:
            res = out[rank]
            got = res["rooms"].get(key)
            assert got is not None, f"{rank}: room {room} never concluded"
            if room in failed:
                assert got["state"] == "Failed", f"{rank}: room {room} {got}"
                assert got["type"] == "KVTransferError" and got["bootstrap_room"] == room, (rank, got)
            else:
                assert got == {"state": "Success"}, f"{rank}: room {room} {got}"
                if rank.startswith("prefill"):  # issue 30 fix 4: a latency after clear(), as SGLang asks
                    lat = res["latency_s"].get(key)
                    assert lat is not None and lat > 0, f"{rank}: room {room} has no transfer latency ({lat})"
        lines = [(rank, r) for rank, res in out.items() for r in res["records"]
                 if r["room"] == room and r["level"] > 10]
        if room in failed:
            assert len(lines) == 1, f"room {room}: {len(lines)} lines above debug: {json.dumps(lines, indent=1)}"
            code, origin = failed[room]
            rank, line = lines[0]
            assert rank == origin, f"room {room}: logged on {rank}, its origin is {origin}: {line}"
            assert line["name"].startswith("sglang.srt.disaggregation."), line
            assert code in line["msg"] and ("ERROR" if origin.startswith("decode") else "WARNING") == \
                {40: "ERROR", 30: "WARNING"}.get(line["level"]), line
            o = out[origin]["rooms"][str(room)]
            assert (o["code"], o["is_from_another_rank"]) == (code, False), (origin, o)
            for r in ranks:
                if r != origin:
                    assert out[r]["rooms"][str(room)]["is_from_another_rank"] is True, (r, room)
                # Issue 30 fix 3: every rank of both engines names the same root cause, also a rank
                # that learned of the failure only from its engine's MIN poll (the failure board).
                got = out[r]["rooms"][str(room)]
                assert (got["code"], got["origin"]) == (code, origin), \
                    f"{r}: room {room} raised {got['code']} at {got['origin']}, its root cause is {code} at {origin}"
        else:
            assert not lines, f"room {room} succeeded but was logged above debug: {lines}"
            for rank in decode:
                assert out[rank]["bytes_ok"][str(room)] == {"kv": True, "aux": True, "state": True}, (rank, room)
    for rank in (k for k in out if k.startswith("decode")):
        early = [f for f in out[rank]["frees"] if not f["release_safe"]]
        assert not early, f"{rank} freed before release-safe: {early}"
    # Nothing else above info from kvferry on any rank while the engines worked (at teardown a rank
    # may notice a peer that closed first: "unreachable; 0 rooms failed").
    noisy = [(rank, r) for rank, res in out.items() for r in res["records"][:res["work_records"]]
             if r["name"].startswith("kvferry") and r["level"] > 20]
    assert not noisy, noisy


def test_two_prefill_two_decode_faults_on_every_rank():
    reqs = [req(101, 5, [2, 3, 0]), req(102, 1, [1]), req(103, 4, [4, 0]), req(104, 6, [1, 2, 3], arrive=3),
            req(201, 3, [1, 2]), req(202, 3, [3, 0]), req(203, 2, [1, 1, 0]), req(204, 2, [2]),
            req(105, 2, [2, 0], arrive=40), req(106, 7, [3, 4], arrive=40)]
    faults = {"prefill/tp0": {"201": ["write_failure"], "203": ["hold"]},
              "prefill/tp1": {"202": ["write_failure"], "204": ["hold"]},
              "decode77/tp0": {"203": ["abort"]}, "decode77/tp1": {"204": ["abort"]}}
    out = run(2, 2, reqs, faults, state=True)
    check_run(out, reqs, {201: ("transfer_error", "prefill/tp0"), 202: ("transfer_error", "prefill/tp1"),
                          203: ("aborted", "decode77/tp0"), 204: ("aborted", "decode77/tp1")})
    # The held rooms were failed while prefill's writes were in flight: decode deferred their release.
    for rank, room in (("decode77/tp0", 203), ("decode77/tp1", 204)):
        assert [f["how"] for f in out[rank]["frees"] if f["room"] == room] == ["deferred"], out[rank]["frees"]
    ms = [v for r in ("decode77/tp0", "decode77/tp1") for k, v in out[r]["overhead_ms"].items() if k == "102"]
    print(f"\n1-page room 102, send_metadata to Success on decode: {max(ms):.2f} ms")


@pytest.mark.parametrize("prefill_tp,decode_tp", [(2, 1), (1, 2)])
def test_unequal_tp(prefill_tp, decode_tp):
    reqs = [req(301, 4, [2, 2, 0]), req(302, 3, [3]), req(303, 2, [1, 1]), req(304, 5, [5, 0], arrive=5)]
    origin = "prefill/tp1" if prefill_tp == 2 else "decode77/tp1"
    fault = {"prefill/tp1": {"303": ["write_failure"]}} if prefill_tp == 2 else {"decode77/tp1": {"303": ["abort"]}}
    out = run(prefill_tp, decode_tp, reqs, fault)
    check_run(out, reqs, {303: ("transfer_error" if prefill_tp == 2 else "aborted", origin)})


def test_mla_prefill_tp2_to_decode_tp1():
    reqs = [req(401, 4, [2, 2, 0]), req(402, 1, [1]), req(403, 3, [3])]
    out = run(2, 1, reqs, {"prefill/tp0": {"403": ["write_failure"]}}, mla=True)
    check_run(out, reqs, {403: ("transfer_error", "prefill/tp0")})


# DP attention: room -> the prefill DP rank serving it, for each prefill --load-balance-method
# (data_parallel_controller.py: follow_bootstrap_room_scheduler room % dp; round_robin_scheduler in
# arrival order, not counting a request routed to a DP rank; 605 is routed to prefill DP 0 and the
# router gives decode the same rank, req.disagg_prefill_dp_rank). Decode (follow_bootstrap_room)
# serves room % 2. With round_robin the prefill registers each room's DP rank (/register_dp_rank)
# and decode asks the bootstrap service (query_prefill_dp_ranks); with follow_bootstrap_room decode
# computes room % dp. Room 603 is served by prefill DP 1 either way: its write failure there.
DP_REQS = [req(602, 2, [2, 0]), req(603, 4, [2, 2]), req(601, 3, [1, 2]), req(604, 1, [1]),
           {**req(605, 2, [1, 1]), "prefill_dp": 0}, req(606, 3, [3], arrive=5)]
DP_PREFILL = {"follow_bootstrap_room": {602: 0, 603: 1, 601: 1, 604: 0, 605: 0, 606: 0},
              "round_robin": {602: 0, 603: 1, 601: 0, 604: 1, 605: 0, 606: 0}}


def dp_name(role, tp, dp):
    return harness.rank_name(role, tp, dp)


@pytest.mark.parametrize("prefill_lbm", ["follow_bootstrap_room", "round_robin"])
def test_dp_attention_prefill_dp2_decode_dp2(prefill_lbm):
    """Prefill tp2 dp2 and decode tp2 dp2 (attention TP 1 each): every room goes from the prefill DP
    rank that served it to decode DP rank room % 2, which names it by the request's own DP rank, by
    room % dp or by the bootstrap service's query; a write failure on one prefill DP rank fails only
    that room, on exactly its two ranks, with its origin, logged once."""
    faults = {"prefill/tp0/dp1": {"603": ["write_failure"]}}
    out = run(2, 2, DP_REQS, faults, state=True, prefill_dp=2, decode_dp=2, prefill_lbm=prefill_lbm)
    where = DP_PREFILL[prefill_lbm]
    serving = {room: [dp_name("prefill", 0, pdp), dp_name("decode", 0, room % 2)] for room, pdp in where.items()}
    check_run(out, DP_REQS, {603: ("transfer_error", "prefill/tp0/dp1")}, serving)
    for room, pdp in where.items():  # decode resolved the prefill DP rank that served the room
        assert out[dp_name("decode", 0, room % 2)]["prefill_dp"][str(room)] == pdp, room


def test_dp_attention_prefill_dp2_to_decode_tp2():
    """Unequal: prefill tp2 dp2 (attention TP 1) to decode tp2 without DP (attention TP 2, one poll
    MIN over both): each decode rank takes its heads from the prefill DP rank serving the room; a
    write failure on prefill DP 1 fails that room on both decode ranks with its origin."""
    reqs = [req(701, 3, [1, 2]), req(702, 2, [2]), req(703, 4, [2, 2, 0]), req(704, 1, [1], arrive=5)]
    out = run(2, 2, reqs, {"prefill/tp0/dp1": {"703": ["write_failure"]}}, prefill_dp=2, decode_dp=1)
    serving = {r["room"]: [dp_name("prefill", 0, r["room"] % 2), "decode77/tp0", "decode77/tp1"] for r in reqs}
    check_run(out, reqs, {703: ("transfer_error", "prefill/tp0/dp1")}, serving)


def test_dp_attention_agreement_is_per_attention_tp_group():
    """Prefill tp4 dp2 (attention TP 2) to decode tp2 dp2 (attention TP 1): a write failure on
    prefill/tp1/dp1 fails room 803 on the three ranks of the two DP ranks serving it (prefill/tp0/dp1
    learns it from its decode destination or its attention TP group's poll MIN, whichever comes
    first) with that origin, logged once; the poll MIN of each DP rank's group spans only its ranks,
    so DP 0's rooms run to Success beside it."""
    reqs = [req(801, 3, [1, 2]), req(802, 2, [2]), req(803, 4, [2, 2, 0]), req(804, 1, [1], arrive=5)]
    out = run(4, 2, reqs, {"prefill/tp1/dp1": {"803": ["write_failure"]}}, prefill_dp=2, decode_dp=2)
    serving = {r["room"]: [dp_name("prefill", t, r["room"] % 2) for t in (0, 1)] + [dp_name("decode", 0, r["room"] % 2)]
               for r in reqs}
    check_run(out, reqs, {803: ("transfer_error", "prefill/tp1/dp1")}, serving)


HOSTS_SH = os.path.join(HERE, "..", "..", "tests", "hosts", "hosts.sh")


def no_netns_reason():
    if os.geteuid() != 0:
        return f"network namespaces need root (this is uid {os.geteuid()})"
    if shutil.which("ip") is None:
        return "'ip' (iproute2) is not installed"
    return ""


@pytest.fixture
def two_hosts():
    """Two test hosts (tests/hosts/hosts.sh), named from this process's pid; without root or
    iproute2 the test fails saying so, unless KVFERRY_NO_NETNS=1 (then it is skipped)."""
    why = no_netns_reason()
    if why:
        if os.environ.get("KVFERRY_NO_NETNS") == "1":
            pytest.skip(f"KVFERRY_NO_NETNS=1: {why}")
        pytest.fail(f"the across-hosts harness cannot run: {why} (run as root, or set KVFERRY_NO_NETNS=1)")
    prefix, subnet = f"ks{os.getpid() % 100000}", f"10.73.{os.getpid() % 250}"
    env = {**os.environ, "KVF_HOSTS_SUBNET": subnet}
    with tempfile.TemporaryDirectory() as d:
        hosts_json = os.path.join(d, "hosts.json")
        up = subprocess.run([HOSTS_SH, "up", "2", prefix, "--json", hosts_json], env=env, capture_output=True,
                            text=True)
        try:
            assert up.returncode == 0, up.stderr
            with open(hosts_json) as f:
                h = json.load(f)["hosts"]
            yield {"prefill": (h["h1"]["exec"][-1], h["h1"]["address"]),
                   "decode": (h["h2"]["exec"][-1], h["h2"]["address"])}
        finally:
            subprocess.run([HOSTS_SH, "down", prefix], env=env, capture_output=True)


def test_across_two_hosts(two_hosts):
    """The 2P2D run with a fault on each engine, prefill on one test host and decode on another:
    every rank binds and advertises its host's address, the bootstrap service is on the prefill's."""
    reqs = [req(501, 5, [2, 3, 0]), req(502, 1, [1]), req(503, 4, [4, 0]), req(504, 3, [1, 2]),
            req(505, 2, [2, 0], arrive=10)]
    faults = {"prefill/tp1": {"503": ["write_failure"]}, "decode77/tp0": {"504": ["abort"]}}
    out = run(2, 2, reqs, faults, state=True, hosts=two_hosts)
    for rank, res in out.items():  # each rank's control socket is on its own host's address
        assert res["rank_ip"] == two_hosts[rank.split("/")[0].rstrip("0123456789")][1], (rank, res["rank_ip"])
    check_run(out, reqs, {503: ("transfer_error", "prefill/tp1"), 504: ("aborted", "decode77/tp0")})
