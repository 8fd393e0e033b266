"""The cluster secret from Python (docs/security.md): with KVFERRY_SECRET_FILE set, the bootstrap
service the SGLang backend starts answers 401 without a MAC of the request under the cluster's key,
and to the bearer token (the bootstrap service does not take it: docs/security.md), and kvferry's
own HTTP helpers send the MAC, as does one written from the docs alone (cluster_keys_util); a secret
file others may read is refused. Each case runs in a fresh interpreter: a process reads its secret
once."""
import os
import subprocess
import sys
import textwrap

import cluster_keys_util

SECRET = "python auth test secret 0123456789abcdef"

PROBE = textwrap.dedent("""
    import sys, urllib.error, urllib.request
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
    print("header", _kvferry.bootstrap_authorization("GET", "/health", b"") is not None)
    for name, arg, prefix in (("bearer", 1, "Bearer "), ("documented mac", 2, "")):
        if len(sys.argv) <= arg:
            continue
        auth = prefix + open(sys.argv[arg]).read().strip()
        req = urllib.request.Request(f"http://{addr}/health", headers={"Authorization": auth})
        try:
            urllib.request.urlopen(req, timeout=10)
            print(name, 200)
        except urllib.error.HTTPError as e:
            print(name, e.code)
""")


def run_probe(env_extra, args=()):
    env = dict(os.environ)
    env.pop("KVFERRY_SECRET_FILE", None)
    env.pop("KVFERRY_SECRET", None)
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def write_secret(tmp_path, mode):
    p = tmp_path / "cluster.secret"
    p.write_text(SECRET + "\n")
    p.chmod(mode)
    return str(p)


def test_secret_file_requires_a_mac_not_the_token(tmp_path):
    # The token (what /metrics takes) and a MAC, both derived from the documented scheme in
    # cluster_keys_util: the MAC's 200 shows the derivation right, so the token's 401 is the service
    # refusing the token, not a wrong token.
    token_file = tmp_path / "token"
    token_file.write_text(cluster_keys_util.bearer_token(SECRET))
    mac_file = tmp_path / "mac"
    mac_file.write_text(cluster_keys_util.bootstrap_authorization(SECRET, "GET", "/health"))
    out = run_probe({"KVFERRY_SECRET_FILE": write_secret(tmp_path, 0o600)}, [str(token_file), str(mac_file)])
    assert "anonymous 401" in out, out
    assert "bearer 401" in out, out
    assert "documented mac 200" in out, out
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
