"""The ``kv_transfer_params`` kvferry's connector puts into a prefill request's output and reads
from a decode request (docs/vllm.md "kv_transfer_params").

vLLM carries them as a dict: the proxy (router) sends the prefill request with
``{"do_remote_decode": True}``, takes the dict prefill returns with its output and sends the decode
request with it (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py in vLLM). The field
names vLLM's own code and NIXL's routers read (``do_remote_prefill``, ``do_remote_decode``,
``remote_engine_id``, ``remote_request_id``, ``remote_block_ids``, ``tp_size``) keep their meaning;
kvferry's own fields are prefixed ``kvferry_``. Decode never trusts them: every field is
type- and range-checked here, and a malformed dict fails the request (it never reaches kvferry).
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
import socket
from typing import Any, Optional, Tuple

MAX_ROOM = (1 << 63) - 1
MAX_BLOCKS = 1 << 24
_ADDR = re.compile(r"^(\[[0-9A-Fa-f:.]{2,64}\]|[A-Za-z0-9.\-]{1,253}):(\d{1,5})$")

# kvferry's fields in kv_transfer_params.
ROOM = "kvferry_room"              # the room (63-bit), the join key of prefill and decode
BOOTSTRAP = "kvferry_bootstrap"    # "host:port" of the prefill instance's bootstrap service
BLOCK_SIZE = "kvferry_block_size"  # prefill's block size in tokens (decode's must be equal)
NUM_TOKENS = "kvferry_num_tokens"  # tokens whose KV prefill holds (the prompt)
LEASE_EXPIRY = "kvferry_lease_expiry"  # wall-clock seconds (time.time()) when prefill frees the blocks


class ParamsError(ValueError):
    """kv_transfer_params that kvferry cannot use (named field, why)."""


def valid_room(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_ROOM:
        raise ParamsError(f"{ROOM}: {v!r} is not a room id in 1..2^63-1")
    return v


def valid_address(v: Any) -> str:
    if not isinstance(v, str) or not _ADDR.match(v) or not 0 < int(v.rsplit(":", 1)[1]) < 65536:
        raise ParamsError(f"{BOOTSTRAP}: {v!r} is not host:port")
    return v


def _int(params: dict, key: str, lo: int, hi: int) -> int:
    v = params.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ParamsError(f"{key}: {v!r} is not an integer in {lo}..{hi}")
    return v


@dataclasses.dataclass(frozen=True)
class RemotePrefill:
    """What a decode request's kv_transfer_params say about its prefill (checked)."""
    room: int
    bootstrap: str
    block_size: int
    num_tokens: int
    tp_size: int
    remote_request_id: str


def flag(params: Optional[dict], key: str) -> bool:
    """vLLM's boolean fields (do_remote_prefill, do_remote_decode): JSON true only (a string
    "false" is not true)."""
    return bool(params) and params.get(key) is True


def is_kvferry_decode(params: Optional[dict]) -> bool:
    """A decode request whose KV a kvferry prefill holds (do_remote_prefill with kvferry's room)."""
    return flag(params, "do_remote_prefill") and ROOM in params


@functools.lru_cache(maxsize=1024)
def _canonical_host(host: str) -> str:
    h = host.strip("[]")
    try:
        return str(ipaddress.ip_address(h))
    except ValueError:
        pass
    try:  # a name: the first address it resolves to (once per name: cached)
        return str(ipaddress.ip_address(socket.getaddrinfo(h, None, type=socket.SOCK_STREAM)[0][4][0]))
    except (OSError, ValueError, IndexError):
        return h.lower()


def manager_key(bootstrap: str) -> str:
    """Decode's kvferry manager for a prefill instance: one per address, the host normalised
    (localhost:P and 127.0.0.1:P are one instance: kvferry refuses a second manager of the same
    decode rank at that prefill, a restart claim)."""
    host, port = bootstrap.rsplit(":", 1)
    return f"{_canonical_host(host)}:{port}"


def room_and_peer(params: dict) -> Tuple[Optional[int], Optional[str], Optional[int]]:
    """The fields needed to tell a prefill instance a room ended (room, bootstrap, tp_size), each
    None if malformed: decode tells prefill at once even when another field is malformed."""
    out = []
    for check in (lambda: valid_room(params.get(ROOM)), lambda: valid_address(params.get(BOOTSTRAP)),
                  lambda: _int(params, "tp_size", 1, 1024)):
        try:
            out.append(check())
        except ParamsError:
            out.append(None)
    return out[0], out[1], out[2]


def parse_remote_prefill(params: dict) -> RemotePrefill:
    """Raises ParamsError naming the first bad field."""
    rid = params.get("remote_request_id", "")
    return RemotePrefill(room=valid_room(params.get(ROOM)), bootstrap=valid_address(params.get(BOOTSTRAP)),
                         block_size=_int(params, BLOCK_SIZE, 1, 1 << 20),
                         num_tokens=_int(params, NUM_TOKENS, 1, MAX_BLOCKS << 10),
                         tp_size=_int(params, "tp_size", 1, 1024),
                         remote_request_id=str(rid)[:256])


def prefill_output(*, room: int, bootstrap: str, engine_id: str, request_id: str, block_ids: list,
                   block_size: int, num_tokens: int, tp_size: int, lease_expiry: float) -> dict:
    """The kv_transfer_params a prefill request's output carries to the proxy."""
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": engine_id,
            "remote_request_id": request_id, "remote_block_ids": list(block_ids), "remote_host": None,
            "remote_port": None, "tp_size": tp_size, "transfer_mode": "push", ROOM: room, BOOTSTRAP: bootstrap,
            BLOCK_SIZE: block_size, NUM_TOKENS: num_tokens, LEASE_EXPIRY: lease_expiry}
