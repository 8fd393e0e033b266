"""STAND-IN for vllm/v1/core/sched/scheduler.py: the scheduler's calls into a KV connector, in
vLLM's order (no chunked prefill, no prefix caching, no spec decode):

* __init__: KVConnectorFactory.create_connector(config, SCHEDULER, kv_cache_config);
  recompute_kv_load_failures from kv_transfer_config.kv_load_failure_policy.
* add_request(): the request joins waiting and self.requests, then connector.on_new_request(request)
  (vLLM's Scheduler.add_request; KVConnectorBase_V1.on_new_request is a no-op by default).
* schedule(): running requests get one token each (a request that gets no block is preempted:
  _preempt_request); then waiting ones: a WAITING_FOR_REMOTE_KVS request is skipped until
  _update_waiting_for_remote_kv says its KV arrived; others: get_num_new_matched_tokens (None:
  ask again later), allocate_slots, update_state_after_alloc(request, blocks, external tokens);
  an async load leaves the request WAITING_FOR_REMOTE_KVS. At the end build_connector_meta, before
  num_computed_tokens advance, and finished_req_ids go out with the step.
* update_from_output(): invalid_block_ids -> _handle_invalid_blocks (policy recompute: truncate
  num_computed_tokens at the first bad block, failed_recving_kv_req_ids; policy fail: finish them
  FINISHED_ERROR); new tokens; a finished request -> _free_request -> request_finished; then
  _update_from_kv_xfer_finished: update_connector_output, finished_recving (ready, or free a
  finished one), finished_sending (free the blocks).
* finish_requests() (aborts): a WAITING_FOR_REMOTE_KVS request keeps its blocks until the
  connector reports it finished_recving (delay_free_blocks).
"""
import logging

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole, SupportsHMA
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.request import RequestStatus

logger = logging.getLogger("vllm.v1.core.sched.scheduler")


