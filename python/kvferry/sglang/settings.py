"""What kvferry's SGLang backend reads from SGLang's objects and the environment (docs/sglang.md).

Everything here runs at KVManager construction, so an unsupported setup fails there with a message
that names the setting, never at the first request. Inputs are duck-typed: ``server_args`` is
SGLang's ServerArgs (or anything with its attribute names), ``kv_args`` SGLang's KVArgs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..buffers import BufferDesc

TRUE = ("1", "true", "yes", "on")

# Environment variables of the backend and their defaults (docs/sglang.md "Environment").
ENV_DEFAULTS = {
    "KVFERRY_TRANSPORT": "tcp",            # "tcp" (across hosts) or "shm" (one host)
    "KVFERRY_KV_MEMORY": "cuda",           # where KVArgs.kv_data_ptrs live: "cuda" or "host"
    "KVFERRY_AUX_MEMORY": "host",          # SGLang's metadata buffers are host memory
    "KVFERRY_STATE_MEMORY": "cuda",
    "KVFERRY_CONTROL_HOST": "",            # advertised host of each rank's control socket ("": loopback)
    "KVFERRY_CONTROL_BIND": "",            # its bind host ("": the advertised host, else loopback)
    "KVFERRY_PEER_TP_SIZE": "",            # prefill: the decode engine's attention TP size ("": own)
    "KVFERRY_PEER_DP_SIZE": "",            # prefill: the decode engine's DP size under DP attention ("": 1)
    "KVFERRY_TOTAL_KV_HEADS": "",          # the model's KV heads when KVArgs does not carry them
    "KVFERRY_TRANSFER_SHARDS": "1",
    "KVFERRY_MAX_PREFILL_INSTANCES": "8",  # decode: prefill instances one decode rank serves
    "KVFERRY_LOG_FILE": "",                # JSON-lines log of each rank ("{rank}" is replaced)
    "KVFERRY_SGLANG_ALLOW_EAGER_RELEASE": "0",
    # End-to-end integrity (KVManager(integrity=True); SGLang's --disaggregation-enable-kv-checksum
    # does the same job): both engines should set it alike (docs/failure-model.md "Integrity").
    "KVFERRY_INTEGRITY": "0",
    # Tests only: wrap the transport in the fault-injecting decorator (the manager's
    # inject_write_failure / hold_writes hooks). Never on in an engine's default path.
    "KVFERRY_FAULT_INJECTION": "0",
}


def env(name: str) -> str:
    return os.environ.get(name, ENV_DEFAULTS.get(name, ""))


class UnsupportedConfiguration(ValueError):
    """A feature SGLang is configured to use that kvferry's backend does not support (yet)."""


def mode_name(mode) -> str:
    """SGLang's DisaggregationMode (or its value) as "prefill" / "decode"."""
    v = getattr(mode, "value", mode)
    if v not in ("prefill", "decode"):
        raise UnsupportedConfiguration(f"disaggregation_mode {mode!r}: kvferry serves 'prefill' and 'decode'")
    return v


def _int_attr(obj, name: str, default: int) -> int:
    v = getattr(obj, name, None)
    return default if v is None else int(v)


@dataclass
class Parallel:
    """This rank's place in its engine, as SGLang's CommonKVManager derives it (common/conn.py
    CommonKVManager.__init__: attn_tp_size/rank from its parallel state, attn_dp_size/rank from
    get_attention_dp_size/rank, layers/dp_attention.py compute_dp_attention_world_info)."""
    attn_tp_size: int
    attn_tp_rank: int
    attn_cp_size: int
    attn_dp_size: int
    pp_size: int
    pp_rank: int
    attn_dp_rank: int = 0


def load_balance_method(server_args, role: str) -> str:
    """SGLang's --load-balance-method as its ServerArgs resolves "auto" (server_args.py
    _handle_load_balance_method: prefill follow_bootstrap_room, decode round_robin)."""
    m = getattr(server_args, "load_balance_method", None) or "auto"
    if m == "auto":
        return "follow_bootstrap_room" if role == "prefill" else "round_robin"
    return str(m)


