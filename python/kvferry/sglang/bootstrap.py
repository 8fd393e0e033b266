"""The prefill engine's bootstrap service in SGLang's shape, and the HTTP calls to it.

``KVBootstrapServer(host, port)`` is what SGLang's prefill server process starts (through the
backend lookup, with ``--host`` and ``--disaggregation-bootstrap-port``). It is kvferry's
bootstrap service (C++, include/kvferry/bootstrap.h): one port serving both kvferry's rank routes
(what the ranks' managers register and look up) and SGLang's routes (PUT/GET ``/route`` with
rank and dp/cp/tp/pp parameters, ``/register_dp_rank``, ``/query_dp_ranks``, ``/health``;
src/bootstrap/sglang_routes.h), with every input checked and every map bounded. It runs on its
own threads, without the GIL.

The client helpers use urllib (stdlib); every call is bounded by a timeout and a response size.
With the cluster secret set (KVFERRY_SECRET_FILE or KVFERRY_SECRET, docs/security.md) the service
answers 401 to any call without a MAC of that call under the cluster's key; these helpers send one
(``_kvferry.bootstrap_authorization``: the key stays in the C++ extension), never a token, so a
bootstrap address a request names learns nothing that authenticates another call.
"""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Optional, Tuple

from .. import _kvferry

MAX_RESPONSE_BYTES = 4 << 20
# The whole call, whatever the server does, at most this many times the timeout (urllib's timeout
# applies to each socket operation: a server dripping a byte at a time would hold the call for ever).
CALL_BUDGET_FACTOR = 3


def _read_bounded(r, deadline: float) -> str:
    """At most MAX_RESPONSE_BYTES of the answer, read until `deadline` (then TimeoutError)."""
    out = bytearray()
    read = getattr(r, "read1", None) or r.read
    while len(out) < MAX_RESPONSE_BYTES:
        if time.monotonic() > deadline:
            raise TimeoutError("the bootstrap service did not answer in time")
        chunk = read(min(1 << 16, MAX_RESPONSE_BYTES - len(out)))
        if not chunk:
            break
        out += chunk
    return out.decode("utf-8", "replace")


class KVBootstrapServer:
    """SGLang's bootstrap server interface over kvferry's bootstrap service."""

    def __init__(self, host: str, port: int):
        self.host = host
        self.port = int(port)
        self._server = _kvferry.BootstrapServer(host or "0.0.0.0", self.port)
        self.port = self._server.port  # the bound one (port 0: any free port)

    def registered(self) -> int:
        return self._server.registered()

    def close(self) -> None:
        self._server = None

    def poll(self):  # SGLang's base declares it; the service has no per-room state
        return None


def _url(addr: str, path: str) -> str:
    return f"http://{addr}{path}"


def request(method: str, addr: str, path: str, body: Optional[dict] = None,
            timeout: float = 5.0) -> Tuple[int, str]:
    """(status, text) of one HTTP call to the bootstrap service at `addr` ("host:port");
    (0, reason) when it cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data else {}
    # urllib sends `path` as the request target unchanged: the MAC covers exactly that.
    auth = _kvferry.bootstrap_authorization(method, path, data or b"")  # None without a cluster secret
    if auth:
        headers["Authorization"] = auth
    req = urllib.request.Request(_url(addr, path), data=data, method=method, headers=headers)
    deadline = time.monotonic() + CALL_BUDGET_FACTOR * timeout
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, _read_bounded(r, deadline)
    except urllib.error.HTTPError as e:
        return e.code, _read_bounded(e, deadline)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return 0, str(getattr(e, "reason", e))


def get_parallel_info(addr: str, timeout: float = 5.0) -> Tuple[Optional[dict], str]:
    """The prefill instance's parallel info (GET /route with -1s), or (None, why)."""
    status, text = request("GET", addr, "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
                                        "&target_pp_rank=-1", timeout=timeout)
    if status != 200:
        return None, f"HTTP {status}: {text[:200]}"
    try:
        info = json.loads(text)
    except ValueError:
        return None, "not JSON"
    if not isinstance(info, dict):
        return None, "not a JSON object"
    return info, ""


def get_rank(addr: str, dp: int, cp: int, tp: int, pp: int, timeout: float = 5.0) -> Optional[dict]:
    status, text = request("GET", addr, f"/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}&target_tp_rank={tp}"
                                        f"&target_pp_rank={pp}", timeout=timeout)
    if status != 200:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    return info if isinstance(info, dict) else None
