"""STAND-IN for a scheduler module that imported the backend lookup by name, as SGLang's
decode.py and prefill.py do (``from ...utils import get_kv_class``): a plugin's hook must reach it."""
from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class


def receiver_class(server_args):
    return get_kv_class(TransferBackend(server_args.disaggregation_transfer_backend), KVClassType.RECEIVER)