def parallel_of(kv_args, server_args) -> Parallel:
    tp = _int_attr(server_args, "tp_size", 1)
    dp = _int_attr(server_args, "dp_size", 1)
    dp_attention = bool(getattr(server_args, "enable_dp_attention", False))
    attn_dp = dp if dp_attention and dp > 1 else 1
    attn_tp = max(1, tp // attn_dp)
    # Under DP attention the scheduler of attention DP rank d is launched with dp_rank d
    # (data_parallel_controller.py launch_tensor_parallel_group), and prefill.py / decode.py
    # _init_kv_manager put it in KVArgs.system_dp_rank; prefill's engine_rank is the global TP rank
    # (decode's is the rank in its attention TP group).
    attn_dp_rank = _int_attr(kv_args, "system_dp_rank", 0) if attn_dp > 1 else 0
    return Parallel(attn_tp_size=attn_tp, attn_tp_rank=_int_attr(kv_args, "engine_rank", 0) % attn_tp,
                    attn_cp_size=_int_attr(server_args, "attn_cp_size", 1), attn_dp_size=attn_dp,
                    pp_size=_int_attr(server_args, "pp_size", 1), pp_rank=_int_attr(kv_args, "pp_rank", 0),
                    attn_dp_rank=attn_dp_rank)


def peer_dp_size(role: str, par: Parallel) -> int:
    """Prefill: the decode engine's DP size (KVFERRY_PEER_DP_SIZE, default 1: SGLang does not tell
    a prefill the decode's). Decode learns the prefill's from its bootstrap service."""
    v = env("KVFERRY_PEER_DP_SIZE") if role == "prefill" else ""
    try:
        n = int(v) if v else 1
    except ValueError:
        raise UnsupportedConfiguration(f"KVFERRY_PEER_DP_SIZE={v!r} is not an integer") from None
    if not 1 <= n <= 1024:
        raise UnsupportedConfiguration(f"KVFERRY_PEER_DP_SIZE={n} is outside 1..1024")
    return n


def check_supported(role: str, kv_args, server_args, par: Parallel) -> None:
    """Raises UnsupportedConfiguration for what the backend cannot do, naming the setting."""
    def refuse(what: str, why: str):
        raise UnsupportedConfiguration(f"kvferry backend: {what} is not supported: {why} (docs/sglang.md)")

    dp = _int_attr(server_args, "dp_size", 1)
    if dp > 1 and not getattr(server_args, "enable_dp_attention", False):
        refuse(f"--dp-size {dp} without --enable-dp-attention",
               "SGLang's system DP (a full TP replica per DP rank, registered by system_dp_rank) is not "
               "implemented; DP attention is")
    if dp > 1:
        tp = _int_attr(server_args, "tp_size", 1)
        if tp % dp:
            refuse(f"--dp-size {dp} with --tp-size {tp}", "DP attention needs the TP size to be a multiple of it")
        if not 0 <= par.attn_dp_rank < dp:
            refuse(f"KVArgs.system_dp_rank {par.attn_dp_rank}", f"outside --dp-size {dp}")
        engine_rank = _int_attr(kv_args, "engine_rank", 0)
        if role == "prefill" and engine_rank // par.attn_tp_size != par.attn_dp_rank:
            refuse(f"KVArgs.engine_rank {engine_rank} with system_dp_rank {par.attn_dp_rank}",
                   f"prefill's TP rank {engine_rank} is in attention DP rank {engine_rank // par.attn_tp_size}")
        if role == "decode" and load_balance_method(server_args, role) != "follow_bootstrap_room":
            refuse(f"decode --dp-size {dp} with --load-balance-method {load_balance_method(server_args, role)}",
                   "kvferry's prefill writes a room to decode DP rank bootstrap_room % dp-size (kvferry/routing.h); "
                   "start decode with --load-balance-method follow_bootstrap_room")
    if par.pp_size > 1:
        refuse(f"--pp-size {par.pp_size}", "pipeline-parallel transfers are not implemented")
    if par.attn_cp_size > 1 or _int_attr(server_args, "dcp_size", 1) > 1:
        refuse("context parallelism (--attn-cp-size/--dcp-size)", "not implemented")
    if role == "decode" and getattr(server_args, "disaggregation_decode_enable_radix_cache", False):
        refuse("--disaggregation-decode-enable-radix-cache",
               "a decode prefix (decode_prefix_len) is not carried in kvferry's room metadata")
    if os.environ.get("SGLANG_RUST_SERVER", "").lower() in TRUE:
        refuse("SGLANG_RUST_SERVER", "its bootstrap registry does not serve kvferry's rank routes")
    if os.environ.get("SGLANG_DISAGG_STAGING_BUFFER", "").lower() in TRUE:
        refuse("SGLANG_DISAGG_STAGING_BUFFER", "kvferry writes head slices directly, without staging")
    if getattr(kv_args, "mla_compression_ratios", None):
        refuse("compressed MLA pools (DeepSeek V4)", "their buffers are not organized by layer")
    state_types = list(getattr(kv_args, "state_types", None) or [])
    if len(state_types) > 1:
        refuse(f"{len(state_types)} state types {state_types}", "kvferry sends one list of state rows per room")
    if (role == "decode" and os.environ.get("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "").lower()
            not in TRUE and env("KVFERRY_SGLANG_ALLOW_EAGER_RELEASE").lower() not in TRUE):
        refuse("decode without SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1",
               "a failed room's pages may only be freed once release-safe (a prefill write may still land); set "
               "it, or KVFERRY_SGLANG_ALLOW_EAGER_RELEASE=1 to accept the risk")


@dataclass
class Geometry:
    """kvferry's view of the KV buffers: one 'head' is head_bytes bytes of one token."""
    attention: str          # "MLA" or "GQA"
    num_layers: int
    tensors_per_layer: int
    total_heads: int
    heads_per_rank: int
    head_bytes: int
    page_size: int

    def manager_kwargs(self) -> dict:
        return dict(num_layers=self.num_layers, num_kv_heads=self.total_heads, head_dim=self.head_bytes,
                    dtype_bytes=1, tensors_per_layer=self.tensors_per_layer, attention=self.attention,
                    page_size=self.page_size,
                    model_name=f"sglang-{self.attention}-L{self.num_layers}-H{self.total_heads}-B{self.head_bytes}")


def _model_total_kv_heads(server_args) -> Optional[int]:
    try:  # inside SGLang: its model config knows the KV heads
        from sglang.srt.configs.model_config import ModelConfig  # type: ignore
    except Exception:
        return None
    try:
        return int(ModelConfig.from_server_args(server_args).get_total_num_kv_heads())
    except Exception:
        return None


def geometry_of(kv_args, server_args, is_mla: bool, par: Parallel) -> Geometry:
    ptrs = list(getattr(kv_args, "kv_data_ptrs", None) or [])
    items = sorted({int(x) for x in (getattr(kv_args, "kv_item_lens", None) or [])})
    page_size = int(getattr(kv_args, "page_size", 0) or 0)
    if not ptrs or len(items) != 1 or page_size <= 0:
        raise UnsupportedConfiguration(
            f"KVArgs: need KV buffers of one item length and a page size (got {len(ptrs)} buffers, item lengths "
            f"{items}, page_size {page_size})")
    item = items[0]
    if is_mla:
        layers, per_layer, total, per_rank = len(ptrs), 1, 1, 1
    else:
        if len(ptrs) % 2:
            raise UnsupportedConfiguration(f"KVArgs: {len(ptrs)} KV buffers; MHA/GQA has every layer's K then V")
        layers, per_layer = len(ptrs) // 2, 2
        total = getattr(kv_args, "total_kv_head_num", None) or (int(env("KVFERRY_TOTAL_KV_HEADS") or 0) or None) \
            or _model_total_kv_heads(server_args)
        if not total:
            raise UnsupportedConfiguration(
                "the model's KV heads are unknown: KVArgs.total_kv_head_num is not set (SGLang's decode leaves it "
                "unset) and SGLang's model config could not be read; set KVFERRY_TOTAL_KV_HEADS")
        total = int(total)
        per_rank = getattr(kv_args, "kv_head_num", None)
        per_rank = int(per_rank) if per_rank else max(1, total // par.attn_tp_size)
        want = max(1, total // par.attn_tp_size)
        if total % par.attn_tp_size and par.attn_tp_size % total:
            raise UnsupportedConfiguration(f"{total} KV heads do not split over attention TP {par.attn_tp_size}")
        if per_rank != want:
            raise UnsupportedConfiguration(f"KVArgs.kv_head_num {per_rank} is not {total} heads over TP "
                                           f"{par.attn_tp_size} ({want})")
    if item % (page_size * per_rank):
        raise UnsupportedConfiguration(f"KV item length {item} is not page_size {page_size} x {per_rank} heads")
    return Geometry("MLA" if is_mla else "GQA", layers, per_layer, total, per_rank, item // (page_size * per_rank),
                    page_size)


def gpu_id_of(kv_args) -> int:
    """KVArgs.gpu_id: the CUDA device this rank's device buffers are on (SGLang's scheduler sets it
    to the ordinal it passes to torch.cuda.set_device; 0 where it is not set)."""
    v = getattr(kv_args, "gpu_id", None)
    if v is None:
        return 0
    try:
        g = int(v)
    except (TypeError, ValueError):
        g = -1
    if g < 0:
        raise UnsupportedConfiguration(f"KVArgs.gpu_id {v!r} is not a CUDA device ordinal")
    return g


def buffer_descs(kv_args) -> list:
    """KVArgs' KV, aux and state pointers as kvferry BufferDescs (memory kinds from the environment;
    device memory on KVArgs.gpu_id)."""
    def kind(name: str) -> str:
        v = env(name)
        if v not in ("host", "cuda"):
            raise UnsupportedConfiguration(f"{name}={v!r}: use 'host' or 'cuda'")
        return v

    gpu_id = gpu_id_of(kv_args)

    def flat(v):
        out = []
        for x in v or []:
            out.extend(flat(x) if isinstance(x, (list, tuple)) else [int(x)])
        return out

    descs = []
    for k, mem in (("kv", kind("KVFERRY_KV_MEMORY")), ("aux", kind("KVFERRY_AUX_MEMORY")),
                   ("state", kind("KVFERRY_STATE_MEMORY"))):
        ptrs = flat(getattr(kv_args, f"{k}_data_ptrs", None))
        lens = flat(getattr(kv_args, f"{k}_data_lens", None))
        items = flat(getattr(kv_args, f"{k}_item_lens", None))
        if not len(ptrs) == len(lens) == len(items):
            raise UnsupportedConfiguration(f"KVArgs: {len(ptrs)} {k} pointers, {len(lens)} lengths, "
                                           f"{len(items)} item lengths")
        for i, (p, n, item) in enumerate(zip(ptrs, lens, items)):
            if p <= 0 or n <= 0 or item <= 0 or item > n:
                raise UnsupportedConfiguration(f"KVArgs: {k}[{i}] has address {p:#x}, {n} bytes, item {item}")
            descs.append(BufferDesc(p, n, item, k, mem, gpu_id if mem == "cuda" else 0))
    return descs


def deadlines_from_sglang_env() -> dict:
    """SGLang's timeouts (seconds) as kvferry deadlines, where no KVFERRY_* variable sets them."""
    out = {}
    for sg, kf in (("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "bootstrap_timeout_ms"),
                   ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "waiting_timeout_ms")):
        v = os.environ.get(sg)
        if v and not os.environ.get("KVFERRY_" + kf.upper()):
            out[kf] = max(1, int(float(v) * 1000))
    return out
