"""KVSender (prefill) and KVReceiver (decode) of kvferry's SGLang backend, one per request.

They follow SGLang's call order (docs/sglang.md "Calls"):

  prefill: KVSender(mgr, bootstrap_addr, room, dest_tp_ranks, pp_rank); poll() until
           WaitingForInput (every decode destination's metadata arrived); pop_decode_prefix_len();
           init(num_pages, aux_index); send(pages) per chunk, the last chunk with state_indices
           (a list, possibly of no rows; it may carry no pages); poll() until Success or Failed.
  decode:  KVReceiver(mgr, bootstrap_addr, room); init(prefill_dp_rank) (connects the prefill
           instance); poll() is WaitingForInput; send_metadata(pages, aux_index, state_indices);
           poll() until Success or Failed.

A chunk is the last exactly when SGLang passes state_indices (SGLang passes None for every other
chunk). No call raises for a failed room: a refused call (an index out of range, a feature kvferry
lacks) fails the room on this rank instead, and failure_exception() says why.

failure_exception() raises KVTransferError with bootstrap_room, failure_reason,
is_from_another_rank, code and origin. SGLang calls it on every rank of an engine once the
engine's MIN over its ranks' polls is Failed; on a rank whose own room had not failed, the failure
came from another rank of the engine: the room is failed here too (its peers are told) and the
error says is_from_another_rank=True, so SGLang logs it at debug. Freeing: a room's pages, aux row
and state rows are free to reuse only once release_safe() (decode: the manager's
is_abort_release_safe) is True; a Failed receiver that is not yet release-safe reports
abort_notified=True, which makes SGLang's decode defer the release (with
SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=1, which the manager requires).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Dict, List, Optional

from .. import KVPoll, KVReceiver as _Receiver, KVSender as _Sender, KVTransferError
from . import bootstrap as _bootstrap
from . import settings as _settings

logger = logging.getLogger("kvferry.sglang")

AGREEMENT_REASON = "failed on another rank of this engine (the engine's poll agreement)"


@dataclasses.dataclass
class KVTransferMetric:
    """SGLang's KVTransferMetric fields."""
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


def _rows(state_indices) -> List[int]:
    """SGLang's per-state-type index lists (one type at most, settings.check_supported) as rows."""
    if not state_indices:
        return []
    comp = state_indices[0]
    return [] if comp is None else [int(i) for i in comp]


def _code_of(exc: Exception, default: str) -> str:
    """The kvferry error code a refused call carries (its ``code`` attribute), else ``default``."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) and code else default


def _agreement_wait_s() -> float:
    """How long failure_exception() waits for a failure's record on the failure board when only the
    engine's agreement said the room failed (KVFERRY_AGREEMENT_WAIT_MS, default 1000)."""
    v = os.environ.get("KVFERRY_AGREEMENT_WAIT_MS")
    return float(v) * 1e-3 if v else 1.0


