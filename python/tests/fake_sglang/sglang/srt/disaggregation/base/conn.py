"""STAND-IN for sglang.srt.disaggregation.base.conn and the parts of common/conn.py that SGLang's
schedulers read from a backend: the signatures (names, parameters, defaults) of the interface
kvferry's backend implements. Bodies are empty; only the shapes matter (test_sglang_interface.py)."""
import dataclasses
from abc import ABC, abstractmethod
from typing import Dict, List, Optional


@dataclasses.dataclass
class KVTransferMetric:
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


class KVArgs:
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


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class BaseKVManager(ABC):
    @abstractmethod
    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False): ...

    @abstractmethod
    def register_to_bootstrap(self): ...

    # read by SGLang's decode from the common base
    def try_ensure_parallel_info(self, bootstrap_addr: str) -> bool: ...

    def is_abort_release_safe(self, bootstrap_room: int, required_acks: int) -> bool: ...

    def _ensure_prefill_recompute_executor(self): ...

    def submit_prefill_recompute(self, kv_receiver, payload: dict) -> None: ...


class BaseKVSender(ABC):
    @abstractmethod
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: List[int], pp_rank: int,
                 req_has_disagg_prefill_dp_rank: bool = False): ...

    @abstractmethod
    def init(self, num_kv_indices: int, aux_index: Optional[int] = None): ...

    @abstractmethod
    def send(self, kv_indices, state_indices: Optional[List] = None, num_kv_tokens: Optional[int] = None): ...

    def pop_decode_prefix_len(self) -> int: ...

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool: ...

    @abstractmethod
    def get_transfer_metric(self) -> KVTransferMetric: ...

    @abstractmethod
    def poll(self) -> KVPoll: ...

    @abstractmethod
    def failure_exception(self): ...

    def clear(self): ...

    def abort(self): ...


class BaseKVReceiver(ABC):
    @abstractmethod
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: Optional[int] = None): ...

    @abstractmethod
    def init(self, prefill_dp_rank: int): ...

    @abstractmethod
    def send_metadata(self, kv_indices, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None): ...

    @abstractmethod
    def poll(self) -> KVPoll: ...

    @abstractmethod
    def failure_exception(self): ...

    def clear(self): ...

    def abort(self): ...

    @staticmethod
    def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: List[int]) -> Dict[str, int]: ...


class BaseKVBootstrapServer(ABC):
    @abstractmethod
    def __init__(self, host: str, port: int): ...


# Attributes SGLang's schedulers read from the common base (not methods).
MANAGER_ATTRS_DECODE = ("kv_args", "prefill_info_table", "enable_staging")
MANAGER_ATTRS_PREFILL = ("kv_args", "transfer_infos", "is_dummy_cp_rank")
RECEIVER_ATTRS = ("conclude_state", "abort_notified", "bootstrap_infos", "require_staging", "kv_mgr",
                  "bootstrap_room", "bootstrap_addr")
SENDER_ATTRS = ("kv_mgr", "bootstrap_room", "conclude_state")
PREFILL_INFO_FIELDS = ("attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype",
                       "follow_bootstrap_room", "enable_dsa_cache_layer_split", "prefill_http_port",
                       "target_tp_rank", "target_tp_ranks", "target_cp_ranks", "target_pp_ranks",
                       "required_dst_info_num", "required_prefill_response_num")
