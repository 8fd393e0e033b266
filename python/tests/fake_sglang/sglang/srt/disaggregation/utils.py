"""STAND-IN for sglang.srt.disaggregation.utils: DisaggregationMode, TransferBackend, KVClassType
and a backend lookup shaped as SGLang's get_kv_class (in-tree backends are not modelled: they
answer a marker string)."""
from enum import Enum


class DisaggregationMode(Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class TransferBackend(Enum):
    MOONCAKE = "mooncake"
    MORI = "mori"
    NIXL = "nixl"
    ASCEND = "ascend"
    FAKE = "fake"


class KVClassType(Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


def get_kv_class(transfer_backend, class_type):
    if transfer_backend in (TransferBackend.MOONCAKE, TransferBackend.MORI, TransferBackend.NIXL,
                            TransferBackend.ASCEND, TransferBackend.FAKE):
        return f"in-tree:{transfer_backend.value}:{class_type.value}"
    raise ValueError(f"Unsupported transfer backend: {transfer_backend}")
