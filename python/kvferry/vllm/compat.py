"""vLLM's connector base types, or stand-ins with the same names when vLLM is not importable.

kvferry imports without vLLM. Inside vLLM, ``KvferryConnector`` must be a ``KVConnectorBase_V1``
and a ``SupportsHMA`` (vLLM's factory refuses a connector that is not ``SupportsHMA`` while the
hybrid KV cache manager is on), its metadata a ``KVConnectorMetadata`` and its stats a
``KVConnectorStats``: those come from vLLM's own modules
(vllm/distributed/kv_transfer/kv_connector/v1/base.py and v1/metrics.py). Without vLLM the
stand-ins below give the same method names, so the connector can be built and driven in tests
and tools; ``HAVE_VLLM`` says which is in use.
"""
from __future__ import annotations

import enum
from typing import Any, Optional

try:  # vLLM's base module (imports torch): the real classes.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, SupportsHMA)
    HAVE_VLLM = True
except ImportError:
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        """vLLM's roles: one connector instance per role, in separate processes."""
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """What the scheduler-side connector hands the worker-side one each step."""

    class SupportsHMA:  # type: ignore[no-redef]
        """Marks a connector that takes every KV cache group's blocks (request_finished_all_groups)."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """The method names of vLLM's KVConnectorBase_V1 that a connector overrides or inherits."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self):
            return self._role

        def bind_connector_metadata(self, connector_metadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self):
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def get_finished_count(self) -> Optional[int]:
            return None

        def take_events(self):
            return ()

        def get_kv_connector_kv_cache_events(self):
            return None

        def build_connector_worker_meta(self):
            return None

        def get_handshake_metadata(self):
            return None

        def handle_preemptions(self, kv_connector_metadata) -> None:
            return None

        @classmethod
        def build_kv_connector_stats(cls, data: Optional[dict] = None):
            return None

try:  # vLLM's stats base (aggregated by vLLM across workers and steps).
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore
except ImportError:
    from dataclasses import dataclass, field

    @dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        """vLLM's KVConnectorStats shape: a ``data`` dict and reset/aggregate/reduce/is_empty."""
        data: dict[str, Any] = field(default_factory=dict)

__all__ = ["HAVE_VLLM", "KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole", "SupportsHMA",
           "KVConnectorStats"]
