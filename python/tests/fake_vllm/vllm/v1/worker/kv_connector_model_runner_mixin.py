"""STAND-IN for vllm/v1/worker/kv_connector_model_runner_mixin.py: the worker's calls into its KV
connector around each forward pass, in vLLM's order (KVConnectorModelRunnerMixin.
_get_kv_connector_output): bind_connector_metadata, start_load_kv(forward_context), the forward
pass (vLLM's attention layer calls wait_for_layer_load before and save_kv_layer after each layer:
vllm/model_executor/layers/attention/kv_transfer_utils.py), then wait_for_save (not in a step
without forward), get_finished(finished_req_ids), get_block_ids_with_load_errors,
get_kv_connector_stats, clear_connector_metadata. A step with no tokens still makes these calls
(kv_connector_no_forward)."""
from contextlib import contextmanager

from vllm.v1.outputs import KVConnectorOutput


class KVConnectorModelRunnerMixin:
    connector = None

    @contextmanager
    def _get_kv_connector_output(self, scheduler_output, wait_for_save: bool = True):
        output = KVConnectorOutput()
        c = self.connector
        c.bind_connector_metadata(scheduler_output.kv_connector_metadata)
        c.start_load_kv(None)
        try:
            yield output
        finally:
            if wait_for_save:
                c.wait_for_save()
            output.finished_sending, output.finished_recving = c.get_finished(scheduler_output.finished_req_ids)
            output.invalid_block_ids = c.get_block_ids_with_load_errors()
            output.kv_connector_stats = c.get_kv_connector_stats()
            c.clear_connector_metadata()
