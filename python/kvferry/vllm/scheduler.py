"""The scheduler-side half of kvferry's vLLM connector (one per engine, in vLLM's scheduler
process). It holds no kvferry objects: it decides, from vLLM's calls, which rooms the workers open
and end, and carries that to them in each step's metadata (docs/vllm.md "Data flow").

vLLM's scheduler calls it (vllm/v1/core/sched/scheduler.py, Scheduler.add_request / schedule /
update_from_output / _free_request): on_new_request as a request is added,
get_num_new_matched_tokens for a waiting request,
update_state_after_alloc once its blocks are allocated, build_connector_meta at the end of every
schedule(), update_connector_output with the workers' aggregated output, request_finished (or
request_finished_all_groups) when a request finishes, before its blocks are freed.

Prefill (kv_producer): a request with ``do_remote_decode`` gets a room at allocation (the
router's ``kvferry_room`` if it gave one, else a random 63-bit id); at its finish the connector
keeps its blocks (returns True) and returns the kv_transfer_params the proxy hands to decode
(kvferry/vllm/params.py). The workers then hold the room until decode's metadata came and the
pages were written, or the lease ended (kvferry's bootstrap deadline), and report it in
``get_finished`` so vLLM frees the blocks.
Decode (kv_consumer): a request with kvferry's params loads its prompt's KV asynchronously
(get_num_new_matched_tokens returns (tokens, True)); once blocks are allocated the workers open
the room and send kvferry's metadata; a request that finishes (aborted) while loading ends its
room, and vLLM keeps its blocks until the workers report it (release-safe).
"""
from __future__ import annotations

import logging
import random
import time
from typing import Any, Dict, Optional, Set, Tuple

from . import params as P
from .config import Settings
from .metadata import AwaitSpec, EndSpec, KvferryConnectorMetadata, RecvSpec, SendSpec

logger = logging.getLogger("kvferry.vllm")
_rng = random.SystemRandom()
_DONE = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")  # prefill finished normally: its KV is whole


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _group0(block_ids) -> list:
    """vLLM's block ids: a list (one group) or a tuple/list of per-group lists."""
    if block_ids and isinstance(block_ids[0], (list, tuple)):
        return [int(b) for b in block_ids[0]]
    return [int(b) for b in (block_ids or [])]


def _status_name(request) -> str:
    s = getattr(request, "status", None)
    return getattr(s, "name", str(s))


class AuxRows:
    """The aux (guard) rows of one kvferry manager: each room in flight through it gets its own
    row (kvferry checks decode's guard row per room: two rooms sharing a row fail each other).
    A row is free again only when vLLM frees the room's blocks: decode once the workers reported
    the request (release-safe or reclaimed), prefill once the room ended (sent, refused or ended)."""

    def __init__(self, n: int):
        self._free = list(range(n - 1, -1, -1))

    def available(self) -> bool:
        return bool(self._free)

    def take(self) -> Optional[int]:
        return self._free.pop() if self._free else None

    def give(self, row: int) -> None:
        self._free.append(row)


class _Prefilling:
    __slots__ = ("room", "block_ids", "num_prompt", "seen", "aux")

    def __init__(self, room: int, block_ids: list, num_prompt: int, aux: int):
        self.room, self.block_ids, self.num_prompt, self.aux = room, block_ids, num_prompt, aux
        self.seen = False  # build_connector_meta saw it scheduled (layer-wise was decided)


