"""What kvferry's vLLM connector reads from vLLM's config, the environment and the KV cache
tensors (docs/vllm.md "Configuration").

Everything here runs at construction or at ``register_kv_caches``, so an unsupported setup fails
there with a message naming the setting, never at the first request. Inputs are duck-typed:
``vllm_config`` is vLLM's VllmConfig (kv_transfer_config, parallel_config, cache_config,
model_config), KV cache tensors are torch tensors or numpy arrays.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, List, Optional

from ..buffers import BufferDesc

TRUE = ("1", "true", "yes", "on")
DEFAULT_BOOTSTRAP_PORT = 8998
DEFAULT_LEASE_S = 30.0   # NIXL's kv_lease_duration default
# Aux (guard) rows of each kvferry manager: one per room in flight through it (the scheduler gives
# each room its own row, scheduler.AuxRows); a room with no free row waits (decode) or is not
# offered to decode (prefill).
AUX_ROWS = 4096

# kv_connector_extra_config keys, and the environment variables that stand in for them.
EXTRA_ENV = {
    "kvferry_bootstrap_host": "KVFERRY_BOOTSTRAP_HOST",    # prefill: its bootstrap service's host
    "kvferry_bootstrap_port": "KVFERRY_BOOTSTRAP_PORT",    # prefill: its port (+ the DP index)
    "kvferry_transport": "KVFERRY_TRANSPORT",              # "tcp" (default) or "shm" (one host)
    "kvferry_control_host": "KVFERRY_CONTROL_HOST",        # host each worker's control socket advertises
    "kvferry_decode_tp_size": "KVFERRY_PEER_TP_SIZE",      # prefill: the decode engine's TP size
    "kvferry_kv_memory": "KVFERRY_KV_MEMORY",              # "cuda" / "host" (default: the tensors')
    "kvferry_max_prefill_instances": "KVFERRY_MAX_PREFILL_INSTANCES",
    "kvferry_log_file": "KVFERRY_LOG_FILE",
    "kvferry_transfer_shards": "KVFERRY_TRANSFER_SHARDS",
    "kvferry_aux_rows": "KVFERRY_AUX_ROWS",                # rooms in flight per kvferry manager
    "kvferry_integrity": "KVFERRY_INTEGRITY",              # end-to-end integrity (both engines alike)
    # prefill: seconds after a room's opening past which decode's renewals no longer hold its
    # blocks (default 10 x kv_lease_duration; kvferry's renew_limit, docs/vllm.md "The lease")
    "kvferry_lease_limit": "KVFERRY_LEASE_LIMIT",
    # Tests only: kvferry's fault-injecting transport (inject_write_failure, hold_writes). Off by
    # default; never on in an engine's default path.
    "kvferry_fault_injection": "KVFERRY_FAULT_INJECTION",
}


class UnsupportedConfiguration(ValueError):
    """A vLLM setting kvferry's connector does not support (yet); the message names it."""


def _extra(kv_transfer_config) -> dict:
    extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
    return dict(extra) if isinstance(extra, dict) else {}


@dataclasses.dataclass
class Settings:
    role: str                 # vLLM's kv_role: kv_producer, kv_consumer, kv_both
    engine_id: str
    tp_size: int
    dp_index: int
    block_size: int
    lease_s: float
    bootstrap_host: str
    bootstrap_port: int
    transport: str
    control_host: str
    decode_tp_size: int
    kv_memory: str            # "" (from the tensors), "cuda" or "host"
    max_prefill_instances: int
    log_file: str
    transfer_shards: int
    fault_injection: bool
    load_failure_policy: str  # vLLM's kv_load_failure_policy ("recompute" or "fail")
    aux_rows: int = AUX_ROWS  # aux rows of each kvferry manager (rooms in flight through it)
    integrity: bool = False   # KVManager(integrity=...): end-to-end integrity
    lease_limit_s: float = 0.0  # prefill: renewals end this long after a room's opening (0: 10 x lease_s)

    @property
    def produces(self) -> bool:
        return self.role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        return self.role in ("kv_consumer", "kv_both")

    @property
    def bootstrap_address(self) -> str:
        h = self.bootstrap_host
        return f"[{h}]:{self.bootstrap_port}" if ":" in h else f"{h}:{self.bootstrap_port}"


