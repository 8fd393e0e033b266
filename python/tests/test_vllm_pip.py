"""`pip install` of kvferry's Python package into a fresh virtual environment (setup.py,
docs/vllm.md "Install with pip"), as an engine's environment gets it: the compiled module, the
kvferry, kvferry.sglang and kvferry.vllm packages and the SGLang plugin entry point come from the
venv, and a transfer between a prefill and a decode manager runs there.

No network: --no-build-isolation --no-index; the venv sees Debian's setuptools and wheel through
--system-site-packages. KVFERRY_CMAKE_BUILD_DIR (CTest sets it to the build directory) makes
setup.py reuse that build's _kvferry target instead of configuring a build of its own.
"""
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

TRANSFER = r"""
import importlib.metadata as md, json, time
import kvferry, kvferry.vllm, kvferry.sglang
geo = dict(num_layers=2, num_kv_heads=2, head_dim=8, dtype_bytes=2, page_size=4)
n = kvferry.pool_nbytes(16, **geo)
server = kvferry.BootstrapServer()
addr = f"127.0.0.1:{server.port}"
p_pool, d_pool = bytearray(n), bytearray(n)
pre = kvferry.KVManager("prefill", p_pool, bootstrap_addr=addr, transport="tcp", **geo)
dec = kvferry.KVManager("decode", d_pool, bootstrap_addr=addr, transport="tcp", **geo)
l = pre.layout
for b in range(l["num_buffers"]):
    for page in (3, 5):
        off = pre.page_offset(b, page)
        p_pool[off:off + l["page_bytes"]] = bytes([(b * 16 + page) % 256]) * l["page_bytes"]
r = kvferry.KVReceiver(dec, 77)
s = kvferry.KVSender(pre, 77)
r.init([1, 2], 0)
s.init(2)
end = time.monotonic() + 30
while s.poll() != kvferry.KVPoll.WaitingForInput and time.monotonic() < end:
    time.sleep(0.01)
s.send([3, 5])
while r.poll() not in (kvferry.KVPoll.Success, kvferry.KVPoll.Failed) and time.monotonic() < end:
    time.sleep(0.01)
ok = all(d_pool[dec.page_offset(b, dst):dec.page_offset(b, dst) + l["page_bytes"]] ==
         p_pool[pre.page_offset(b, src):pre.page_offset(b, src) + l["page_bytes"]]
         for b in range(l["num_buffers"]) for src, dst in ((3, 1), (5, 2)))
eps = [e.value for e in md.entry_points(group="sglang.srt.plugins") if e.name == "kvferry"]
print(json.dumps({"file": kvferry.__file__, "vllm": kvferry.vllm.KvferryConnector.__module__,
                  "state": r.poll().name, "bytes_ok": ok, "entry_points": eps, "version": md.version("kvferry")}))
for x in (s, r):
    x.close()
pre.close(); dec.close()
"""


def test_pip_install_into_a_fresh_venv_and_transfer(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("KVFERRY_CMAKE_BUILD_DIR", os.path.join(ROOT, "build"))
    r = subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index", ROOT],
                       env=env, capture_output=True, text=True, timeout=1200, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    r = subprocess.run([py, "-c", TRANSFER], env=env, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    import json
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file"].startswith(str(venv)), out  # the venv's copy, not the build tree's or /usr/local's
    assert out["vllm"] == "kvferry.vllm.connector" and out["version"]
    assert out["state"] == "Success" and out["bytes_ok"] is True, out
    assert out["entry_points"] == ["kvferry.sglang.plugin:register"], out