class SchedulerSide:
    def __init__(self, settings: Settings):
        self.s = settings
        self._prefilling: Dict[str, _Prefilling] = {}   # prefill: rooms of requests being computed
        self._holding: Dict[str, int] = {}              # prefill: finished requests whose blocks we keep: room
        self._loading: Dict[str, RecvSpec] = {}         # decode: requests whose KV is on its way
        self._ending: Set[str] = set()                  # decode: finished while loading, not reported yet
        self._meta = KvferryConnectorMetadata()         # the next step's work
        self._aux: Dict[str, AuxRows] = {}              # per manager: "" prefill's, else a prefill instance
        self._aux_of: Dict[str, Tuple[str, int]] = {}   # request -> (manager, aux row) until its blocks are free
        self._rooms: Set[int] = set()                   # prefill: rooms of _prefilling and _holding
        self._ended: Dict[int, None] = {}               # prefill: the last 4096 rooms ended (kvferry refuses reuse)
        self._matched: Dict[str, Optional[Tuple[str, str]]] = {}  # decode: get_num_new_matched_tokens' refusal

    def _rows(self, key: str) -> AuxRows:
        rows = self._aux.get(key)
        if rows is None:
            rows = self._aux[key] = AuxRows(self.s.aux_rows)
        return rows

    def _free_row(self, rid: str) -> None:
        got = self._aux_of.pop(rid, None)
        if got is not None:
            self._aux[got[0]].give(got[1])

    # -- vLLM's scheduler-side calls -------------------------------------------------------------

    def on_new_request(self, request) -> None:
        """Decode: vLLM's Scheduler.add_request calls it as the request enters the waiting queue,
        possibly many steps before it gets blocks. The workers open its room at once, without
        metadata (AwaitSpec): kvferry then renews the room's lease at prefill while this engine
        lives, as NIXL's decode heartbeats do (docs/vllm.md "The lease"). A request kvferry cannot
        serve is left to update_state_after_alloc, which ends its room."""
        p = request.kv_transfer_params
        if not (self.s.consumes and P.is_kvferry_decode(p)) or self._refusal(request, 0):
            return
        rp = P.parse_remote_prefill(p)
        self._meta.awaits[request.request_id] = AwaitSpec(rp.room, rp.bootstrap, rp.tp_size)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[int, bool]:
        """Decode: the prompt's tokens beyond what is computed here come from prefill, loaded
        asynchronously. (0, False) for anything else, and for a request kvferry cannot serve
        (malformed params, unequal block size, a local prefix hit): vLLM computes it here and
        update_state_after_alloc ends its room. Side-effect free (vLLM may call it repeatedly)."""
        p = request.kv_transfer_params
        if not (self.s.consumes and P.is_kvferry_decode(p)):
            return 0, False
        why = self._refusal(request, num_computed_tokens)
        # vLLM calls update_state_after_alloc right after this (same schedule()), before it sets
        # request.num_computed_tokens (Scheduler.schedule in vllm/v1/core/sched/scheduler.py): the
        # local prefix hit is known only here, so the decision is kept for it.
        self._matched[request.request_id] = why
        if why:
            return 0, False
        count = len(request.prompt_token_ids or []) - num_computed_tokens
        rp = P.parse_remote_prefill(p)
        if count > 0 and not self._rows(P.manager_key(rp.bootstrap)).available():
            return None, False  # every aux row of that prefill's manager is in use: ask again later
        return (count, True) if count > 0 else (0, False)

    def _refusal(self, request, num_computed_tokens: int) -> Optional[Tuple[str, str]]:
        """Why kvferry cannot load this decode request's KV: (code, reason), or None."""
        try:
            rp = P.parse_remote_prefill(request.kv_transfer_params)
        except P.ParamsError as e:
            return "protocol_error", f"kv_transfer_params refused: {e}"
        if rp.block_size != self.s.block_size:
            return "protocol_error", (f"block size mismatch: prefill {rp.block_size} tokens, decode "
                                      f"{self.s.block_size}: the engines must use the same --block-size")
        n = len(request.prompt_token_ids or [])
        if rp.num_tokens != n:
            return "protocol_error", f"prefill holds {rp.num_tokens} tokens, the decode request has {n}"
        if num_computed_tokens > 0:
            return "aborted", (f"decode found {num_computed_tokens} of the prompt's tokens in its own prefix "
                               "cache: the rest is computed here")
        return None

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        p = request.kv_transfer_params
        if not p:
            return
        rid = request.request_id
        if P.flag(p, "do_remote_decode") and self.s.produces:
            self._prefill_alloc(request, p, blocks)
            return
        if not (self.s.consumes and P.is_kvferry_decode(p)):
            return
        p["do_remote_prefill"] = False  # one transfer per request (a preempted request recomputes)
        if rid in self._matched:
            why = self._matched.pop(rid)
        else:
            why = self._refusal(request, request.num_computed_tokens)
        try:
            rp = P.parse_remote_prefill(p)
        except P.ParamsError as e:
            self._tell_malformed(rid, p, f"kv_transfer_params refused: {e}")
            return
        ids = _group0(blocks.get_block_ids())[:_cdiv(rp.num_tokens, self.s.block_size)]
        aux = None
        if why is None and num_external_tokens > 0 and len(ids) == _cdiv(rp.num_tokens, self.s.block_size):
            aux = self._rows(P.manager_key(rp.bootstrap)).take()
        if aux is not None:
            spec = RecvSpec(rp.room, rp.bootstrap, ids, rp.num_tokens, rp.tp_size, aux)
            self._meta.recvs[rid] = spec
            self._loading[rid] = spec
            self._aux_of[rid] = (P.manager_key(rp.bootstrap), aux)
            return
        code, reason = why or ("protocol_error", f"{len(ids)} blocks allocated for {rp.num_tokens} tokens")
        self._meta.ends[rid] = EndSpec(rp.room, rp.bootstrap, code, reason, False, rp.tp_size)

    def _prefill_alloc(self, request, p: dict, blocks) -> None:
        rid = request.request_id
        old = self._prefilling.pop(rid, None)
        if old is not None:
            # Allocated again: vLLM preempted it (Scheduler._preempt_request frees its blocks and
            # puts it back in waiting; schedule() then calls update_state_after_alloc with the new
            # blocks). The old room may hold the old blocks: end it, and use a new room.
            self._end_prefill(rid, old, f"request {rid} was preempted on prefill: its KV is recomputed")
            room = _rng.randrange(1, P.MAX_ROOM)
        else:
            room = p.get(P.ROOM)
            try:
                room = P.valid_room(room) if room is not None else _rng.randrange(1, P.MAX_ROOM)
            except P.ParamsError as e:  # the router's room: refused, draw one
                logger.warning("request %s: %s; drawing a room", rid, e)
                room = _rng.randrange(1, P.MAX_ROOM)
        if room in self._rooms or room in self._ended:  # kvferry would refuse it: never offered to decode
            logger.warning("request %s: kvferry room %d is (or was) another request's; its KV is not offered "
                           "to decode", rid, room, extra={"room": room, "code": "invalid_argument"})
            p.pop(P.ROOM, None)
            return
        aux = self._rows("").take()
        if aux is None:
            logger.warning("request %s: every one of the %d kvferry aux rows is in use; its KV is not offered "
                           "to decode", rid, self.s.aux_rows, extra={"room": room, "code": "resource_exhausted"})
            p.pop(P.ROOM, None)
            return
        p[P.ROOM] = room
        num_prompt = int(getattr(request, "num_prompt_tokens", 0) or len(request.prompt_token_ids or []))
        self._prefilling[rid] = _Prefilling(room, _group0(blocks.get_block_ids()), num_prompt, aux)
        self._aux_of[rid] = ("", aux)
        self._rooms.add(room)

    def _room_ended(self, room: int) -> None:
        self._rooms.discard(room)
        self._ended[room] = None
        while len(self._ended) > 4096:
            del self._ended[next(iter(self._ended))]

    def _end_prefill(self, rid: str, st: _Prefilling, reason: str) -> None:
        """A room prefill gives up before it is held: the workers end it if they may have opened
        it (decode is told); its row and room id are free again."""
        if st.seen:
            self._meta.ends[rid] = EndSpec(st.room, "", "aborted", reason, False, 0)
        self._free_row(rid)
        self._room_ended(st.room)

    def _tell_malformed(self, rid: str, p: dict, reason: str) -> None:
        """Malformed params on decode: the request is computed here; the prefill instance is told at
        once (it frees the blocks) if the room, its address and TP size are readable, else it frees
        them at its lease. Logged once, by the decode worker's end of the room, or here."""
        room, bootstrap, tp = P.room_and_peer(p)
        if room is None or bootstrap is None or tp is None:
            logger.error("request %s: computing its prompt here: %s (the prefill instance cannot be told: it frees "
                         "the blocks at its lease)", rid, reason, extra={"code": "protocol_error"})
            return
        self._meta.ends[rid] = EndSpec(room, bootstrap, "protocol_error", reason, False, tp)

    def build_connector_meta(self, scheduler_output) -> KvferryConnectorMetadata:
        meta, self._meta = self._meta, KvferryConnectorMetadata()
        # Prefill requests whose whole prompt is computed in this step, with every block known
        # since allocation: the workers may send each layer as it is saved (if decode is ready).
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        for rid, st in self._prefilling.items():
            n = scheduled.get(rid)
            if n is None or st.seen:
                continue
            st.seen = True  # its first step: the only one whose blocks update_state_after_alloc gave
            npages = _cdiv(st.num_prompt, self.s.block_size)
            if n >= st.num_prompt and len(st.block_ids) >= npages:
                meta.layerwise[rid] = SendSpec(st.room, st.block_ids[:npages], st.num_prompt, st.aux)
        return meta

    def update_connector_output(self, connector_output) -> None:
        for rid in getattr(connector_output, "finished_sending", None) or ():
            room = self._holding.pop(rid, None)
            if room is not None:
                self._room_ended(room)
                self._free_row(rid)
        for rid in getattr(connector_output, "finished_recving", None) or ():
            self._loading.pop(rid, None)
            self._ending.discard(rid)
            self._free_row(rid)

    def request_finished(self, request, block_ids) -> Tuple[bool, Optional[Dict[str, Any]]]:
        p = request.kv_transfer_params
        if not p:
            return False, None
        rid = request.request_id
        self._matched.pop(rid, None)
        if self.s.consumes and P.is_kvferry_decode(p):
            # Finished (aborted) before it had blocks: prefill is told at once, not at its lease.
            p["do_remote_prefill"] = False
            try:
                rp = P.parse_remote_prefill(p)
            except P.ParamsError as e:
                self._tell_malformed(rid, p, f"kv_transfer_params refused: {e}")
                return False, None
            self._meta.ends[rid] = EndSpec(rp.room, rp.bootstrap, "aborted",
                                           f"request {rid} was aborted on decode before it had blocks", False,
                                           rp.tp_size)
            return False, None
        spec = self._loading.pop(rid, None)
        if spec is not None:
            # Finished while its KV was loading: vLLM keeps its blocks until the workers report it
            # in get_finished (once no prefill write can reach them).
            self._meta.ends[rid] = EndSpec(spec.room, spec.bootstrap, "aborted",
                                           f"request {rid} finished ({_status_name(request)}) on decode before its "
                                           "KV arrived", True, spec.prefill_tp)
            self._ending.add(rid)
            return False, None
        st = self._prefilling.pop(rid, None)
        if not (self.s.produces and P.flag(p, "do_remote_decode")) or st is None:
            return False, None
        ids = _group0(block_ids)
        num_tokens = int(getattr(request, "num_prompt_tokens", 0) or len(request.prompt_token_ids or []))
        npages = _cdiv(num_tokens, self.s.block_size)
        if _status_name(request) not in _DONE or num_tokens <= 0 or len(ids) < npages:
            reason = f"request {rid} finished ({_status_name(request)}) on prefill without its KV"
            if st.seen:
                # The workers may have opened the room and sent layers from save_kv_layer: a write
                # may still read these blocks. vLLM keeps them until the workers report the request
                # in get_finished, once kvferry says no write reads them (issue 33 attack, F9).
                self._meta.ends[rid] = EndSpec(st.room, "", "aborted", reason, True, 0)
                self._holding[rid] = st.room
                return True, None
            self._end_prefill(rid, st, reason)
            return False, None
        self._meta.sends[rid] = SendSpec(st.room, ids[:npages], num_tokens, st.aux)
        self._holding[rid] = st.room
        return True, P.prefill_output(room=st.room, bootstrap=self.s.bootstrap_address, engine_id=self.s.engine_id,
                                      request_id=rid, block_ids=ids[:npages], block_size=self.s.block_size,
                                      num_tokens=num_tokens, tp_size=self.s.tp_size,
                                      lease_expiry=time.time() + self.s.lease_s)

    def has_pending_push_work(self) -> bool:
        """Prefill holds finished requests' blocks, or decode keeps an aborted request's blocks until
        no prefill write can reach them: vLLM keeps stepping so get_finished reports them (vLLM
        does not step for them otherwise: they are no longer running or waiting)."""
        return bool(self._holding or self._ending)
