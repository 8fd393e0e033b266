"""kvferry.sglang.bootstrap's calls authenticate with a MAC of each call (docs/security.md, "The
bootstrap service's MAC"): a real kvferry bootstrap service with a cluster secret accepts every
helper call (PUT /route, /register_dp_rank, /query_dp_ranks, the parallel info, /health) from a
process with the same secret, and refuses them (401) from one with another secret or none. What a
bootstrap address a request names captures (issue 33's attack, finding 2) authenticates no other
call at the real service, and its own call once at most. Each side runs in its own interpreter: a
process reads its secret once."""
import json
import os
import subprocess
import sys
import textwrap

SERVER = textwrap.dedent("""
    import sys
    from kvferry.sglang import bootstrap as b
    s = b.KVBootstrapServer("127.0.0.1", 0)
    print(s.port, flush=True)
    sys.stdin.read()
""")

CLIENT = textwrap.dedent("""
    import http.server, json, sys, threading, urllib.error, urllib.request
    from kvferry.sglang import bootstrap as b
    addr = sys.argv[1]
    reg = {"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
           "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
           "rank_ip": "127.0.0.1", "rank_port": 7000, "page_size": 16, "kv_cache_dtype": "bfloat16",
           "load_balance_method": "round_robin", "enable_dsa_cache_layer_split": False}
    out = {}
    out["put"] = b.request("PUT", addr, "/route", reg, timeout=10)[0]
    out["register_dp_rank"] = b.request("POST", addr, "/register_dp_rank",
                                        {"bootstrap_room": 5, "dp_rank": 0}, timeout=10)[0]
    status, text = b.request("POST", addr, "/query_dp_ranks", {"bootstrap_rooms": [5]}, timeout=10)
    out["query_dp_ranks"] = status
    out["query_answer"] = text if status == 200 else ""
    info, why = b.get_parallel_info(addr, timeout=10)
    out["parallel_info"] = info is not None
    out["parallel_info_why"] = why
    out["health"] = b.request("GET", addr, "/health", timeout=10)[0]

    # A rogue bootstrap address: what it is sent, and what that is worth at the real service.
    got = []
    class Rogue(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            got.append((self.path, self.headers.get("Authorization")))
            self.send_response(404)
            self.end_headers()
        def log_message(self, *args):
            pass
    rogue = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Rogue)
    threading.Thread(target=rogue.serve_forever, daemon=True).start()
    b.get_parallel_info(f"127.0.0.1:{rogue.server_address[1]}", timeout=10)
    rogue.shutdown()
    path, auth = got[0]
    out["captured"] = auth or ""

    def call(method, target, body, header):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{addr}{target}", data=data, method=method,
                                     headers={"Authorization": header, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    if auth:
        reg2 = dict(reg, rank_ip="127.0.0.2")
        out["captured_put"] = call("PUT", "/route", reg2, auth)
        out["captured_other_get"] = call("GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0"
                                         "&target_pp_rank=0", None, auth)
        out["captured_replay"] = [call("GET", path, None, auth), call("GET", path, None, auth)]
    print("RESULT " + json.dumps(out))
""")


def _env(secret_file):
    env = dict(os.environ)
    env.pop("KVFERRY_SECRET_FILE", None)
    env.pop("KVFERRY_SECRET", None)
    if secret_file:
        env["KVFERRY_SECRET_FILE"] = secret_file
    return env


def _secret(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text + "\n")
    p.chmod(0o600)
    return str(p)


def _client(addr, secret_file):
    out = subprocess.run([sys.executable, "-c", CLIENT, addr], env=_env(secret_file), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, out.stdout + out.stderr
    return json.loads(line[0][len("RESULT "):])


def test_helpers_are_accepted_with_the_secret_and_refused_with_another(tmp_path):
    ours = _secret(tmp_path, "ours.secret", "python bootstrap mac test secret 0123456789")
    theirs = _secret(tmp_path, "theirs.secret", "another cluster's secret 0123456789abcdef")
    server = subprocess.Popen([sys.executable, "-c", SERVER], env=_env(ours), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        addr = f"127.0.0.1:{port}"
        for secret_file in (theirs, None):  # before ours registered anything
            refused = _client(addr, secret_file)
            for call in ("put", "register_dp_rank", "query_dp_ranks", "health"):
                assert refused[call] == 401, (secret_file, call, refused)
            assert not refused["parallel_info"] and "HTTP 401" in refused["parallel_info_why"], refused

        accepted = _client(addr, ours)
        for call in ("put", "register_dp_rank", "query_dp_ranks", "health"):
            assert accepted[call] == 200, (call, accepted)
        assert json.loads(accepted["query_answer"]) == {"5": 0}, accepted
        assert accepted["parallel_info"], accepted
        # The rogue got a MAC of its one call, no token: it neither registers nor asks anything
        # else, and its own call replays once.
        assert accepted["captured"].startswith("KVF-MAC v=1,"), accepted
        assert accepted["captured_put"] == 401, accepted
        assert accepted["captured_other_get"] == 401, accepted
        assert accepted["captured_replay"] == [200, 401], accepted
    finally:
        server.stdin.close()
        server.wait(timeout=30)
