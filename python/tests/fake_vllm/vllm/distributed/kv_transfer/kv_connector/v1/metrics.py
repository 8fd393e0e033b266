"""STAND-IN for vllm/distributed/kv_transfer/kv_connector/v1/metrics.py: KVConnectorStats, a
dataclass with a ``data`` dict that connectors subclass (reset, aggregate, reduce, is_empty)."""
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError
