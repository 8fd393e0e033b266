"""STAND-IN for vllm/v1/core/sched/output.py: what the scheduler hands the workers each step."""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list = field(default_factory=list)
    scheduled_cached_reqs: dict = field(default_factory=dict)   # req_id -> (block_ids, num_computed_tokens)
    num_scheduled_tokens: dict = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    finished_req_ids: set = field(default_factory=set)
    preempted_req_ids: set = field(default_factory=set)
    kv_connector_metadata: Any = None
