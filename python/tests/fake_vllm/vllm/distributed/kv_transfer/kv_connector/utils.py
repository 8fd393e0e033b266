"""STAND-IN for vllm/distributed/kv_transfer/kv_connector/utils.py: KVOutputAggregator, which
merges every worker's KVConnectorOutput into the scheduler's: a request is finished sending or
receiving once all expected workers (connector.get_finished_count() or the world size) reported it;
invalid block ids are the union; stats are aggregated."""
from vllm.v1.outputs import KVConnectorOutput


class KVOutputAggregator:
    def __init__(self, expected_finished_count: int):
        self._recv, self._send, self._n = {}, {}, expected_finished_count

    @classmethod
    def from_connector(cls, connector, world_size: int):
        return cls(connector.get_finished_count() or world_size)

    def _update(self, ids, remaining, out):
        for rid in ids or ():
            left = remaining.get(rid, self._n) - 1
            if left == 0:
                remaining.pop(rid, None)
                out.add(rid)
            else:
                remaining[rid] = left

    def aggregate(self, outputs):
        sending, recving, invalid, stats = set(), set(), set(), None
        for o in outputs:
            kvo = o.kv_connector_output
            if kvo is None:
                continue
            self._update(kvo.finished_sending, self._send, sending)
            self._update(kvo.finished_recving, self._recv, recving)
            invalid |= kvo.invalid_block_ids or set()
            if kvo.kv_connector_stats is not None:
                stats = kvo.kv_connector_stats if stats is None else stats.aggregate(kvo.kv_connector_stats)
        out = outputs[0]
        out.kv_connector_output = KVConnectorOutput(finished_sending=sending or None, finished_recving=recving or None,
                                                    kv_connector_stats=stats, invalid_block_ids=invalid)
        return out
