"""A 2+2 transfer through the Python module: a TP-2 prefill engine and a TP-2 decode engine, every
rank its own process (engine_rank.py), over one bootstrap service: every byte of each decode
rank's head slice, and an injected write failure on prefill/tp1 reported on the ranks it reaches
(prefill/tp1 as the origin, decode/tp1 from another rank) while the tp0 pair completes."""
import json
import os
import subprocess
import sys

import pytest

import kvferry
from engine_rank import FAULT_RANK, PAGES, ROOM_FAULT, ROOM_OK

HERE = os.path.dirname(os.path.abspath(__file__))


def run_engines(transport):
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])}
    procs = {f"{role}/tp{r}": subprocess.Popen([sys.executable, os.path.join(HERE, "engine_rank.py"), role, str(r),
                                                addr, transport],
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE,
                                               env=env)
             for role in ("prefill", "decode") for r in range(2)}
    seen = {}
    try:
        for name, p in procs.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"{name}: {err}"
            seen[name] = json.loads(out)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return seen


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_two_by_two_transfer_and_failure_origin(transport):
    seen = run_engines(transport)
    assert {name: s["rank"] for name, s in seen.items()} == {name: name for name in seen}
    for name, s in seen.items():
        assert s["done"] and s["released"], name
        faulty = name.endswith(f"tp{FAULT_RANK}")
        assert s["states"] == {str(ROOM_OK): "Success", str(ROOM_FAULT): "Failed" if faulty else "Success"}, name
        assert s["errors"][str(ROOM_OK)] is None, name
        err = s["errors"][str(ROOM_FAULT)]
        if not faulty:
            assert err is None, name
            continue
        assert (err["code"], err["origin"], err["bootstrap_room"]) == ("transfer_error", "prefill/tp1", ROOM_FAULT)
        assert err["is_from_another_rank"] is name.startswith("decode"), name
        assert "injected write failure" in err["failure_reason"]
    for r in range(2):
        d = seen[f"decode/tp{r}"]
        assert d["bytes_match"], f"decode/tp{r}: a byte of its head slice differs"
        assert d["aux"] == {"room": ROOM_OK, "cached_tokens": PAGES[ROOM_OK] * 4, "num_pages": PAGES[ROOM_OK]}
        # The failed room's pages on decode/tp1 were never written (tp0's completed).
        assert d["fault_pages_untouched"] is (r == FAULT_RANK)
