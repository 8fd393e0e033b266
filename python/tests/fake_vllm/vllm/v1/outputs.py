"""STAND-IN for vllm/v1/outputs.py: KVConnectorOutput (field names as vLLM's) and ModelRunnerOutput."""
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class KVConnectorOutput:
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set = field(default_factory=set)
    expected_finished_count: int = 0

    def is_empty(self):
        return not (self.finished_sending or self.finished_recving or self.kv_connector_stats
                    or self.invalid_block_ids)


@dataclass
class ModelRunnerOutput:
    req_ids: list
    sampled_token_ids: dict = field(default_factory=dict)   # req_id -> [token]
    kv_connector_output: Optional[KVConnectorOutput] = None
    extra: dict = field(default_factory=dict)                # the test model's checks (not vLLM's)
