"""kvferry as an SGLang transfer backend: ``--disaggregation-transfer-backend kvferry``.

The classes SGLang's backend lookup (``get_kv_class``) returns for ``kvferry``, with the
constructor arguments and methods SGLang's prefill and decode schedulers call
(python/sglang/srt/disaggregation/base/conn.py in SGLang): ``KVArgs``, ``KVManager``,
``KVSender``, ``KVReceiver``, ``KVBootstrapServer``. ``KVTransferError`` carries SGLang's
``bootstrap_room``, ``failure_reason`` and ``is_from_another_rank`` plus kvferry's ``code`` and
``origin``. The plugin (kvferry.sglang.plugin, entry point ``kvferry`` in group
``sglang.srt.plugins``) makes SGLang find them; docs/sglang.md says how to deploy and what is
not supported. Importing this package does not import SGLang.
"""
from .. import KVPoll, KVTransferError
from .bootstrap import KVBootstrapServer
from .manager import KVArgs, KVManager, PrefillServerInfo
from .rooms import KVReceiver, KVSender, KVTransferMetric
from .settings import UnsupportedConfiguration

BACKEND_NAME = "kvferry"

__all__ = ["KVArgs", "KVManager", "KVSender", "KVReceiver", "KVBootstrapServer", "KVPoll", "KVTransferError",
           "KVTransferMetric", "PrefillServerInfo", "UnsupportedConfiguration", "BACKEND_NAME", "kv_class"]


def kv_class(class_type):
    """Our class for one of SGLang's KVClassType members (or their values: "kvargs", "manager",
    "sender", "receiver", "bootstrap_server")."""
    key = getattr(class_type, "value", class_type)
    return {"kvargs": KVArgs, "manager": KVManager, "sender": KVSender, "receiver": KVReceiver,
            "bootstrap_server": KVBootstrapServer}.get(key)