class _Common:
    """What sender and receiver share: the kvferry room, failures, release-safety."""

    role = ""

    def _setup(self, mgr, bootstrap_addr: str, bootstrap_room) -> None:
        self.kv_mgr = mgr
        self.bootstrap_room = int(bootstrap_room or 0)
        self.bootstrap_addr = bootstrap_addr
        self.conclude_state: Optional[KVPoll] = None
        self.init_time: Optional[float] = None
        self._room = None            # the kvferry sender/receiver
        self._local: Optional[KVTransferError] = None   # a failure before the kvferry room existed
        mgr._track(self)

    def _rank(self) -> str:
        m = self.kv_mgr  # as kvferry names a rank (RankId::str): "decode17/tp1", "prefill/tp0/dp1"
        dp = getattr(m, "attn_dp_rank", 0)
        engine = m.engine_id() if self.role == "decode" and hasattr(m, "engine_id") else 0
        return f"{self.role}{engine or ''}/tp{m.attn_tp_rank}" + (f"/dp{dp}" if dp else "")

    def _fail_here(self, code: str, reason: str) -> None:
        """Fails the room on this rank, as its own (local) failure."""
        if self._room is not None:
            try:
                self._room.fail(code, reason)
                return
            except (ValueError, RuntimeError):
                pass
        if self._local is None:
            self._local = KVTransferError(self.bootstrap_room, reason, False, self._rank(), code)

    def poll(self) -> KVPoll:
        if self._local is not None or self._room is None and self.conclude_state == KVPoll.Failed:
            return KVPoll.Failed
        if self._room is None:
            return KVPoll.Bootstrapping
        return self._room.poll()

    def failure_exception(self):
        if self.conclude_state is None:
            self.conclude_state = KVPoll.Failed
        if self._local is not None:
            raise self._local
        if self._room is None:  # the engine failed a room this rank never opened
            raise KVTransferError(self.bootstrap_room, AGREEMENT_REASON, True, f"{self.role} engine", "aborted")
        # The room's failure here; or, when only the engine's agreement said it failed (another
        # rank's source failed), its true origin, code and reason from the failure board of the
        # room's bootstrap service, where the rank that observed it posted it (kvferry's
        # fail_from_agreement; docs/failure-model.md). The room then fails here as from another rank.
        try:
            error = self._room.fail_from_agreement(AGREEMENT_REASON, "aborted", _agreement_wait_s())
        except (ValueError, RuntimeError):  # closed: kvferry released it
            error = KVTransferError(self.bootstrap_room, AGREEMENT_REASON, True, f"{self.role} engine", "aborted")
        raise error

    def release_safe(self) -> bool:
        """No write can still reach the room's pages, aux and state rows (free them only then)."""
        if self._room is None:
            return True
        try:
            return self._room.release_safe()
        except ValueError:  # closed: released by kvferry once safe
            return True

    def abort(self):
        self.conclude_state = KVPoll.Failed
        if self._room is not None:
            self._room.abort("Aborted by AbortReq.")
        elif self._local is None:
            self._local = KVTransferError(self.bootstrap_room, "Aborted by AbortReq.", False, self._rank(), "aborted")

    def clear(self) -> None:
        """SGLang is done with the request: kvferry releases the room once no write can reach it."""
        if self._room is not None:
            self._room.close()


