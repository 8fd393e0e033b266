"""KvferryConnector: kvferry as vLLM's KV connector (docs/vllm.md).

vLLM loads it by module path, in both rules of its factory
(vllm/distributed/kv_transfer/kv_connector/factory.py): ``"kv_connector": "KvferryConnector",
"kv_connector_module_path": "kvferry.vllm"``. One instance per role and process: the scheduler's
(kvferry.vllm.scheduler) and each TP worker's (kvferry.vllm.worker); this class only routes vLLM's
calls to the half its role has. It is a ``KVConnectorBase_V1`` and ``SupportsHMA`` from vLLM when
vLLM is importable (kvferry.vllm.compat), so the factory accepts it while the hybrid KV cache
manager is on; a model with more than one KV cache group is refused at construction.
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Optional, Set, Tuple

from .compat import KVConnectorBase_V1, KVConnectorRole, SupportsHMA
from .config import UnsupportedConfiguration, check_kv_cache_config, settings_of
from .metadata import KvferryConnectorMetadata, KvferryConnectorStats
from .params import manager_key
from .scheduler import SchedulerSide
from .worker import WorkerSide

_BASE_TAKES_KV_CACHE_CONFIG = "kv_cache_config" in inspect.signature(KVConnectorBase_V1.__init__).parameters


def _is_scheduler(role) -> bool:
    return getattr(role, "name", role) == "SCHEDULER"


class KvferryConnector(KVConnectorBase_V1, SupportsHMA):
    """kvferry's KV connector: prefill pushes each request's KV into decode's blocks."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        if _BASE_TAKES_KV_CACHE_CONFIG:
            super().__init__(vllm_config, role, kv_cache_config)
        else:  # an older vLLM: (vllm_config, role)
            super().__init__(vllm_config, role)
        self.settings = settings_of(vllm_config)
        check_kv_cache_config(kv_cache_config)
        self.kv_cache_config = kv_cache_config
        self._scheduler: Optional[SchedulerSide] = None
        self._worker: Optional[WorkerSide] = None
        if _is_scheduler(role):
            self._scheduler = SchedulerSide(self.settings)
        else:
            self._worker = WorkerSide(self.settings, vllm_config)

    def kvferry_manager(self, prefill_bootstrap: Optional[str] = None):
        """The worker's kvferry manager: prefill's (no argument), or decode's for that prefill
        instance (None before its first room). For tools and tests (fault injection hooks)."""
        w = self._worker
        if w is None:
            return None
        if prefill_bootstrap is None:
            return w.prefill
        return w.decode.get(manager_key(prefill_bootstrap))

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config) -> Optional[str]:
        """NHD (a block is token-major, so a TP rank's heads are a slice of every token): kvferry
        writes head slices between unequal TP sizes. MLA: no preference."""
        mc = getattr(vllm_config, "model_config", None)
        return None if mc is not None and getattr(mc, "use_mla", False) else "NHD"

    # -- scheduler side --------------------------------------------------------------------------

    def _sched(self) -> SchedulerSide:
        if self._scheduler is None:
            raise RuntimeError("a scheduler-side call on kvferry's worker connector")
        return self._scheduler

    def on_new_request(self, request) -> None:
        self._sched().on_new_request(request)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[int, bool]:
        return self._sched().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        self._sched().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvferryConnectorMetadata:
        return self._sched().build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output) -> None:
        self._sched().update_connector_output(connector_output)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[Dict[str, Any]]]:
        return self._sched().request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids) -> Tuple[bool, Optional[Dict[str, Any]]]:
        groups = [g for g in (block_ids or ()) if len(g)]
        if len(groups) > 1:
            raise UnsupportedConfiguration("kvferry connector: blocks of several KV cache groups (docs/vllm.md)")
        return self._sched().request_finished(request, groups[0] if groups else [])

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_push_work()

    def get_finished_count(self) -> Optional[int]:
        return None  # every worker reports every request (the world size)

    # -- worker side -----------------------------------------------------------------------------

    def _work(self) -> WorkerSide:
        if self._worker is None:
            raise RuntimeError("a worker-side call on kvferry's scheduler connector")
        return self._worker

    def register_kv_caches(self, kv_caches) -> None:
        self._work().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._connector_metadata
        self._work().start_load_kv(meta if isinstance(meta, KvferryConnectorMetadata) else None)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Nothing to wait for: a request is scheduled on decode only once its whole room arrived."""
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        self._work().save_kv_layer(layer_name)

    def wait_for_save(self) -> None:
        self._work().wait_for_save()

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        return self._work().get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> Set[int]:
        return self._work().get_block_ids_with_load_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self) -> Optional[KvferryConnectorStats]:
        return self._worker.get_kv_connector_stats() if self._worker is not None else None

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[Dict[str, Any]] = None) -> KvferryConnectorStats:
        return KvferryConnectorStats(data=data)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()


__all__ = ["KvferryConnector", "KVConnectorRole"]
