"""STAND-IN for vllm/config: the fields of VllmConfig kvferry's connector and this stand-in read
(names as vLLM's KVTransferConfig, ParallelConfig, CacheConfig, ModelConfig, SchedulerConfig)."""
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    kv_role: Optional[str] = None
    kv_connector_module_path: Optional[str] = None
    engine_id: Optional[str] = None
    kv_connector_extra_config: dict = field(default_factory=dict)
    kv_load_failure_policy: str = "recompute"
    kv_buffer_device: str = "cuda"

    def get_from_extra_config(self, key: str, default: Any) -> Any:
        return self.kv_connector_extra_config.get(key, default)

    @property
    def is_kv_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    data_parallel_index: int = 0
    decode_context_parallel_size: int = 1
    rank: int = 0


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: Optional[int] = None
    enable_prefix_caching: bool = False


@dataclass
class ModelConfig:
    num_layers: int = 2
    total_num_kv_heads: int = 4
    head_size: int = 8
    use_mla: bool = False

    def get_total_num_kv_heads(self) -> int:
        return self.total_num_kv_heads


@dataclass
class SchedulerConfig:
    disable_hybrid_kv_cache_manager: bool = False
    max_num_seqs: int = 64


@dataclass
class VllmConfig:
    model_config: ModelConfig = field(default_factory=ModelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler_config: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
