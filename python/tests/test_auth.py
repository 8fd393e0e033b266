"""The cluster secret from Python (docs/security.md): with KVFERRY_SECRET_FILE set, the bootstrap
service the SGLang backend starts answers 401 without the bearer token, and kvferry's own HTTP
helpers send it; a secret file others may read is refused. Each case runs in a fresh interpreter:
a process reads its secret once."""
import os
import subprocess
import sys
import textwrap

PROBE = textwrap.dedent("""
    import urllib.error, urllib.request
    from kvferry import _kvferry
    from kvferry.sglang import bootstrap as b
    try:
        s = b.KVBootstrapServer("127.0.0.1", 0)
    except Exception as e:
        print("start failed:", e)
        raise SystemExit(0)
    addr = f"127.0.0.1:{s.port}"
    try:
        urllib.request.urlopen(f"http://{addr}/health", timeout=10)
        print("anonymous 200")
    except urllib.error.HTTPError as e:
        print("anonymous", e.code)
    status, _ = b.request("GET", addr, "/health", timeout=10)
    print("helper", status)
    print("header", _kvferry.authorization_header() is not None)
""")


def run_probe(env_extra):
    env = dict(os.environ)
    env.pop("KVFERRY_SECRET_FILE", None)
    env.pop("KVFERRY_SECRET", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def write_secret(tmp_path, mode):
    p = tmp_path / "cluster.secret"
    p.write_text("python auth test secret 0123456789abcdef\n")
    p.chmod(mode)
    return str(p)


def test_secret_file_requires_the_token(tmp_path):
    out = run_probe({"KVFERRY_SECRET_FILE": write_secret(tmp_path, 0o600)})
    assert "anonymous 401" in out, out
    assert "helper 200" in out, out
    assert "header True" in out, out


def test_without_a_secret_nothing_is_required():
    out = run_probe({})
    assert "anonymous 200" in out, out
    assert "helper 200" in out, out
    assert "header False" in out, out


def test_secret_file_others_may_read_is_refused(tmp_path):
    out = run_probe({"KVFERRY_SECRET_FILE": write_secret(tmp_path, 0o644)})
    assert "start failed:" in out and "chmod 600" in out, out
