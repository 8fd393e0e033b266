"""KVArgs and KVManager of kvferry's SGLang backend (docs/sglang.md).

SGLang's scheduler builds a ``KVArgs``, sets its fields and hands it to
``KVManager(args, disaggregation_mode, server_args, is_mla_backend)``. The manager checks the setup
(settings.check_supported: unsupported features fail here, naming the setting), derives kvferry's
geometry from the KV item lengths, and builds the rank: KV, aux and state buffers go from the
KVArgs pointers and item lengths straight into kvferry's buffer registration, device memory on
KVArgs.gpu_id (docs/gpu.md: without a usable GPU, or with a pointer that is not device memory of
that GPU, construction fails naming the buffer and why; past that, moving device memory needs a UCX
with CUDA support, and kvferry refuses it here otherwise).

Prefill: one kvferry manager, registered at the engine's bootstrap service (kvferry's rank route)
and, in SGLang's shape, by ``register_to_bootstrap()``. Decode: one kvferry manager per prefill
instance it serves (kvferry connects a manager to one prefill instance), the first built here,
others when ``try_ensure_parallel_info`` meets a new instance (at most
KVFERRY_MAX_PREFILL_INSTANCES). DP attention: each attention DP rank is its own group of attention
TP ranks (the kvferry manager's dp_rank; a prefill is told the decode's DP size by
KVFERRY_PEER_DP_SIZE, a decode learns the prefill's from its bootstrap service; docs/sglang.md
"DP attention"). Failures are logged by SGLang's scheduler, not by kvferry
(``log_failures=False``): one line above debug per failure, on its origin rank.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import socket
import threading
import weakref
from typing import Dict, List, Optional

from .. import KVManager as _Manager
from ..engine_id import decode_engine_id
from . import bootstrap as _bootstrap
from . import settings as _settings

logger = logging.getLogger("kvferry.sglang")


class KVArgs:
    """The fields SGLang's scheduler sets (python/sglang/srt/disaggregation/base/conn.py)."""
    engine_rank: int
    kv_data_ptrs: List[int]
    kv_data_lens: List[int]
    kv_item_lens: List[int]
    kv_layer_ids: List[int]
    kv_cache_dtype_str: str
    aux_data_ptrs: List[int]
    aux_data_lens: List[int]
    aux_item_lens: List[int]
    state_types: list
    state_data_ptrs: List[List[int]]
    state_data_lens: List[List[int]]
    state_item_lens: List[List[int]]
    state_layer_ids: List[List[int]]
    state_dim_per_tensor: List[List[int]]
    state_slice_outer_counts: List[List[int]]
    is_hybrid_mla_backend: bool
    state_conv_shard_groups: list
    ib_device: str
    ib_traffic_class: str
    gpu_id: int
    kv_head_num: int
    total_kv_head_num: int
    page_size: int
    system_dp_rank: int
    pp_rank: int
    prefill_start_layer: int
    prefill_end_layer: Optional[int]
    mla_compression_ratios: Optional[List[int]]
    kv_buf_groups: int
    total_kv_layers: int


@dataclasses.dataclass
class PrefillServerInfo:
    """A prefill instance's parallel info (its bootstrap service's GET /route with -1s) and this
    decode rank's mapping onto it (the fields SGLang's decode reads)."""
    attn_tp_size: int
    attn_cp_size: int
    dp_size: int
    pp_size: int
    page_size: Optional[int]
    kv_cache_dtype: Optional[str]
    follow_bootstrap_room: bool
    enable_dsa_cache_layer_split: bool = False
    prefill_http_port: Optional[int] = None
    target_tp_rank: Optional[int] = None
    target_tp_ranks: Optional[List[int]] = None
    target_cp_ranks: Optional[List[int]] = None
    target_pp_ranks: Optional[List[int]] = None
    required_dst_info_num: Optional[int] = None
    required_prefill_response_num: Optional[int] = None


def _bounded_int(v, lo: int, hi: int, what: str) -> int:
    try:
        x = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {v!r} is not an integer") from None
    if not lo <= x <= hi:
        raise ValueError(f"{what}: {x} is outside {lo}..{hi}")
    return x


