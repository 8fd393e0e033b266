"""STAND-IN for vllm/distributed/kv_transfer/kv_connector/factory.py, with both of vLLM's rules
for loading a connector (KVConnectorFactory._get_connector_class_with_compat):

* "registry_first" (vLLM until late 2025): a registered name wins; an unknown name is loaded from
  kv_connector_module_path; a constructor without kv_cache_config is called with
  (config, role) (the deprecated two-argument signature, with a warning).
* "module_path_first" (later vLLM): an empty module path is an error; a non-empty one wins over the
  registry; a constructor without kv_cache_config is refused (ValueError).

Both then refuse a connector that is not SupportsHMA while the hybrid KV cache manager is on
(create_connector), and call connector_cls(config, role, kv_cache_config).
"""
import importlib
import logging

from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole, supports_hma  # noqa: F401
from vllm.utils.func_utils import supports_kw

logger = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.factory")
RULES = ("registry_first", "module_path_first")


class KVConnectorFactory:
    _registry: dict = {}
    rule = "module_path_first"

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        cls._registry[name] = lambda: getattr(importlib.import_module(module_path), class_name)

    @classmethod
    def create_connector(cls, config, role, kv_cache_config=None):
        ktc = config.kv_transfer_config
        if ktc is None:
            raise ValueError("kv_transfer_config must be set to create a connector")
        connector_cls, compat_sig = cls._get_connector_class_with_compat(ktc)
        hma_enabled = not config.scheduler_config.disable_hybrid_kv_cache_manager
        if hma_enabled and not supports_hma(connector_cls):
            raise ValueError(f"Connector {connector_cls.__name__} does not support HMA but HMA is enabled.")
        if compat_sig:
            return connector_cls(config, role)
        return connector_cls(config, role, kv_cache_config)

    @classmethod
    def _from_module(cls, name: str, module_path: str):
        module = importlib.import_module(module_path)
        try:
            return getattr(module, name)
        except AttributeError as e:
            raise AttributeError(f"Class {name} not found in {module_path}") from e

    @classmethod
    def _get_connector_class_with_compat(cls, ktc):
        name, path = ktc.kv_connector, ktc.kv_connector_module_path
        if name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        if cls.rule == "registry_first":
            if name in cls._registry:
                return cls._registry[name](), False
            if path is None:
                raise ValueError(f"Unsupported connector type: {name}")
            connector_cls = cls._from_module(name, path)
            compat = not supports_kw(connector_cls, "kv_cache_config")
            if compat:
                logger.warning("Connector %s uses deprecated signature with 2 required arguments.", name)
            return connector_cls, compat
        if path is not None and not path:
            raise ValueError("kv_connector_module_path cannot be an empty string.")
        if path:
            connector_cls = cls._from_module(name, path)
            if not supports_kw(connector_cls, "kv_cache_config"):
                raise ValueError(f"Connector {connector_cls.__name__} uses deprecated 2-argument constructor "
                                 "signature. External v1 KV connectors must accept kv_cache_config.")
            return connector_cls, False
        if name in cls._registry:
            return cls._registry[name](), False
        raise ValueError(f"Unsupported connector type: {name}")

    @classmethod
    def get_connector_class(cls, ktc):
        return cls._get_connector_class_with_compat(ktc)[0]


# vLLM registers its in-tree connectors by name; a connector of kvferry's name is not among them.
KVConnectorFactory.register_connector("NixlConnector", "vllm.distributed.kv_transfer.kv_connector.v1.nixl_connector",
                                      "NixlConnector")
