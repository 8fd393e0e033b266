"""STAND-IN for sglang.srt.server_args: the transfer-backend choices and the ServerArgs fields
kvferry's backend reads, with SGLang's defaults."""
import dataclasses
from typing import Optional

DISAGG_TRANSFER_BACKEND_CHOICES = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]


def add_disagg_transfer_backend_choices(choices):
    DISAGG_TRANSFER_BACKEND_CHOICES.extend(choices)


@dataclasses.dataclass
class ServerArgs:
    host: str = "127.0.0.1"
    port: int = 30000
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    attn_cp_size: int = 1
    dcp_size: int = 1
    enable_dp_attention: bool = False
    load_balance_method: str = "auto"
    dist_init_addr: Optional[str] = None
    nnodes: int = 1
    node_rank: int = 0
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_ib_device: Optional[str] = None
    disaggregation_decode_enable_radix_cache: bool = False
