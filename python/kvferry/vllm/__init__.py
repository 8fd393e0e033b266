"""kvferry as vLLM's KV connector, loaded by module path (docs/vllm.md):

    --kv-transfer-config '{"kv_connector": "KvferryConnector", "kv_connector_module_path": "kvferry.vllm",
                           "kv_role": "kv_producer"}'        # decode: "kv_consumer"

Importing this package does not import vLLM; when vLLM is importable the connector subclasses
vLLM's KVConnectorBase_V1 and SupportsHMA (``HAVE_VLLM``), otherwise stand-ins with the same names.
"""
from .compat import HAVE_VLLM
from .config import UnsupportedConfiguration
from .connector import KvferryConnector
from .metadata import KvferryConnectorMetadata, KvferryConnectorStats

__all__ = ["KvferryConnector", "KvferryConnectorMetadata", "KvferryConnectorStats", "UnsupportedConfiguration",
           "HAVE_VLLM"]
