"""Several ranks fail the same room at once, through the Python module (issue 16,
docs/failure-model.md "Root cause"): a TP-2 prefill engine and a TP-1 decode engine, every rank its
own process (race_rank.py), where for every room two ranks observe a local failure at nearly the
same moment: both prefill ranks' writes fail (decode/tp0, the only path between them, is stopped
meanwhile, so both are local for certain), or decode/tp0 aborts while prefill/tp1's writes fail.
Whatever order the failures reach the ranks in, every room must have ONE origin: every rank's
KVTransferError names it (is_from_another_rank exactly on the other ranks), exactly one line above
debug across the three ranks' logs, by that origin, and a rank whose own failure lost logs it at
debug with superseded_by naming the origin. Many rooms per run, several runs: the races are hit.
prefill/tp0 sends the "decode_vs_prefill" rooms without a fault of its own: a room whose writes all
landed there before the failure reached it stays at Success (terminal), with no failure line."""
import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

import kvferry

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120  # seconds for any one event of a rank (a loaded machine)
RANKS = ("prefill/tp0", "prefill/tp1", "decode/tp0")


def start(name, addr, transport, logdir, rooms):
    role, tp = name.split("/tp")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    log = os.path.join(logdir, name.replace("/", "-") + ".jsonl")
    err = open(os.path.join(logdir, name.replace("/", "-") + ".err"), "w+")
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "race_rank.py"), role, tp, addr, transport, log,
                          json.dumps(rooms)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                         cwd=HERE, env=env)
    return p, err, log


def event(name, p, err, want):
    line = p.stdout.readline()
    e = json.loads(line) if line else None
    if e is None or e.get("event") != want:
        p.kill()
        err.seek(0)
        pytest.fail(f"{name}: expected event {want!r}, got {line!r}; stderr:\n{err.read()}")
    return e


def failure_lines(log):
    with open(log) as f:
        return [j for j in map(json.loads, f) if j.get("component", "").endswith(".connector") and "room" in j]


@pytest.mark.parametrize("transport,run", [("shm", 0), ("shm", 1), ("tcp", 0)])
def test_one_origin_when_two_ranks_fail_a_room_at_once(transport, run):
    base = 7000 + 100 * run + (50 if transport == "tcp" else 0)
    rooms = [[base + i, "two_prefill" if i % 2 == 0 else "decode_vs_prefill"] for i in range(12)]
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    with tempfile.TemporaryDirectory() as logdir:
        procs = {name: start(name, addr, transport, logdir, rooms) for name in RANKS}
        try:
            for name, (p, err, _) in procs.items():
                assert event(name, p, err, "ready")["ready"], name
            decode = procs["decode/tp0"][0]
            for kind in ("two_prefill", "decode_vs_prefill"):
                if kind == "two_prefill":
                    os.kill(decode.pid, signal.SIGSTOP)  # no path between the prefill ranks
                for name in (("prefill/tp0", "prefill/tp1") if kind == "two_prefill" else RANKS):
                    procs[name][0].stdin.write(json.dumps({"go": kind}) + "\n")
                    procs[name][0].stdin.flush()
                for name in ("prefill/tp0", "prefill/tp1"):
                    local = event(name, *procs[name][:2], "local")
                    if not local["failed"]:  # what the ranks' logs say of the rooms still open
                        still = {int(r) for r, st in local["states"].items() if st != "Failed"}
                        logs = {n: [j for j in map(json.loads, open(lg)) if int(j.get("room", 0) or 0) in still]
                                for n, (_, _, lg) in procs.items() if os.path.exists(lg)}
                        pytest.fail(f"{name}: {kind} rooms not Failed: {local['states']}; their log lines: "
                                    f"{json.dumps(logs)[:20000]}")
                if kind == "two_prefill":
                    os.kill(decode.pid, signal.SIGCONT)
                    decode.stdin.write(json.dumps({"go": kind}) + "\n")
                    decode.stdin.flush()
                assert event("decode/tp0", *procs["decode/tp0"][:2], "local")
            done = {name: event(name, p, err, "done") for name, (p, err, _) in procs.items()}
            for name, (p, _, _) in procs.items():
                assert p.wait(timeout=TIMEOUT) == 0, name
            lines = {name: failure_lines(log) for name, (_, _, log) in procs.items()}
        finally:
            for p, err, _ in procs.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
                err.close()

    for name, d in done.items():
        assert d["rank"] == name
        assert d["failed"] and d["release_safe"] and d["released"], name
    superseded = succeeded = 0
    for room, kind in rooms:
        errs = {name: done[name]["errors"][str(room)] for name in RANKS}
        at_success = [name for name, e in errs.items() if e is None]
        assert at_success in ([], ["prefill/tp0"]) and (not at_success or kind == "decode_vs_prefill"), \
            f"room {room} ({kind}): not Failed on {at_success}: {errs}"
        errs = {name: e for name, e in errs.items() if e is not None}
        succeeded += len(at_success)
        origins = {e["origin"] for e in errs.values()}
        assert len(origins) == 1, f"room {room} ({kind}): two origins {errs}"
        origin = origins.pop()
        if kind == "two_prefill":
            assert origin in ("prefill/tp0", "prefill/tp1"), (room, errs)
        else:
            assert origin in ("prefill/tp1", "decode/tp0"), (room, errs)
        for name, e in errs.items():
            assert e["is_from_another_rank"] is (name != origin), (room, name, e)
            assert len({e["code"] for e in errs.values()}) == 1, (room, errs)
        # One line above debug across the three ranks, by the origin.
        above = [(name, j) for name, ls in lines.items() for j in ls
                 if int(j["room"]) == room and j["level"] not in ("debug", "trace")]
        assert [name for name, _ in above] == [origin], f"room {room} ({kind}): {above}"
        assert above[0][1]["origin"] == origin
        # Every rank logged the room once. A rank whose own local failure lost (it failed before it
        # learned of the winner) logs it at debug, superseded by the origin; a rank that learned of
        # the winner first never failed on its own.
        for name, ls in lines.items():
            mine = [j for j in ls if int(j["room"]) == room]
            assert len(mine) == (0 if name in at_success else 1), (room, name, mine)
            if not mine:
                continue
            if "superseded_by" in mine[0]:
                assert name != origin and mine[0]["superseded_by"] == origin, (room, name, mine[0])
                assert mine[0]["level"] == "debug"
                superseded += 1
    print(f"{transport} run {run}: {superseded} of {len(rooms)} rooms had a local failure that lost the race; "
          f"prefill/tp0 reached Success in {succeeded} decode_vs_prefill rooms")
    RACES_LOST.append(superseded)


# Rooms per run whose local failure lost the rule (test_one_origin_when_two_ranks_fail_a_room_at_once).
RACES_LOST = []


def test_the_races_were_hit():
    """Over the runs above, some rank's own failure lost the rule: the races were hit. The
    "two_prefill" rooms fail on both prefill ranks while decode/tp0 is stopped, so usually one of
    the two loses in every one of them (seen: 3 to 12 of a run's 12 rooms); on a heavily loaded
    machine a prefill rank may learn of the other's failure before its own (seen once: 0 of 12 in
    one run), which is correct but hits no race, so this is judged over all runs, not per run."""
    assert len(RACES_LOST) == 3, f"the three runs did not all complete: {RACES_LOST}"
    assert sum(RACES_LOST) > 0, RACES_LOST