def _num(v: Any, what: str, lo: float, hi: float, kind=int):
    try:
        x = kind(v)
    except (TypeError, ValueError):
        raise UnsupportedConfiguration(f"{what}: {v!r} is not a number") from None
    if not lo <= x <= hi:
        raise UnsupportedConfiguration(f"{what}: {x} is outside {lo}..{hi}")
    return x


def settings_of(vllm_config) -> Settings:
    """Reads and checks the setup; raises UnsupportedConfiguration naming what is refused."""
    ktc = vllm_config.kv_transfer_config
    extra = _extra(ktc)

    def get(key: str, default: str = "") -> str:
        v = extra.get(key)
        return str(v) if v is not None else os.environ.get(EXTRA_ENV.get(key, ""), default)

    par = vllm_config.parallel_config
    refuse = lambda what, why: UnsupportedConfiguration(f"kvferry connector: {what} is not supported: {why} "
                                                        "(docs/vllm.md)")
    if int(getattr(par, "pipeline_parallel_size", 1) or 1) > 1:
        raise refuse(f"pipeline_parallel_size {par.pipeline_parallel_size}", "pipeline-parallel transfers are "
                     "not implemented")
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if int(getattr(par, name, 1) or 1) > 1:
            raise refuse(f"{name} {getattr(par, name)}", "context parallelism is not implemented")
    role = getattr(ktc, "kv_role", None)
    if role not in ("kv_producer", "kv_consumer", "kv_both"):
        raise refuse(f"kv_role {role!r}", "use kv_producer (prefill), kv_consumer (decode) or kv_both")
    tp = int(getattr(par, "tensor_parallel_size", 1) or 1)
    dp_index = int(getattr(par, "data_parallel_index", getattr(par, "data_parallel_rank", 0)) or 0)
    memory = get("kvferry_kv_memory")
    if memory not in ("", "cuda", "host"):
        raise refuse(f"kvferry_kv_memory {memory!r}", "use 'cuda' or 'host'")
    policy = getattr(ktc, "kv_load_failure_policy", None) or "recompute"
    return Settings(
        role=role, engine_id=str(getattr(ktc, "engine_id", None) or "0"), tp_size=tp, dp_index=dp_index,
        block_size=int(vllm_config.cache_config.block_size),
        lease_s=_num(extra.get("kv_lease_duration", DEFAULT_LEASE_S), "kv_lease_duration", 0.05, 86400, float),
        bootstrap_host=get("kvferry_bootstrap_host") or get("kvferry_control_host") or "127.0.0.1",
        bootstrap_port=_num(get("kvferry_bootstrap_port") or DEFAULT_BOOTSTRAP_PORT, "kvferry_bootstrap_port",
                            1, 65535) + dp_index,
        transport=get("kvferry_transport", "tcp"), control_host=get("kvferry_control_host"),
        decode_tp_size=_num(get("kvferry_decode_tp_size") or tp, "kvferry_decode_tp_size", 1, 1024),
        kv_memory=memory,
        max_prefill_instances=_num(get("kvferry_max_prefill_instances", "8"), "kvferry_max_prefill_instances", 1,
                                   256),
        log_file=get("kvferry_log_file"),
        transfer_shards=_num(get("kvferry_transfer_shards", "1"), "kvferry_transfer_shards", 1, 8),
        fault_injection=get("kvferry_fault_injection", "0").lower() in TRUE, load_failure_policy=str(policy),
        aux_rows=_num(get("kvferry_aux_rows") or AUX_ROWS, "kvferry_aux_rows", 1, 1 << 20),
        integrity=get("kvferry_integrity", "0").lower() in TRUE,
        lease_limit_s=_num(get("kvferry_lease_limit") or 0, "kvferry_lease_limit", 0, 864000, float))


