"""STAND-IN: sglang.srt.disaggregation.base re-exports."""
from .conn import (BaseKVBootstrapServer, BaseKVManager, BaseKVReceiver, BaseKVSender, KVArgs, KVPoll,
                   KVTransferMetric)
