"""A 2+2 transfer through the Python module over engine-owned numpy buffers (16 KV buffers, 3 aux
buffers, 1 state buffer per rank), every rank its own process (engine_buffers_rank.py): chunked
with an empty last chunk, every byte of the KV, aux and state rows checked on both decode ranks;
an injected write failure on prefill/tp1 reported on all four ranks with prefill/tp1 as the
origin; and decode/tp0's release_safe() False while prefill/tp0's write is held in flight (the
fault decorator), True once it is released."""
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading

import pytest

import kvferry
from engine_buffers_rank import FAULT_RANK, HOLD_RANK, ROOM_FAULT, ROOM_OK

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120  # seconds for any one event of a rank (a loaded machine)


class Rank:
    """One rank's process: JSON commands to its stdin, JSON events from its stdout."""

    def __init__(self, name, addr, transport, logdir):
        role, tp = name.split("/tp")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
        self.name = name
        self.stderr = open(os.path.join(logdir, name.replace("/", "_") + ".err"), "w+")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "engine_buffers_rank.py"), role, tp, addr,
                                      transport], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, cwd=HERE, env=env)
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put(None)

    def event(self, name):
        try:
            e = self.events.get(timeout=TIMEOUT)
        except queue.Empty:
            e = None
        if e is None or e["event"] != name:
            self.stderr.seek(0)
            pytest.fail(f"{self.name}: expected event {name!r}, got {e!r}; stderr:\n{self.stderr.read()}")
        return e

    def send(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def finish(self):
        e = self.event("done")
        assert self.proc.wait(timeout=TIMEOUT) == 0, self.name
        return e

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def run_engines(transport):
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    with tempfile.TemporaryDirectory() as logdir:
        ranks = {name: Rank(name, addr, transport, logdir)
                 for name in ("prefill/tp0", "prefill/tp1", "decode/tp0", "decode/tp1")}
        try:
            origin = ranks[f"prefill/tp{FAULT_RANK}"].event("failed")["error"]
            holder = ranks[f"prefill/tp{HOLD_RANK}"]
            holder.event("held")
            holder.send(fail_from_engine=origin)  # the prefill engine's agreement: one rank failed the room
            held = ranks[f"decode/tp{HOLD_RANK}"].event("failed")
            holder.send(release=True)
            ranks[f"decode/tp{HOLD_RANK}"].send(go=True)
            return origin, held, {name: r.finish() for name, r in ranks.items()}
        finally:
            for r in ranks.values():
                r.kill()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_two_by_two_engine_buffers(transport):
    origin, held, seen = run_engines(transport)
    assert (origin["code"], origin["origin"], origin["is_from_another_rank"]) == (
        "transfer_error", "prefill/tp1", False)

    # decode/tp0's room failed (prefill/tp0 told it) while prefill/tp0's write was still held:
    # Failed, but not release-safe, and not quarantined.
    assert held["release_safe"] is False and held["quarantined"] is False
    assert held["error"]["origin"] == "prefill/tp1" and held["error"]["is_from_another_rank"] is True

    for name, s in seen.items():
        assert s["rank"] == name
        assert s["states"] == {str(ROOM_OK): "Success", str(ROOM_FAULT): "Failed"}, name
        assert s["errors"][str(ROOM_OK)] is None, name
        err = s["errors"][str(ROOM_FAULT)]
        assert (err["code"], err["origin"], err["bootstrap_room"]) == (
            "transfer_error", "prefill/tp1", ROOM_FAULT), name
        assert err["is_from_another_rank"] is (name != "prefill/tp1"), name
        assert "injected write failure" in err["failure_reason"], name
        assert s["release_safe"] and s["released"], name
    p = seen[f"prefill/tp{HOLD_RANK}"]
    assert p["ready"] and p["held_seen"] and p["failed_after_agreement"] and p["done"]
    assert p["safe_while_held"] is False  # its own write was still in flight
    for r in range(2):
        d = seen[f"decode/tp{r}"]
        assert d["ok_done"] and d["failed"]
        assert d["kv_match"], f"decode/tp{r}: a KV byte differs"
        assert d["aux_match"], f"decode/tp{r}: an aux byte differs"
        assert d["state_match"], f"decode/tp{r}: a state byte differs"
        assert d["others_untouched"], f"decode/tp{r}: a row no room offered was written"
        assert d["quarantined"] is False
        # tp1's writes failed (nothing landed); tp0's held write landed once released, which is
        # why its room could not be release-safe before.
        assert d["fault_pages_untouched"] is (r == FAULT_RANK), f"decode/tp{r}"