def check_kv_cache_config(kv_cache_config) -> None:
    """One KV cache group (full attention or MLA): hybrid models are refused."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) > 1:
        raise UnsupportedConfiguration(
            f"kvferry connector: {len(groups)} KV cache groups (a hybrid model: sliding window, Mamba) are not "
            "supported: kvferry moves one group of per-layer KV tensors (docs/vllm.md)")


@dataclasses.dataclass
class Geometry:
    """kvferry's view of the registered KV caches (one 'head' = head_bytes bytes of one token)."""
    attention: str            # "GQA" or "MLA"
    num_layers: int
    tensors_per_layer: int    # 2 (K, V) or 1 (MLA latent)
    total_heads: int
    heads_per_rank: int
    head_bytes: int
    block_size: int
    num_blocks: int
    memory: str               # "host" or "cuda"
    descs: List[BufferDesc]   # every layer's K, then every layer's V (MLA: every layer's latent)

    @property
    def model_name(self) -> str:
        return f"vllm-{self.attention}-L{self.num_layers}-H{self.total_heads}-B{self.head_bytes}"

    def manager_kwargs(self) -> dict:
        return dict(num_layers=self.num_layers, num_kv_heads=self.total_heads, head_dim=self.head_bytes,
                    dtype_bytes=1, tensors_per_layer=self.tensors_per_layer, attention=self.attention,
                    page_size=self.block_size, model_name=self.model_name)


def _tensor(t) -> tuple:
    """(address, shape, item bytes, C-contiguous, memory kind) of a torch tensor or numpy array."""
    if hasattr(t, "data_ptr"):  # torch
        dev = getattr(getattr(t, "device", None), "type", "cpu")
        return (int(t.data_ptr()), tuple(int(x) for x in t.shape), int(t.element_size()), bool(t.is_contiguous()),
                "host" if dev == "cpu" else dev)
    return (int(t.ctypes.data), tuple(int(x) for x in t.shape), int(t.itemsize), bool(t.flags.c_contiguous), "host")


def layer_order(names: List[str]) -> List[str]:
    """Layer names in model order: by their layer index when every name has one (vLLM's
    "model.layers.N...."), else as given."""
    idx = [re.findall(r"\d+", n) for n in names]
    if all(idx):
        return [n for _, n in sorted(zip((int(i[0]) for i in idx), names))]
    return list(names)


def geometry_of(kv_caches: Dict[str, Any], block_size: int, total_heads: Optional[int], memory: str) -> Geometry:
    """Reads the per-layer KV cache tensors vLLM registers. Supported: FlashAttention's
    (2, num_blocks, block_size, kv_heads, head_size) per layer (NHD: a block is token-major, K
    and V each contiguous) and MLA's (num_blocks, block_size, head_size). Raises
    UnsupportedConfiguration for any other shape (naming the layer)."""
    if not kv_caches:
        raise UnsupportedConfiguration("kvferry connector: no KV cache tensors were registered")
    names = layer_order(list(kv_caches))
    infos = [(n, _tensor(kv_caches[n])) for n in names]
    shapes = {info[1] for _, info in infos}
    if len(shapes) != 1:
        raise UnsupportedConfiguration(f"kvferry connector: layers of different shapes {sorted(shapes)}")
    shape = infos[0][1][1]
    mems = {info[4] for _, info in infos}
    kind = memory or ("host" if mems == {"host"} else "cuda")
    for n, (_, _, _, contiguous, _) in infos:
        if not contiguous:
            raise UnsupportedConfiguration(f"kvferry connector: the KV cache of {n} is not contiguous")
    item = infos[0][1][2]
    if len(shape) == 5 and shape[0] == 2 and shape[2] == block_size:
        _, blocks, bs, heads, hsize = shape
        attention, per_layer, heads_total = "GQA", 2, int(total_heads or 0)
        if heads_total <= 0:
            raise UnsupportedConfiguration("kvferry connector: the model's total KV heads are unknown")
    elif len(shape) == 3 and shape[1] == block_size:
        blocks, bs, hsize = shape
        heads, attention, per_layer, heads_total = 1, "MLA", 1, 1
    else:
        raise UnsupportedConfiguration(
            f"kvferry connector: KV cache tensors of shape {shape} (block size {block_size}) are not supported: "
            "it needs (2, num_blocks, block_size, kv_heads, head_size) per layer (FlashAttention, NHD layout) or "
            "(num_blocks, block_size, head_size) (MLA)")
    head_bytes = hsize * item
    block_bytes = bs * heads * head_bytes
    descs: List[BufferDesc] = []
    for t in range(per_layer):  # every layer's K, then every layer's V
        for _, (addr, _, _, _, _) in infos:
            descs.append(BufferDesc(addr + t * blocks * block_bytes, blocks * block_bytes, block_bytes, "kv", kind))
    return Geometry(attention, len(infos), per_layer, heads_total, heads, head_bytes, block_size, blocks, kind, descs)
