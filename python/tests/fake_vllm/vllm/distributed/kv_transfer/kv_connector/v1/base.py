"""STAND-IN for vllm/distributed/kv_transfer/kv_connector/v1/base.py: KVConnectorBase_V1 (its
abstract methods are abstract here too, so a connector missing one cannot be built),
KVConnectorRole, SupportsHMA, KVConnectorMetadata. The constructor is the newer
(vllm_config, role, kv_cache_config); it requires kv_transfer_config as vLLM's does."""
import enum
from abc import ABC, abstractmethod


class SupportsHMA(ABC):
    @abstractmethod
    def request_finished_all_groups(self, request, block_ids):
        raise NotImplementedError


def supports_hma(connector) -> bool:
    return issubclass(connector, SupportsHMA) if isinstance(connector, type) else isinstance(connector, SupportsHMA)


class KVConnectorRole(enum.Enum):
    SCHEDULER = 0
    WORKER = 1


class KVConnectorMetadata(ABC):  # noqa: B024
    pass


class KVConnectorBase_V1(ABC):
    def __init__(self, vllm_config, role, kv_cache_config):
        self._connector_metadata = None
        self._vllm_config = vllm_config
        if vllm_config.kv_transfer_config is None:
            raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._kv_cache_config = kv_cache_config
        self._role = role

    @property
    def role(self):
        return self._role

    # worker side
    def bind_connector_metadata(self, connector_metadata) -> None:
        self._connector_metadata = connector_metadata

    def clear_connector_metadata(self) -> None:
        self._connector_metadata = None

    def register_kv_caches(self, kv_caches) -> None:
        return

    def handle_preemptions(self, kv_connector_metadata) -> None:
        return

    @abstractmethod
    def start_load_kv(self, forward_context, **kwargs) -> None: ...

    @abstractmethod
    def wait_for_layer_load(self, layer_name: str) -> None: ...

    @abstractmethod
    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None: ...

    @abstractmethod
    def wait_for_save(self): ...

    def get_finished(self, finished_req_ids):
        return None, None

    def get_block_ids_with_load_errors(self):
        return set()

    def shutdown(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def get_kv_connector_kv_cache_events(self):
        return None

    def build_connector_worker_meta(self):
        return None

    # scheduler side
    def on_new_request(self, request):  # vLLM: a no-op unless a connector overrides it
        return

    @abstractmethod
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int): ...

    @abstractmethod
    def update_state_after_alloc(self, request, blocks, num_external_tokens: int): ...

    @abstractmethod
    def build_connector_meta(self, scheduler_output): ...

    def update_connector_output(self, connector_output):
        return

    def request_finished(self, request, block_ids):
        return False, None

    def take_events(self):
        return ()

    def has_pending_push_work(self) -> bool:
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        if cls is KVConnectorBase_V1:
            raise TypeError("get_required_kvcache_layout should not be called on the abstract base class")
        return None

    def get_finished_count(self):
        return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return None