class KVSender(_Common):
    role = "prefill"

    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: int, dest_tp_ranks: List[int], pp_rank: int,
                 req_has_disagg_prefill_dp_rank: bool = False):
        self._setup(mgr, bootstrap_addr, bootstrap_room)
        self.bootstrap_server_url = bootstrap_addr
        self.dest_tp_ranks = list(dest_tp_ranks or [])
        self.pp_rank = pp_rank
        self.aux_index: Optional[int] = None
        self.num_kv_indices: Optional[int] = None
        self.curr_idx = 0
        self._state_rows = 0
        try:
            self._room = _Sender(mgr.manager_for(bootstrap_addr), self.bootstrap_room)
        except (ValueError, RuntimeError) as e:
            self._local = KVTransferError(self.bootstrap_room, f"sender not created: {e}", False, self._rank(),
                                          _code_of(e, "invalid_argument"))
            return
        self._place_dp_rank(req_has_disagg_prefill_dp_rank)

    def _place_dp_rank(self, req_has_disagg_prefill_dp_rank: bool) -> None:
        """Under DP attention, tells decode which prefill DP rank serves the room, as SGLang's
        CommonKVSender.__init__ does (common/conn.py): with the DP rank given with the request, decode
        has it too; else with a --load-balance-method other than follow_bootstrap_room this DP rank
        registers the room at the bootstrap service (/register_dp_rank, which decode's
        query_prefill_dp_ranks reads); with follow_bootstrap_room decode computes bootstrap_room % dp,
        and a room dispatched elsewhere (an external routed DP rank) fails here, unless
        SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 makes it register too."""
        mgr = self.kv_mgr
        dp = mgr.attn_dp_size
        if dp <= 1 or req_has_disagg_prefill_dp_rank:
            return
        if _settings.load_balance_method(mgr.server_args, "prefill") == "follow_bootstrap_room":
            if mgr.attn_dp_rank == self.bootstrap_room % dp:
                return
            if os.environ.get("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "").lower() not in _settings.TRUE:
                self._fail_here("invalid_argument", f"follow_bootstrap_room conflict: dispatched to dp_rank "
                                f"{mgr.attn_dp_rank} but bootstrap_room {self.bootstrap_room} implies dp_rank "
                                f"{self.bootstrap_room % dp}; set SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1 "
                                "to allow mixed routing")
                return
        status, text = _bootstrap.request("POST", self.bootstrap_addr, "/register_dp_rank",
                                          {"bootstrap_room": self.bootstrap_room, "dp_rank": mgr.attn_dp_rank})
        if status != 200:  # decode's query then finds no DP rank and its waiting deadline fails the room
            logger.error("kvferry: registering room %d's prefill dp_rank at %s failed: HTTP %s: %s",
                         self.bootstrap_room, self.bootstrap_addr, status, text[:200])

    def poll(self) -> KVPoll:
        # A sender never init()ed fails at its bootstrap deadline in kvferry's manager (SGLang's
        # bootstrap_timeout: settings.deadlines_from_sglang_env), which tells decode too.
        p = super().poll()
        if p == KVPoll.Bootstrapping and self.num_kv_indices is not None:
            p = KVPoll.WaitingForInput  # after init SGLang expects no Bootstrapping (its inflight queue)
        return p

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None):
        self.num_kv_indices = int(num_kv_indices)
        self.aux_index = aux_index
        self.init_time = time.time()
        if self._room is None or self.poll() == KVPoll.Failed:
            return
        try:
            self._room.init(self.num_kv_indices, aux_index=0 if aux_index is None else int(aux_index))
        except ValueError as e:
            self._fail_here("protocol_error", f"init refused: {e}")

    def send(self, kv_indices, state_indices: Optional[List] = None, num_kv_tokens: Optional[int] = None):
        pages = [int(i) for i in kv_indices]
        last = state_indices is not None
        self.curr_idx += len(pages)
        rows = _rows(state_indices) if last else []
        self._state_rows += len(rows)
        if self._room is None or self.num_kv_indices is None:
            return
        try:
            self._room.send(pages, state_indices=rows if last else None, last=last)
        except ValueError as e:
            self._fail_here("protocol_error", f"send refused: {e}")

    def pop_decode_prefix_len(self) -> int:
        return 0  # decode prefixes are refused at construction (settings.check_supported)

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def get_transfer_metric(self) -> KVTransferMetric:
        m = KVTransferMetric(transfer_total_bytes=self.curr_idx * self.kv_mgr.kv_item_lens_sum +
                             self._state_rows * self.kv_mgr.state_item_lens_sum)
        if self._room is not None:
            try:
                d = self._room.metrics()
                m.transfer_latency_s = d["latency_s"] or None
            except ValueError:
                pass
        return m


