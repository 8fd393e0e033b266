"""STAND-IN for vllm/v1/kv_cache_interface.py: KVCacheConfig with its groups."""
from dataclasses import dataclass, field


@dataclass
class FullAttentionSpec:
    block_size: int


@dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: object


@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list = field(default_factory=list)
    kv_cache_groups: list = field(default_factory=list)