class KVManager:
    """One SGLang rank's transfer manager over kvferry (see the module doc)."""

    def __init__(self, args: KVArgs, disaggregation_mode, server_args, is_mla_backend: Optional[bool] = False):
        self.kv_args = args
        self.disaggregation_mode = disaggregation_mode
        self.server_args = server_args
        self.is_mla_backend = bool(is_mla_backend)
        self.role = _settings.mode_name(disaggregation_mode)
        par = _settings.parallel_of(args, server_args)
        _settings.check_supported(self.role, args, server_args, par)
        self.parallel = par
        self.attn_tp_size, self.attn_tp_rank = par.attn_tp_size, par.attn_tp_rank
        self.attn_cp_size, self.attn_cp_rank = 1, 0
        # DP attention: each attention DP rank is its own group of attn_tp ranks (its own kvferry TP
        # engine, ManagerConfig::self.dp_rank); its poll agreement is over that group only.
        self.attn_dp_size, self.attn_dp_rank = par.attn_dp_size, par.attn_dp_rank
        self.pp_size, self.pp_rank = par.pp_size, par.pp_rank
        self.system_dp_rank = int(getattr(args, "system_dp_rank", 0) or 0)
        self.kv_cache_dtype_str = getattr(args, "kv_cache_dtype_str", None)
        self.geometry = _settings.geometry_of(args, server_args, self.is_mla_backend, par)
        self.kv_item_lens_sum = sum(int(x) for x in args.kv_item_lens)
        self.state_item_lens_sum = sum(int(x) for comp in (getattr(args, "state_item_lens", None) or [])
                                       for x in (comp if isinstance(comp, (list, tuple)) else [comp]))
        self.has_state = bool(getattr(args, "state_types", None))
        self._descs = _settings.buffer_descs(args)
        self.bootstrap_host = getattr(server_args, "host", "127.0.0.1") or "127.0.0.1"
        self.bootstrap_port = int(getattr(server_args, "disaggregation_bootstrap_port", 8998))
        self.enable_staging = False
        self.is_dummy_cp_rank = False
        self.request_status: Dict[int, int] = {}
        self.failure_records: Dict[int, str] = {}
        self.failure_lock = threading.Lock()
        self._lock = threading.Lock()
        self._rooms: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._closed = False
        if self.role == "prefill":
            peer_tp = int(_settings.env("KVFERRY_PEER_TP_SIZE") or par.attn_tp_size)
            if self.has_state and peer_tp != par.attn_tp_size:
                raise _settings.UnsupportedConfiguration(
                    f"state rows with unequal TP (prefill {par.attn_tp_size}, decode {peer_tp}): kvferry copies "
                    "whole state rows and does not slice them by head")
            self.peer_tp_size = peer_tp
            self.peer_dp_size = _settings.peer_dp_size("prefill", par)
            self._mgr = self._build(self.bootstrap_address(), peer_tp, self.peer_dp_size)
            self.rank_ip, self.rank_port = self._control_host_port(self._mgr)
            self.req_to_decode_prefix_len: Dict[int, int] = {}
            self.transfer_infos: Dict[int, object] = {}
            self.register_to_bootstrap()
        else:
            self.prefill_info_table: Dict[str, PrefillServerInfo] = {}
            self.connection_pool: Dict[str, list] = {}
            self.required_prefill_response_num_table: Dict[int, int] = {}
            self.addr_to_rooms_tracker: Dict[str, set] = {}
            self._max_instances = int(_settings.env("KVFERRY_MAX_PREFILL_INSTANCES"))
            peer_tp = int(_settings.env("KVFERRY_PEER_TP_SIZE") or par.attn_tp_size)
            # Built now, so memory kinds, transport and geometry fail here, not at the first request.
            self._spare: Optional[_Manager] = self._build("", peer_tp, 1)
            self._spare_peer = (peer_tp, 1)
            self._managers: Dict[str, _Manager] = {}
            self.rank_ip, self.rank_port = self._control_host_port(self._spare)

    # -- building kvferry managers ------------------------------------------------------------------

    def engine_id(self) -> int:
        """Decode: this server's kvferry engine_id, the same on every rank of the server and different
        between servers, with no communication (kvferry.engine_id; docs/sglang.md "Several decode
        instances"): from dist_init_addr (every rank of a multi-node server has it), else this host's
        name and the server's HTTP port (the ranks of a one-node server share both)."""
        if getattr(self, "_engine_id", None) is None:
            dist = getattr(self.server_args, "dist_init_addr", None)
            key = (f"dist:{dist}" if dist else
                   f"host:{socket.gethostname()}:{getattr(self.server_args, 'port', '')}")
            self._engine_id = decode_engine_id(key)
        return self._engine_id

    def bootstrap_address(self) -> str:
        """Where this prefill engine's bootstrap service listens ("host:port"), as SGLang derives it."""
        dist = getattr(self.server_args, "dist_init_addr", None)
        if dist:
            host = str(dist).rsplit(":", 1)[0].strip("[]")
        else:
            host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.bootstrap_host, self.bootstrap_host)
        return f"[{host}]:{self.bootstrap_port}" if ":" in host else f"{host}:{self.bootstrap_port}"

    def _build(self, bootstrap_addr: str, peer_tp: int, peer_dp: int) -> _Manager:
        from ..buffers import EngineBuffers
        advertise = _settings.env("KVFERRY_CONTROL_HOST")
        log_file = _settings.env("KVFERRY_LOG_FILE")
        rank = (f"{self.role}-dp{self.attn_dp_rank}-tp{self.attn_tp_rank}" if self.attn_dp_size > 1
                else f"{self.role}-tp{self.attn_tp_rank}")
        return _Manager(self.role, buffers=EngineBuffers(list(self._descs), []), bootstrap_addr=bootstrap_addr,
                        engine_id=self.engine_id() if self.role == "decode" else 0,
                        transport=_settings.env("KVFERRY_TRANSPORT"), tp_rank=self.attn_tp_rank,
                        tp_size=self.attn_tp_size, peer_tp_size=peer_tp,
                        deadlines=_settings.deadlines_from_sglang_env(),
                        log_file=log_file.replace("{rank}", rank) if log_file else None,
                        transfer_shards=int(_settings.env("KVFERRY_TRANSFER_SHARDS")), log_failures=False,
                        control_bind=_settings.env("KVFERRY_CONTROL_BIND") or advertise,
                        control_advertise=advertise,
                        fault_injection=_settings.env("KVFERRY_FAULT_INJECTION").lower() in _settings.TRUE,
                        integrity=_settings.env("KVFERRY_INTEGRITY").lower() in _settings.TRUE,
                        dp_rank=self.attn_dp_rank, peer_dp_size=peer_dp,
                        **self.geometry.manager_kwargs())

    @staticmethod
    def _control_host_port(mgr: _Manager):
        ep = mgr.control_endpoint  # "tcp://host:port"
        host, _, port = ep[len("tcp://"):].rpartition(":")
        return host.strip("[]"), int(port)

    def manager_for(self, bootstrap_addr: str) -> _Manager:
        """Prefill: the rank's manager. Decode: the manager serving that prefill instance
        (try_ensure_parallel_info must have met it). Raises KeyError otherwise."""
        if self.role == "prefill":
            return self._mgr
        with self._lock:
            return self._managers[bootstrap_addr]

    def _attach(self, bootstrap_addr: str, prefill_tp: int, prefill_dp: int) -> None:
        with self._lock:
            if bootstrap_addr in self._managers:
                return
            if len(self._managers) >= self._max_instances:
                raise RuntimeError(f"kvferry: this decode rank already serves {len(self._managers)} prefill "
                                   f"instances (KVFERRY_MAX_PREFILL_INSTANCES={self._max_instances})")
            if self._spare is not None and self._spare_peer == (prefill_tp, prefill_dp):
                mgr, self._spare = self._spare, None
            else:
                mgr = None
        if mgr is None:
            mgr = self._build("", prefill_tp, prefill_dp)
        with self._lock:
            self._managers[bootstrap_addr] = mgr

    # -- SGLang's manager interface ----------------------------------------------------------------

    def register_to_bootstrap(self) -> None:
        """Registers this prefill rank at the bootstrap service in SGLang's shape (PUT /route).
        kvferry's own rank entry was registered when the rank was built."""
        if self.role != "prefill":
            return
        payload = {"attn_tp_size": self.attn_tp_size, "attn_tp_rank": self.attn_tp_rank,
                   "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": self.attn_dp_size,
                   "attn_dp_rank": self.attn_dp_rank, "pp_size": self.pp_size, "pp_rank": self.pp_rank,
                   # SGLang registers system_dp_size 1 under DP attention (CommonKVManager.__init__);
                   # its bootstrap then files the rank under attn_dp_rank.
                   "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": self.rank_ip, "rank_port": self.rank_port,
                   "page_size": self.geometry.page_size, "kv_cache_dtype": self.kv_cache_dtype_str,
                   # as SGLang's ServerArgs resolves "auto" before its manager registers it
                   "load_balance_method": _settings.load_balance_method(self.server_args, "prefill"),
                   "enable_dsa_cache_layer_split": False}
        port = getattr(self.server_args, "port", None)
        if port:
            payload["prefill_http_port"] = int(port)
        status, text = _bootstrap.request("PUT", self.bootstrap_address(), "/route", payload)
        if status != 200:
            raise RuntimeError(f"kvferry: registering at the bootstrap service {self.bootstrap_address()} "
                               f"failed: HTTP {status}: {text[:200]}")

    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool:
        """Decode: fetches and caches the prefill instance's parallel info and this rank's mapping
        onto it; connects a kvferry manager to the instance. False if it cannot be fetched (yet);
        RuntimeError for an instance this rank cannot serve (page size, dtype, TP shape)."""
        if bootstrap_addr in self.prefill_info_table:
            return True
        raw, why = _bootstrap.get_parallel_info(bootstrap_addr)
        if raw is None:
            logger.debug("prefill parallel info from %s not available: %s", bootstrap_addr, why)
            return False
        try:
            info = PrefillServerInfo(
                attn_tp_size=_bounded_int(raw.get("attn_tp_size"), 1, 1024, "attn_tp_size"),
                attn_cp_size=_bounded_int(raw.get("attn_cp_size"), 1, 1024, "attn_cp_size"),
                dp_size=_bounded_int(raw.get("dp_size"), 1, 1024, "dp_size"),
                pp_size=_bounded_int(raw.get("pp_size"), 1, 1024, "pp_size"),
                page_size=None if raw.get("page_size") is None else _bounded_int(raw["page_size"], 1, 1 << 20,
                                                                                   "page_size"),
                kv_cache_dtype=None if raw.get("kv_cache_dtype") is None else str(raw["kv_cache_dtype"])[:64],
                follow_bootstrap_room=bool(raw.get("follow_bootstrap_room", True)),
                enable_dsa_cache_layer_split=bool(raw.get("enable_dsa_cache_layer_split", False)),
                prefill_http_port=None if raw.get("prefill_http_port") is None else _bounded_int(
                    raw["prefill_http_port"], 1, 65535, "prefill_http_port"))
        except ValueError as e:
            logger.error("prefill parallel info from %s is malformed: %s", bootstrap_addr, e)
            return False
        if info.page_size is not None and info.page_size != self.geometry.page_size:
            raise RuntimeError(f"Page size mismatch: prefill {info.page_size}, decode {self.geometry.page_size}")
        if info.kv_cache_dtype is not None and info.kv_cache_dtype != self.kv_cache_dtype_str:
            raise RuntimeError(f"KV cache dtype mismatch: prefill {info.kv_cache_dtype}, decode "
                               f"{self.kv_cache_dtype_str}")
        if info.attn_cp_size != 1 or info.pp_size != 1:
            raise RuntimeError(f"prefill instance {bootstrap_addr}: cp {info.attn_cp_size}, pp {info.pp_size}; "
                               "kvferry's backend serves cp 1, pp 1")
        if self.has_state and info.attn_tp_size != self.attn_tp_size:
            raise RuntimeError("state rows with unequal TP are not supported by kvferry (whole rows, no head slices)")
        self._resolve_rank_mapping(info)
        self._attach(bootstrap_addr, info.attn_tp_size, info.dp_size)
        self.prefill_info_table[bootstrap_addr] = info
        return True

    def _resolve_rank_mapping(self, info: PrefillServerInfo) -> None:
        """SGLang's decode-to-prefill TP mapping (which prefill ranks a decode rank hears from)."""
        me, mine, theirs = self.attn_tp_rank, self.attn_tp_size, info.attn_tp_size
        if mine == theirs:
            ranks, dst_num, resp = [me], 1, 1
        elif mine > theirs:
            ranks, dst_num, resp = [me // (mine // theirs)], mine // theirs, 1
        else:
            k = theirs // mine
            ranks, dst_num = list(range(me * k, (me + 1) * k)), 1
            resp = 1 if self.is_mla_backend else k
        info.target_tp_rank, info.target_tp_ranks = ranks[0], ranks
        info.target_cp_ranks, info.target_pp_ranks = [0], [0]
        info.required_dst_info_num, info.required_prefill_response_num = dst_num, resp

    def _track(self, room_obj) -> None:
        self._rooms[int(room_obj.bootstrap_room)] = room_obj

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool:
        """True once no prefill write can still land in the room's pages, aux and state rows
        (kvferry's release_safe; `required_acks` is SGLang's count and is not needed)."""
        r = self._rooms.get(int(bootstrap_room))
        return True if r is None else r.release_safe()

    def register_deferred_abort_room(self, bootstrap_room: int) -> None:
        pass  # kvferry tracks every room's drain itself

    def note_abort_ack(self, bootstrap_room: int, prefill_rank: int) -> None:
        pass

    def clear_deferred_abort_state(self, bootstrap_room: int) -> None:
        pass

    def check_status(self, bootstrap_room: int):
        r = self._rooms.get(int(bootstrap_room))
        return None if r is None else r.poll()

    def get_kv_replica_factor(self) -> int:
        return 1

    def _ensure_prefill_recompute_executor(self) -> concurrent.futures.ThreadPoolExecutor:
        """A small pool SGLang's decode submits its dp-rank queries to."""
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kvferry-sg")
            return self._executor

    def submit_prefill_recompute(self, kv_receiver, payload: dict) -> None:
        """PD retract rebootstrap is not supported: the receiver fails (SGLang logs it once)."""
        kv_receiver.abort()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        mgrs = [self._mgr] if self.role == "prefill" else list(self._managers.values()) + (
            [self._spare] if self._spare is not None else [])
        for m in mgrs:
            m.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)
