"""What kvferry's scheduler-side connector hands its worker-side connectors each step
(``build_connector_meta``), and the stats workers hand back (``get_kv_connector_stats``).

vLLM serializes the metadata from the scheduler process to every worker process each step, and
the stats back: both hold plain values only (ints, strings, lists, dicts).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from .compat import KVConnectorMetadata, KVConnectorStats


@dataclasses.dataclass
class SendSpec:
    """Prefill: a request whose KV pages go to the decode that claims ``room``."""
    room: int
    block_ids: List[int]      # the pages holding the prompt's KV, in token order
    num_tokens: int
    aux: int = 0              # the room's aux (guard) row in prefill's manager (scheduler.AuxRows)


@dataclasses.dataclass
class AwaitSpec:
    """Decode: a request that waits for blocks (vLLM's on_new_request): the workers open its room
    without metadata, so kvferry renews its lease at the prefill holding ``room``."""
    room: int
    bootstrap: str            # the prefill instance's bootstrap service
    prefill_tp: int           # the prefill engine's TP size


@dataclasses.dataclass
class RecvSpec:
    """Decode: a request whose blocks are to be filled by the prefill holding ``room``."""
    room: int
    bootstrap: str            # the prefill instance's bootstrap service
    block_ids: List[int]      # this engine's blocks for the prompt, in token order
    num_tokens: int
    prefill_tp: int           # the prefill engine's TP size (kvferry plans head slices by it)
    aux: int = 0              # the room's aux (guard) row in the manager serving that prefill


@dataclasses.dataclass
class EndSpec:
    """A room this engine gives up before it was transferred: the worker fails it here (code,
    reason) so that every peer rank is told at once. ``report``: vLLM waits for the request in
    ``get_finished`` (its blocks were allocated); otherwise vLLM freed it already."""
    room: int
    bootstrap: str            # decode: the prefill instance; prefill: ""
    code: str
    reason: str
    report: bool
    peer_tp: int              # decode: the prefill engine's TP size


class KvferryConnectorMetadata(KVConnectorMetadata):
    """One step's work for the workers: rooms to open (sends, recvs; awaits: decode requests waiting
    for blocks, opened without metadata so their lease is renewed), rooms whose prompt is
    computed in this step (``layerwise``: prefill may send each layer as it is saved, if decode's
    metadata already came), rooms to end (``ends``)."""

    def __init__(self) -> None:
        self.sends: Dict[str, SendSpec] = {}
        self.layerwise: Dict[str, SendSpec] = {}
        self.awaits: Dict[str, AwaitSpec] = {}
        self.recvs: Dict[str, RecvSpec] = {}
        self.ends: Dict[str, EndSpec] = {}

    def __repr__(self) -> str:
        return (f"KvferryConnectorMetadata(sends={self.sends}, layerwise={self.layerwise}, awaits={self.awaits}, "
                f"recvs={self.recvs}, ends={self.ends})")


class KvferryConnectorStats(KVConnectorStats):
    """Per-interval counters of one or more workers (vLLM aggregates them across workers and
    reduces them for its logs): rooms that succeeded and failed, bytes, rooms prefill sent layer
    by layer from save_kv_layer, and each failure's
    request, room, code, origin and whether it came from another rank."""

    def __init__(self, data: Optional[Dict[str, Any]] = None):
        super().__init__(data=dict(data) if data else {})
        if not self.data:
            self.reset()

    def reset(self) -> None:
        self.data = {"succeeded": 0, "failed": 0, "bytes": 0, "layerwise": 0, "failures": []}

    def aggregate(self, other: "KvferryConnectorStats") -> "KvferryConnectorStats":
        if other is not None and other.data:
            for k in ("succeeded", "failed", "bytes", "layerwise"):
                self.data[k] = self.data.get(k, 0) + other.data.get(k, 0)
            self.data["failures"] = list(self.data.get("failures", [])) + list(other.data.get("failures", []))
        return self

    def reduce(self) -> Dict[str, Any]:
        return {"kvferry rooms succeeded": self.data.get("succeeded", 0),
                "kvferry rooms failed": self.data.get("failed", 0),
                "kvferry bytes": self.data.get("bytes", 0)}

    def is_empty(self) -> bool:
        return not (self.data.get("succeeded") or self.data.get("failed") or self.data.get("failures"))

    def clone_and_reset(self) -> "KvferryConnectorStats":
        out = KvferryConnectorStats(data=dict(self.data))
        self.reset()
        return out
