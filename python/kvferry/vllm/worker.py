"""The worker-side half of kvferry's vLLM connector (one per TP rank, in vLLM's worker process).

It maps vLLM's worker calls onto kvferry's public rooms (kvferry.KVManager, KVSender, KVReceiver);
it keeps no failure or release state of its own: a room's state, its failure (origin, code,
reason) and when its pages may be reused are kvferry's (poll, failure, release_safe).

vLLM's model runner calls it every step (vllm/v1/worker/kv_connector_model_runner_mixin.py):
bind_connector_metadata, start_load_kv, the forward pass (per attention layer
wait_for_layer_load before, save_kv_layer after), wait_for_save, get_finished(finished_req_ids),
get_block_ids_with_load_errors, get_kv_connector_stats, clear_connector_metadata.

Prefill: one kvferry manager (registered at the engine's bootstrap service, which TP rank 0 runs).
A finished request's room is opened (a KVSender over the request's blocks); once decode's metadata
came (poll WaitingForInput) the pages are written with one send, from get_finished or from a small
thread (an idle engine may not step). A room whose prompt is computed in the current step and
whose decode is already waiting is sent layer by layer from save_kv_layer instead. The room is
reported in get_finished (vLLM frees the blocks) once it succeeded, or failed and no write reads
the blocks any more (release_safe). The lease is kvferry's bootstrap deadline: decode's metadata
must come within kv_lease_duration of the room's opening, else the room fails (bootstrap_timeout,
origin this rank) and the blocks are freed; decode, if it comes later, is told that failure. A
decode whose request waits for blocks renews it (kvferry's renewal, every third of the lease, up to
kvferry_lease_limit after the opening: docs/vllm.md "The lease").
Decode: a request's room opens when vLLM adds the request (on_new_request: AwaitSpec), without
metadata, so kvferry renews its lease at prefill while the request waits for blocks.
One kvferry manager per prefill instance, built on a thread when a request first names
the instance (kvferry's bootstrap lookup may take up to KVFERRY_LOOKUP_TIMEOUT_MS; vLLM's step never
waits for it: the instance's requests wait until it is built). A request's room is opened with its blocks
(KVReceiver: kvferry's metadata goes to every prefill source); Success reports it in get_finished;
Failed reports its blocks in get_block_ids_with_load_errors at once, and the request in
get_finished once release_safe, so vLLM's kv_load_failure_policy applies and no late write lands in
reused blocks. Rooms released quarantined are reported only when kvferry reclaims them.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, List, Optional, Set, Tuple

from .. import BootstrapServer, KVManager, KVPoll, KVReceiver, KVSender, KVTransferError
from ..buffers import EngineBuffers
from ..engine_id import decode_engine_id
from .config import Geometry, Settings, geometry_of, layer_order
from .metadata import AwaitSpec, EndSpec, KvferryConnectorMetadata, KvferryConnectorStats, RecvSpec, SendSpec
from .params import manager_key

logger = logging.getLogger("kvferry.vllm")
_PUMP_S = 0.002  # how often the send thread looks at held rooms while some wait for decode


def _tp_rank(vllm_config) -> int:
    try:  # inside vLLM's worker: its TP group
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
        return int(get_tensor_model_parallel_rank())
    except Exception:
        return int(getattr(vllm_config.parallel_config, "rank", 0) or 0)


def _total_kv_heads(vllm_config) -> Optional[int]:
    mc = getattr(vllm_config, "model_config", None)
    try:
        return int(mc.get_total_num_kv_heads(vllm_config.parallel_config)) if mc is not None else None
    except TypeError:
        return int(mc.get_total_num_kv_heads())
    except Exception:
        return None


class _Send:
    __slots__ = ("spec", "room", "held", "written", "layers_sent", "layerwise", "candidate")

    def __init__(self, spec: SendSpec, room: KVSender):
        self.spec, self.room = spec, room
        self.held = False        # vLLM finished the request and keeps its blocks for us
        self.written = False     # every page went to send() (or the room failed)
        self.layers_sent = 0     # layer-wise: layers [0, layers_sent) sent
        self.layerwise = False   # this step's save_kv_layer sends it
        self.candidate = False   # its prompt is computed in this step (decided at the first layer)


class _Recv:
    __slots__ = ("spec", "room", "req_id", "report", "ending", "load_error")

    def __init__(self, spec, room: KVReceiver, req_id: str, report: bool, ending: bool):
        self.spec, self.room, self.req_id, self.report, self.ending = spec, room, req_id, report, ending
        self.load_error = False  # its blocks went to get_block_ids_with_load_errors


class _Build:
    """Decode: a kvferry manager for a prefill instance being built on a thread (its bootstrap
    lookup and registration may take up to KVFERRY_LOOKUP_TIMEOUT_MS), and the rooms of that
    instance that wait for it. vLLM's step never waits for it: the requests stay
    WAITING_FOR_REMOTE_KVS until it is done, then their rooms open, or fail as refused."""
    __slots__ = ("addr", "awaits", "loads", "ends", "done", "mgr", "error")

    def __init__(self, addr: str):
        self.addr = addr
        self.awaits: Dict[str, AwaitSpec] = {}
        self.loads: Dict[str, RecvSpec] = {}
        self.ends: Dict[str, EndSpec] = {}
        self.done = False
        self.mgr: Optional[KVManager] = None
        self.error: Optional[BaseException] = None


class WorkerSide:
    def __init__(self, settings: Settings, vllm_config):
        self.s = settings
        self.vllm_config = vllm_config
        self.tp_rank = _tp_rank(vllm_config)
        self.geometry: Optional[Geometry] = None
        self._layer_index: Dict[str, int] = {}
        self._server = None
        self.prefill: Optional[KVManager] = None
        self.decode: Dict[str, KVManager] = {}   # by params.manager_key
        self._building: Dict[str, _Build] = {}   # decode managers whose bootstrap lookup runs on a thread
        self._peer: Dict[str, Tuple[int, str]] = {}  # decode manager -> (prefill TP size, address its rooms name)
        self._sends: Dict[str, _Send] = {}
        self._recvs: Dict[str, _Recv] = {}
        # decode: requests waiting for blocks whose room is open without metadata (kvferry renews
        # its lease at prefill meanwhile); it moves to _recvs when the blocks come or it ends
        self._awaits: Dict[str, KVReceiver] = {}
        self._quarantined: Dict[Tuple[str, int], _Recv] = {}
        self._finished: Set[str] = set()     # finished_req_ids vLLM gave get_finished, not reported yet
        self._unopened_sends: Set[str] = set()  # held requests whose room kvferry refused to open
        self._unopened_recvs: Set[str] = set()  # loading requests whose room was refused at the handshake
        self._invalid: Set[int] = set()
        self._refused: Dict[str, int] = {}   # prefill: requests whose room kvferry refused to open (logged)
        self._reported: Dict[str, None] = {}  # decode: requests reported finished_recving (the last 4096)
        self._stats = KvferryConnectorStats()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = False
        self._thread: Optional[threading.Thread] = None

    # -- registration ----------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches) -> None:
        self.geometry = geometry_of(kv_caches, self.s.block_size, _total_kv_heads(self.vllm_config),
                                    self.s.kv_memory)
        self._layer_index = {n: i for i, n in enumerate(layer_order(list(kv_caches)))}
        self._kv_caches = kv_caches  # keeps the tensors referenced while registered
        if self.s.produces:
            if self.tp_rank == 0:  # the engine's bootstrap service, before any rank registers there
                self._server = BootstrapServer(self.s.bootstrap_host, self.s.bootstrap_port)
            self.prefill = self._build("prefill", self.s.bootstrap_address, self.s.decode_tp_size)
            self._thread = threading.Thread(target=self._send_loop, name="kvferry-vllm-send", daemon=True)
            self._thread.start()

    def _rank_name(self, role: str, tp: int) -> str:
        """As kvferry names a rank (RankId::str): a decode rank with its instance's engine_id."""
        engine = decode_engine_id(self.s.engine_id) if role == "decode" else 0
        return f"{role}{engine or ''}/tp{tp}"

    def _build(self, role: str, bootstrap: str, peer_tp: int) -> KVManager:
        g = self.geometry
        log_file = self.s.log_file.replace("{rank}", f"{role}-tp{self.tp_rank}") if self.s.log_file else None
        # The lease (docs/vllm.md "The lease"): prefill's bootstrap deadline, renewed by decode every
        # third of it while decode waits for blocks, up to the limit.
        lease_ms = max(1, int(self.s.lease_s * 1000))
        if role == "prefill":
            limit_ms = int(self.s.lease_limit_s * 1000) if self.s.lease_limit_s > 0 else 10 * lease_ms
            deadlines = {"bootstrap_timeout_ms": lease_ms, "renew_limit_ms": max(lease_ms, limit_ms)}
        else:
            deadlines = {"renew_interval_ms": max(1, lease_ms // 3)}
        # Decode: its instance's engine_id, from vLLM's per-instance engine_id (kvferry.engine_id;
        # docs/vllm.md "Several decode instances"); prefill's is 0.
        engine_id = decode_engine_id(self.s.engine_id) if role == "decode" else 0
        return KVManager(role, buffers=EngineBuffers(list(g.descs), []), bootstrap_addr=bootstrap,
                         engine_id=engine_id,
                         transport=self.s.transport, tp_rank=self.tp_rank, tp_size=self.s.tp_size,
                         peer_tp_size=peer_tp, deadlines=deadlines, log_file=log_file,
                         transfer_shards=self.s.transfer_shards, log_failures=True,
                         control_bind=self.s.control_host, control_advertise=self.s.control_host,
                         fault_injection=self.s.fault_injection, integrity=self.s.integrity,
                         aux_slots=self.s.aux_rows,
                         **g.manager_kwargs())

    def manager_for(self, bootstrap: str, prefill_tp: int) -> Tuple[Optional[KVManager], str, str]:
        """Decode: the kvferry manager serving that prefill instance, one per normalised address
        (params.manager_key), the address its rooms name (kvferry's manager serves one prefill
        instance, named one way) and the key. None while it is being built: the first request
        naming an instance starts the build on a thread (kvferry's bootstrap lookup and
        registration, bounded by KVFERRY_LOOKUP_TIMEOUT_MS; a 401/403 ends it at once), so a
        made-up or unreachable address never blocks vLLM's step. A request naming another TP size
        than the manager's is refused (ValueError): it never changes the manager other requests
        use; beyond kvferry_max_prefill_instances, RuntimeError."""
        key = manager_key(bootstrap)
        if key not in self._peer:
            if len(self._peer) >= self.s.max_prefill_instances:
                raise RuntimeError(f"this decode rank already serves {len(self._peer)} prefill instances "
                                   f"(kvferry_max_prefill_instances={self.s.max_prefill_instances})")
            self._peer[key] = (prefill_tp, bootstrap)
            self._start_build(key, bootstrap, prefill_tp)
        tp, addr = self._peer[key]
        if tp != prefill_tp:
            raise ValueError(f"tp_size {prefill_tp} differs from {tp}, the TP size of the prefill instance {addr} "
                             "this decode rank's kvferry manager serves")
        return self.decode.get(key), addr, key

    def _start_build(self, key: str, addr: str, prefill_tp: int) -> None:
        b = self._building[key] = _Build(addr)

        def build():
            mgr, err = None, None
            try:  # kvferry releases the GIL while it looks the instance up
                mgr = self._build("decode", addr, prefill_tp)
            except Exception as e:  # noqa: BLE001 (reported per request as kvferry's error)
                err = e
            with self._lock:
                b.mgr, b.error, b.done = mgr, err, True
                if self._stop or self._building.get(key) is not b:  # shut down meanwhile
                    if mgr is not None:
                        mgr.close()
                    return
                # At once, not at the next step: an engine with nothing else to do may not step.
                self._settle_builds()
        threading.Thread(target=build, name=f"kvferry-vllm-lookup-{key}", daemon=True).start()

    def _settle_builds(self) -> None:
        """Decode managers whose build ended: their waiting rooms open, or fail as refused (a manager
        that could not be built is forgotten, so a later request tries again)."""
        for key, b in [(k, b) for k, b in self._building.items() if b.done]:
            del self._building[key]
            if b.mgr is not None:
                self.decode[key] = b.mgr
                for rid, spec in b.awaits.items():
                    self._open_await(rid, spec)
                for rid, spec in b.loads.items():
                    self._open_recv(rid, spec)
                for rid, spec in b.ends.items():
                    self._end(rid, spec)
                continue
            self._peer.pop(key, None)
            for rid, spec in b.loads.items():
                self._refused_recv(rid, spec, b.error)
            for rid, spec in b.ends.items():
                self._end_untold(rid, spec, b.error)

    # -- per step --------------------------------------------------------------------------------

    def start_load_kv(self, meta: Optional[KvferryConnectorMetadata]) -> None:
        if meta is None:
            return
        with self._lock:
            self._settle_builds()
            for rid, spec in meta.ends.items():  # prefill first: a preempted request's old room ends
                if not spec.bootstrap:           # before its new one opens (same request id)
                    self._end(rid, spec)
            for rid, spec in meta.layerwise.items():
                st = self._open_send(rid, spec)
                if st is not None:
                    st.candidate = True  # its layers may go as they are saved, if decode waits by then
            for rid, spec in meta.sends.items():
                st = self._open_send(rid, spec)
                if st is not None:
                    st.held = True
                else:  # the room could not be opened: vLLM frees the blocks at once
                    self._unopened_sends.add(rid)
            for rid, spec in meta.awaits.items():
                self._open_await(rid, spec)
            for rid, spec in meta.recvs.items():
                self._open_recv(rid, spec)
            for rid, spec in meta.ends.items():
                if spec.bootstrap:
                    self._end(rid, spec)
            self._pump()
        self._wake.set()

    def _open_send(self, rid: str, spec: SendSpec) -> Optional[_Send]:
        st = self._sends.get(rid)
        if st is not None and st.spec.room == spec.room:
            return st
        if self._refused.get(rid) == spec.room:  # refused already (logged once)
            return None
        try:
            room = KVSender(self.prefill, spec.room)
            room.init(len(spec.block_ids), spec.aux, num_tokens=spec.num_tokens)
        except (ValueError, RuntimeError) as e:
            logger.warning("request %s: kvferry room %d not opened on prefill: %s", rid, spec.room, e,
                           extra={"room": spec.room, "code": getattr(e, "code", "invalid_argument")})
            self._stats.data["failed"] += 1
            self._refused[rid] = spec.room
            return None
        st = self._sends[rid] = _Send(spec, room)
        return st

    def _open_await(self, rid: str, spec: AwaitSpec) -> None:
        """Decode: a request waiting for blocks. Its room opens now, without metadata: kvferry's
        receiver knows its prefill sources and renews the room's lease there while this rank
        lives (docs/vllm.md "The lease"). Nothing is reported for it until its blocks come
        (RecvSpec) or it ends (EndSpec); a refusal here is left to those (they meet it again)."""
        try:
            mgr, addr, key = self.manager_for(spec.bootstrap, spec.prefill_tp)
            if mgr is None:  # its manager is being built: the room opens when it is done
                self._building[key].awaits[rid] = spec
                return
            if rid not in self._awaits and rid not in self._recvs:
                self._awaits[rid] = KVReceiver(mgr, spec.room, bootstrap_addr=addr)
        except (ValueError, RuntimeError) as e:
            logger.debug("request %s: kvferry room %d not opened while it waits for blocks: %s", rid, spec.room, e)

    def _take_await(self, rid: str, room: int) -> Optional[KVReceiver]:
        """The room opened for the request while it waited for blocks, if it is this room."""
        r = self._awaits.pop(rid, None)
        if r is not None and r.bootstrap_room != room:
            r.abort(f"request {rid} names room {room} now")
            r.close()
            return None
        return r

    def _open_recv(self, rid: str, spec: RecvSpec) -> None:
        # A request id vLLM reuses (older vLLM does not suffix its ids) is a new request: it is
        # reported again when its room concludes (issue 33's attack, finding 5).
        self._reported.pop(rid, None)
        try:
            mgr, addr, key = self.manager_for(spec.bootstrap, spec.prefill_tp)
            if mgr is None:  # its manager is being built: the room opens when it is done
                self._building[key].awaits.pop(rid, None)
                self._building[key].loads[rid] = spec
                return
            room = self._take_await(rid, spec.room) or KVReceiver(mgr, spec.room, bootstrap_addr=addr)
        except (ValueError, RuntimeError) as e:
            self._refused_recv(rid, spec, e)
            return
        self._recvs[rid] = _Recv(spec, room, rid, True, False)
        try:
            room.send_metadata(spec.block_ids, spec.aux, num_tokens=spec.num_tokens)
        except ValueError as e:
            room.fail("protocol_error", f"metadata refused: {e}")

    def _refused_recv(self, rid: str, spec: RecvSpec, e: BaseException) -> None:
        """Refused before a room was opened: by kvferry's bootstrap lookup or handshake (no such
        prefill, not authorized, another geometry or TP size) or by this adapter. Nothing was
        opened in kvferry, so this is the failure's only line; the blocks go to
        get_block_ids_with_load_errors and the request to get_finished (vLLM's policy applies)."""
        code = getattr(e, "code", None) or "protocol_error"
        logger.error("request %s: kvferry room %d refused at the handshake with %s: %s", rid, spec.room,
                     spec.bootstrap, e, extra={"room": spec.room, "code": code, "origin": self._rank_name("decode", self.tp_rank)})
        self._invalid.update(spec.block_ids)
        self._record_failure(rid, spec.room, code, self._rank_name("decode", self.tp_rank), False, str(e))
        self._unopened_recvs.add(rid)

    def _end_untold(self, rid: str, spec: EndSpec, e: BaseException) -> None:
        """An end whose prefill instance kvferry could not reach or was refused by: nothing was
        opened, so this rank's line is the failure's only one here; the prefill instance is not
        told and frees the blocks at its lease. A request vLLM waits for is reported at once."""
        if self.tp_rank == 0:
            logger.log(logging.INFO if spec.code == "aborted" else logging.ERROR,
                       "room %d failed: %s at %s: %s; the prefill instance %s could not be told (%s)",
                       spec.room, spec.code, self._rank_name("decode", 0), spec.reason, spec.bootstrap, e,
                       extra={"room": spec.room, "code": spec.code, "origin": self._rank_name("decode", 0)})
        if spec.report:
            self._unopened_recvs.add(rid)

    def _end(self, rid: str, spec: EndSpec) -> None:
        """A room the engine gave up before its transfer (vLLM's scheduler decided it once for the
        whole engine): TP rank 0 fails it as its own failure (origin, one line above debug), the
        other ranks as learned from it (fail_from_engine: debug), and each tells its peers."""
        role = "decode" if spec.bootstrap else "prefill"
        if spec.bootstrap:
            r = self._recvs.get(rid)
            q = next((k for k, v in self._quarantined.items() if v.req_id == rid), None)
            if r is None and q is not None:
                # Failed and released quarantined: it stays unreported until kvferry reclaims the
                # room (take_reclaimed_rooms); no second receiver for the room, no report now.
                self._quarantined[q].report = self._quarantined[q].report or spec.report
                return
            if r is None and rid in self._reported:
                # This rank's part concluded and was reported: its failure, if any, has had its line at
                # its origin, and an end after a Success is no transfer failure (issue 33 attack F7).
                logger.debug("request %s ended (%s) after room %d concluded here: %s", rid, spec.code, spec.room,
                             spec.reason)
                return
            if r is not None and r.room.poll() == KVPoll.Failed:
                # Failed already (e.g. vLLM's policy fail ends the request for the failure it was
                # told of): the failure stands, with its own origin and line; nothing new to say.
                r.report = r.report or spec.report
                return
            if r is None:
                try:
                    mgr, addr, key = self.manager_for(spec.bootstrap, spec.peer_tp)
                    if mgr is None:  # its manager is being built: the end waits for it
                        b = self._building[key]
                        b.awaits.pop(rid, None)
                        b.loads.pop(rid, None)
                        b.ends[rid] = spec
                        return
                    room = self._take_await(rid, spec.room) or KVReceiver(mgr, spec.room, bootstrap_addr=addr)
                except (ValueError, RuntimeError) as e:
                    return self._end_untold(rid, spec, e)
                r = self._recvs[rid] = _Recv(spec, room, rid, spec.report, True)
            r.ending, r.report = True, spec.report
            target = r.room
        else:
            self._refused.pop(rid, None)
            if spec.report:
                # vLLM keeps the blocks (a write may read them): the room is reported in
                # get_finished once it failed and no write reads them (release_safe), or at once
                # if it was never opened here.
                st = self._sends.get(rid)
                if st is None or st.spec.room != spec.room:
                    self._unopened_sends.add(rid)
                    return
                st.held, st.written, st.layerwise, st.candidate = True, True, False, False
            else:
                st = self._sends.pop(rid, None)
                if st is None:
                    return
            target = st.room
        if self.tp_rank == 0:
            if spec.code == "aborted":
                target.abort(spec.reason)
            else:
                target.fail(spec.code, spec.reason)
        else:
            target.fail_from_engine(KVTransferError(spec.room, spec.reason, True, self._rank_name(role, 0), spec.code))
        if not spec.bootstrap and not spec.report:
            target.close()

    def _pump(self) -> bool:
        """Writes every held room whose decode metadata came. True if some still wait for it."""
        waiting = False
        for rid, st in self._sends.items():
            if not st.held or st.written or st.layerwise:
                continue
            p = st.room.poll()
            if p == KVPoll.WaitingForInput:
                self._write(rid, st, st.layers_sent, self.geometry.num_layers)
            elif p in (KVPoll.Failed, KVPoll.Success, KVPoll.Transferring):
                st.written = True
            else:
                waiting = True
        return waiting

    def _write(self, rid: str, st: _Send, first_layer: int, end_layer: int) -> None:
        layers = None if (first_layer, end_layer) == (0, self.geometry.num_layers) else (first_layer, end_layer)
        try:
            st.room.send(st.spec.block_ids, layers=layers)
        except ValueError as e:
            st.room.fail("protocol_error", f"send refused: {e}")
        st.layers_sent = end_layer
        st.written = end_layer >= self.geometry.num_layers

    def _send_loop(self) -> None:
        while not self._stop:
            with self._lock:
                waiting = self._pump()
            self._wake.wait(_PUMP_S if waiting else 0.1)
            self._wake.clear()

    def save_kv_layer(self, layer_name: str) -> None:
        """Layer-wise: the layer's KV is in the blocks now; send it for rooms decode waits for."""
        l = self._layer_index.get(layer_name)
        if l is None or not self._sends:
            return
        with self._lock:
            for rid, st in self._sends.items():
                if st.candidate and st.room.poll() == KVPoll.WaitingForInput:
                    # Decode waits: the layers saved so far go at once, the next ones as they are saved.
                    st.candidate, st.layerwise = False, True
                    self._stats.data["layerwise"] += 1
                    if l > 0:
                        self._write(rid, st, 0, l)
            rooms = [(rid, st) for rid, st in self._sends.items() if st.layerwise and st.layers_sent == l]
            if rooms and self.geometry.memory == "cuda":
                import torch  # the layer's kernels must have written the blocks before they are read
                torch.cuda.current_stream().synchronize()
            for rid, st in rooms:
                self._write(rid, st, l, l + 1)

    def wait_for_save(self) -> None:
        """The forward pass is over: layer-wise rooms send the layers save_kv_layer did not."""
        with self._lock:
            for rid, st in self._sends.items():
                if st.layerwise and not st.written:
                    self._write(rid, st, st.layers_sent, self.geometry.num_layers)
                st.layerwise = st.candidate = False

    def get_finished(self, finished_req_ids) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        with self._lock:
            self._settle_builds()
            self._finished.update(finished_req_ids or ())
            self._pump()
            sending = {rid for rid in self._unopened_sends if rid in self._finished}
            self._unopened_sends -= sending
            for rid in sending:
                self._refused.pop(rid, None)
            for rid, st in list(self._sends.items()):
                p = st.room.poll()
                if not (st.held and rid in self._finished) or not (
                        p == KVPoll.Success or p == KVPoll.Failed and st.room.release_safe()):
                    continue
                self._record_end(rid, st.room, p)
                st.room.close()
                del self._sends[rid]
                self._finished.discard(rid)
                sending.add(rid)
            recving = {rid for rid in self._finished_recvs() | self._unopened_recvs if rid not in self._reported}
            self._unopened_recvs = set()  # a request is reported once (vLLM asserts it is still known)
            for rid in recving:
                self._reported[rid] = None
            while len(self._reported) > 4096:
                del self._reported[next(iter(self._reported))]
            # Only requests this rank still holds a room for, or reports later, are kept: vLLM
            # names every finished request here, most of them never kvferry's (attack F8).
            self._finished &= set(self._sends) | self._unopened_sends
        return sending or None, recving or None

    def _finished_recvs(self) -> Set[str]:
        out: Set[str] = set()
        for rid, r in list(self._recvs.items()):
            p = r.room.poll()
            if p == KVPoll.Failed and not r.ending and not r.load_error:
                r.load_error = True  # vLLM's policy (recompute or fail) applies to these blocks
                self._invalid.update(r.spec.block_ids)
            if p != KVPoll.Success and not (p == KVPoll.Failed and r.room.release_safe()):
                continue
            if not r.ending:
                self._record_end(rid, r.room, p)
            quarantined = p == KVPoll.Failed and r.room.quarantined()
            r.room.close()
            del self._recvs[rid]
            if quarantined:  # reported once kvferry reclaims the pages
                self._quarantined[(manager_key(r.spec.bootstrap), r.spec.room)] = r
            elif r.report:
                out.add(rid)
        for key, mgr in self.decode.items():
            for room in mgr.take_reclaimed_rooms():
                r = self._quarantined.pop((key, room), None)
                if r is not None and r.report:
                    out.add(r.req_id)
        return out

    def _record_end(self, rid: str, room, p: KVPoll) -> None:
        d = self._stats.data
        if p == KVPoll.Success:
            d["succeeded"] += 1
            try:
                d["bytes"] += int(room.metrics().get("bytes", 0))
            except (ValueError, RuntimeError):
                pass
            return
        e = room.failure()
        if e is not None:
            self._record_failure(rid, room.bootstrap_room, e.code, e.origin, e.is_from_another_rank, e.failure_reason)

    def _record_failure(self, rid: str, room: int, code: str, origin: str, from_another: bool, reason: str) -> None:
        self._stats.data["failed"] += 1
        self._stats.data["failures"].append({"request_id": rid, "room": room, "code": code, "origin": origin,
                                             "is_from_another_rank": from_another, "reason": reason[:500]})

    def get_block_ids_with_load_errors(self) -> Set[int]:
        with self._lock:
            out, self._invalid = self._invalid, set()
        return out

    def get_kv_connector_stats(self) -> Optional[KvferryConnectorStats]:
        with self._lock:
            return None if self._stats.is_empty() else self._stats.clone_and_reset()

    def shutdown(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        with self._lock:
            for st in self._sends.values():
                st.room.close()
            for r in self._recvs.values():
                r.room.close()
            for w in self._awaits.values():
                w.close()
            self._sends.clear()
            self._recvs.clear()
            self._awaits.clear()
            for mgr in [self.prefill] + list(self.decode.values()):
                if mgr is not None:
                    mgr.close()
            self.prefill, self.decode, self._server = None, {}, None
            self._building.clear()  # a build still running closes its manager when it ends