class KVReceiver(_Common):
    role = "decode"

    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: Optional[int] = None):
        self._setup(mgr, bootstrap_addr, bootstrap_room)
        self.require_staging = False
        self.abort_notified = False
        self.bootstrap_infos: Optional[List[Dict]] = None
        self.prefill_dp_rank: Optional[int] = None
        self._metadata_sent = False
        mgr.addr_to_rooms_tracker.setdefault(bootstrap_addr, set()).add(self.bootstrap_room)

    def init(self, prefill_dp_rank: int):
        info = self.kv_mgr.prefill_info_table.get(self.bootstrap_addr)
        if info is None:
            self.conclude_state = KVPoll.Failed
            self._local = KVTransferError(self.bootstrap_room, f"prefill instance {self.bootstrap_addr} is not known "
                                          "(its parallel info was never fetched)", False, self._rank(),
                                          "peer_unreachable")
            return
        self.prefill_info = info
        self.target_tp_ranks = info.target_tp_ranks
        self.required_prefill_response_num = info.required_prefill_response_num
        self.prefill_dp_rank = int(prefill_dp_rank)
        self.bootstrap_infos = [{"tp_rank": t, "is_dummy": False} for t in info.target_tp_ranks]
        m = self.kv_mgr
        if m.attn_dp_size > 1 and self.bootstrap_room % m.attn_dp_size != m.attn_dp_rank:
            # kvferry's prefill writes a room to decode DP rank bootstrap_room % dp (kvferry/routing.h;
            # decode's --load-balance-method follow_bootstrap_room, settings.check_supported): a
            # room routed to another decode DP rank (an external routed DP rank) cannot be served.
            self._local = KVTransferError(
                self.bootstrap_room, f"decode dp_rank {m.attn_dp_rank} got bootstrap_room {self.bootstrap_room}, "
                f"which kvferry's prefill serves to decode dp_rank {self.bootstrap_room % m.attn_dp_size} "
                "(follow_bootstrap_room); an external routed DP rank on decode is not supported", False,
                self._rank(), "invalid_argument")
            return
        try:
            mgr = m.manager_for(self.bootstrap_addr)
            self._room = _Receiver(mgr, self.bootstrap_room, bootstrap_addr=self.bootstrap_addr,
                                   prefill_dp_rank=self.prefill_dp_rank)
        except (KeyError, ValueError, RuntimeError) as e:
            self._local = KVTransferError(self.bootstrap_room, f"receiver not created: {e}", False, self._rank(),
                                          _code_of(e, "peer_unreachable"))

    def failure_exception(self):
        # SGLang's decode (DecodeTransferQueue.pop_transferred) calls this once its TP group's MIN
        # poll is Failed, then frees the room's pages at once unless abort_notified is True (then
        # it waits for the manager's is_abort_release_safe). A rank that learned of the failure
        # only from the group has just failed its room here (a prefill write may still be on its
        # way): it must defer as well (issue 30, fix 1).
        try:
            super().failure_exception()
        finally:
            if not self.release_safe():
                self.abort_notified = True

    def poll(self) -> KVPoll:
        p = super().poll()
        if p == KVPoll.Bootstrapping and self._room is not None and not self._metadata_sent:
            return KVPoll.WaitingForInput  # the prefill instance is connected: ready for metadata
        if p == KVPoll.Failed and not self.release_safe():
            self.abort_notified = True  # SGLang defers freeing the pages until is_abort_release_safe
        return p

    def send_metadata(self, kv_indices, aux_index: Optional[int] = None, state_indices: Optional[List] = None,
                      decode_prefix_len: Optional[int] = None):
        self._metadata_sent = True
        self.init_time = time.time()
        if self._room is None or super().poll() == KVPoll.Failed:
            return
        if decode_prefix_len:
            self._fail_here("protocol_error", f"decode_prefix_len {decode_prefix_len}: kvferry does not carry a "
                                              "decode prefix")
            return
        try:
            self._room.send_metadata([int(i) for i in kv_indices], 0 if aux_index is None else int(aux_index),
                                     _rows(state_indices))
        except ValueError as e:
            self._fail_here("protocol_error", f"send_metadata refused: {e}")

    def clear(self) -> None:
        super().clear()
        self.kv_mgr.required_prefill_response_num_table.pop(self.bootstrap_room, None)
        rooms = self.kv_mgr.addr_to_rooms_tracker.get(self.bootstrap_addr)
        if rooms is not None:
            rooms.discard(self.bootstrap_room)

    @staticmethod
    def query_prefill_dp_ranks(bootstrap_addr: str, bootstrap_rooms: List[int]) -> Dict[str, int]:
        """The prefill DP rank of each room (the bootstrap service's /query_dp_ranks)."""
        status, text = _bootstrap.request("POST", bootstrap_addr, "/query_dp_ranks",
                                          {"bootstrap_rooms": [int(r) for r in bootstrap_rooms]})
        if status != 200:
            return {}
        try:
            out = json.loads(text)
        except ValueError:
            return {}
        return {str(k): int(v) for k, v in out.items()} if isinstance(out, dict) else {}