class Scheduler:
    def __init__(self, vllm_config, kv_cache_config):
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        self.connector = None
        self.recompute_kv_load_failures = True
        ktc = vllm_config.kv_transfer_config
        if ktc is not None:
            self.connector = KVConnectorFactory.create_connector(vllm_config, KVConnectorRole.SCHEDULER,
                                                                 kv_cache_config)
            self.recompute_kv_load_failures = ktc.kv_load_failure_policy == "recompute"
        self.kv_cache_manager = KVCacheManager(kv_cache_config.num_blocks, self.block_size)
        self.requests, self.waiting, self.running = {}, [], []
        self.finished_req_ids, self.preempted_req_ids = set(), set()
        self.finished_recving_kv_req_ids, self.failed_recving_kv_req_ids = set(), set()
        self.scheduled_once: set = set()

    def add_request(self, request) -> None:
        self.waiting.append(request)
        self.requests[request.request_id] = request
        if self.connector is not None:  # vLLM's Scheduler.add_request, after registering the request
            self.connector.on_new_request(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.finished_req_ids or
                    (self.connector is not None and self.connector.has_pending_push_work()))

    def _preempt_request(self, request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.running.remove(request)
        self.waiting.insert(0, request)
        self.preempted_req_ids.add(request.request_id)
        self.scheduled_once.discard(request.request_id)

    def preempt(self, request_id: str) -> bool:
        """Test hook: preempt a running request now (as vLLM does when blocks run out)."""
        req = self.requests.get(request_id)
        if req is None or req not in self.running:
            return False
        self._preempt_request(req)
        return True

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        for req in list(self.running):
            if self.kv_cache_manager.allocate_slots(req, 1) is None:
                self._preempt_request(req)
                continue
            self._schedule(out, req, 1)
        for req in list(self.waiting):
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if not self._update_waiting_for_remote_kv(req):
                    continue
                req.status = RequestStatus.WAITING
            ext, load_async = 0, False
            if self.connector is not None:
                ext, load_async = self.connector.get_num_new_matched_tokens(req, req.num_computed_tokens)
                if ext is None:
                    continue
            num_new = req.num_tokens - req.num_computed_tokens - ext
            blocks = self.kv_cache_manager.allocate_slots(req, num_new + ext)
            if blocks is None:
                break
            if self.connector is not None:
                self.connector.update_state_after_alloc(req, self.kv_cache_manager.get_blocks(req.request_id), ext)
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                continue
            self.waiting.remove(req)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            self._schedule(out, req, num_new)
        if self.connector is not None:
            out.kv_connector_metadata = self.connector.build_connector_meta(out)
        for rid, n in out.num_scheduled_tokens.items():
            self.requests[rid].num_computed_tokens += n
        out.finished_req_ids, self.finished_req_ids = self.finished_req_ids, set()
        out.preempted_req_ids, self.preempted_req_ids = self.preempted_req_ids, set()
        return out

    def _schedule(self, out: SchedulerOutput, req, n: int) -> None:
        ids = self.kv_cache_manager.get_block_ids(req.request_id)
        if req.request_id in self.scheduled_once:
            out.scheduled_cached_reqs[req.request_id] = (ids, req.num_computed_tokens)
        else:
            self.scheduled_once.add(req.request_id)
            out.scheduled_new_reqs.append(NewRequestData(req.request_id, list(req.prompt_token_ids)
                                                         + list(req.output_token_ids), ids, req.num_computed_tokens))
        out.num_scheduled_tokens[req.request_id] = n
        out.total_num_scheduled_tokens += n

    def _update_waiting_for_remote_kv(self, request) -> bool:
        rid = request.request_id
        if rid not in self.finished_recving_kv_req_ids:
            return False
        if rid in self.failed_recving_kv_req_ids:
            if not request.num_computed_tokens:
                self.kv_cache_manager.free(request)
            self.failed_recving_kv_req_ids.remove(rid)
        else:
            (block_ids,) = self.kv_cache_manager.get_block_ids(rid)
            n = min(len(block_ids) * self.block_size, request.num_tokens)
            request.num_computed_tokens = n - 1 if n == request.num_tokens else n
        self.finished_recving_kv_req_ids.remove(rid)
        return True

    def _handle_invalid_blocks(self, invalid: set) -> set:
        affected = set()
        for req in self.waiting:
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                continue
            (ids,) = self.kv_cache_manager.get_block_ids(req.request_id)
            bad = [i for i, b in enumerate(ids) if b in invalid]
            if bad:
                req.num_computed_tokens = bad[0] * self.block_size
                affected.add(req.request_id)
        if not affected:
            return set()
        if not self.recompute_kv_load_failures:
            logger.error("Failing %d request(s) due to KV load failure (failure_policy=fail). Request IDs: %s",
                         len(affected), affected)
            return affected
        logger.warning("Recovered from KV load failure: %d request(s) rescheduled.", len(affected))
        self.failed_recving_kv_req_ids |= affected
        return set()

    def update_from_output(self, so: SchedulerOutput, mro) -> list:
        outputs = []
        kvo = mro.kv_connector_output
        failed = self._handle_invalid_blocks(kvo.invalid_block_ids) if kvo and kvo.invalid_block_ids else set()
        for rid in so.num_scheduled_tokens:
            req = self.requests.get(rid)
            if rid in failed or req is None or req.is_finished() or rid not in mro.sampled_token_ids:
                continue
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk that did not reach the end (not used here)
            req.output_token_ids.extend(mro.sampled_token_ids[rid])
            if len(req.output_token_ids) >= req.max_tokens:
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self.running.remove(req)
                params = self._free_request(req)
                outputs.append({"request_id": rid, "token_ids": list(req.output_token_ids),
                                "finish_reason": "length", "kv_transfer_params": params})
        if failed:
            self.finish_requests(failed, RequestStatus.FINISHED_ERROR)
            outputs += [{"request_id": rid, "token_ids": [], "finish_reason": "error", "kv_transfer_params": None}
                        for rid in failed]
        if kvo is not None:
            self._update_from_kv_xfer_finished(kvo)
        return outputs

    def finish_requests(self, request_ids, status) -> None:
        for rid in list(request_ids):
            req = self.requests.get(rid)
            if req is None or req.is_finished():
                continue
            (self.running if req in self.running else self.waiting).remove(req)
            delay = False
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                delay = rid not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(rid)
                self.failed_recving_kv_req_ids.discard(rid)
            req.status = status
            self._free_request(req, delay)

    def _free_request(self, req, delay_free_blocks: bool = False):
        delay, params = self._connector_finished(req)
        self.finished_req_ids.add(req.request_id)
        if not (delay or delay_free_blocks):
            self._free_blocks(req)
        return params

    def _connector_finished(self, req):
        if self.connector is None:
            return False, None
        block_ids = self.kv_cache_manager.get_block_ids(req.request_id)
        if not isinstance(self.connector, SupportsHMA):
            return self.connector.request_finished(req, block_ids[0])
        return self.connector.request_finished_all_groups(req, block_ids)

    def _free_blocks(self, req) -> None:
        self.kv_cache_manager.free(req)
        del self.requests[req.request_id]

    def _update_from_kv_xfer_finished(self, kvo) -> None:
        if self.connector is not None:
            self.connector.update_connector_output(kvo)
        for rid in kvo.finished_recving or ():
            assert rid in self.requests, rid
            req = self.requests[rid]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(rid)
            else:
                assert req.is_finished(), (rid, req.status)
                self._free_blocks(req)
        for rid in kvo.finished_sending or ():
            assert rid in self.requests, rid
            self._free_blocks(self.requests[rid])
