"""STAND-IN for vllm/distributed/kv_transfer/kv_connector/v1/__init__.py."""
from .base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA, supports_hma

__all__ = ["KVConnectorBase_V1", "KVConnectorRole", "SupportsHMA", "supports_hma"]
