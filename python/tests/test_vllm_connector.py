"""kvferry's vLLM connector without engines: how vLLM loads it, and its scheduler-side decisions.

* kvferry imports without vLLM (kvferry.vllm's stand-in base classes); with vLLM importable (the
  stand-in package fake_vllm/, written from vLLM's public code) the connector is a
  KVConnectorBase_V1 and a SupportsHMA, as vLLM's factory requires.
* Both of vLLM's factory rules (vllm/distributed/kv_transfer/kv_connector/factory.py,
  KVConnectorFactory._get_connector_class_with_compat) load it from kv_connector_module_path, and
  the newer rule's refusal of a constructor without kv_cache_config does not hit it (a two-argument
  connector, the negative control, is refused).
* The scheduler side (kvferry/vllm/scheduler.py) under the calls vLLM's Scheduler makes
  (vllm/v1/core/sched/scheduler.py: get_num_new_matched_tokens, update_state_after_alloc,
  build_connector_meta, request_finished): rooms, kv_transfer_params, what is refused and why.
Engine processes and transfers are test_vllm_harness.py's.
"""
import os
import subprocess
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_vllm")

from kvferry.vllm import params as P  # noqa: E402
from kvferry.vllm.config import Settings  # noqa: E402
from kvferry.vllm.scheduler import SchedulerSide  # noqa: E402


def run_py(code: str, with_vllm: bool) -> str:
    env = dict(os.environ)
    if with_vllm:
        env["PYTHONPATH"] = FAKE + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_imports_without_vllm():
    out = run_py("import sys, kvferry.vllm as k; print(k.HAVE_VLLM, 'vllm' in sys.modules, "
                 "k.KvferryConnector.__mro__[1].__module__)", with_vllm=False)
    assert out.split() == ["False", "False", "kvferry.vllm.compat"]


def test_subclasses_vllm_base_when_importable():
    out = run_py("""
import kvferry.vllm as k
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
assert k.HAVE_VLLM
assert issubclass(k.KvferryConnector, KVConnectorBase_V1) and issubclass(k.KvferryConnector, SupportsHMA)
assert isinstance(k.KvferryConnectorMetadata(), KVConnectorMetadata)
assert isinstance(k.KvferryConnectorStats(), KVConnectorStats)
print("ok")
""", with_vllm=True)
    assert out.strip() == "ok"


FACTORY = """
import sys
from vllm.config import KVTransferConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole
from vllm.v1.kv_cache_interface import KVCacheConfig
import kvferry.vllm

class TwoArgConnector:  # the deprecated (vllm_config, role) constructor: the negative control
    def __init__(self, vllm_config, role):
        pass
sys.modules["two_arg"] = type(sys)("two_arg")
sys.modules["two_arg"].TwoArgConnector = TwoArgConnector

def cfg(name, path):
    return VllmConfig(kv_transfer_config=KVTransferConfig(kv_connector=name, kv_connector_module_path=path,
                                                          kv_role="kv_consumer"))

for rule in ("registry_first", "module_path_first"):
    KVConnectorFactory.rule = rule
    assert KVConnectorFactory.get_connector_class(cfg("KvferryConnector", "kvferry.vllm").kv_transfer_config) \\
        is kvferry.vllm.KvferryConnector
    c = KVConnectorFactory.create_connector(cfg("KvferryConnector", "kvferry.vllm"), KVConnectorRole.SCHEDULER,
                                            KVCacheConfig(num_blocks=8))
    assert type(c) is kvferry.vllm.KvferryConnector and c.role == KVConnectorRole.SCHEDULER
    assert c.get_finished_count() is None and c.has_pending_push_work() is False
    KVConnectorFactory.rule = rule
    try:
        KVConnectorFactory.get_connector_class(cfg("TwoArgConnector", "two_arg").kv_transfer_config)
        _, compat = KVConnectorFactory._get_connector_class_with_compat(cfg("TwoArgConnector", "two_arg")
                                                                        .kv_transfer_config)
        print(rule, "two-arg accepted", compat)
    except ValueError as e:
        print(rule, "two-arg refused", "kv_cache_config" in str(e))
"""


def test_factory_loads_it_by_module_path_in_both_rules():
    out = run_py(FACTORY, with_vllm=True).splitlines()
    # registry first: the deprecated signature is still loaded (compat); module path first: refused.
    assert out == ["registry_first two-arg accepted True", "module_path_first two-arg refused True"], out


def settings(role="kv_producer", block_size=4, lease_s=30.0) -> Settings:
    return Settings(role=role, engine_id="e", tp_size=2, dp_index=0, block_size=block_size, lease_s=lease_s,
                    bootstrap_host="10.0.0.1", bootstrap_port=8998, transport="tcp", control_host="",
                    decode_tp_size=2, kv_memory="host", max_prefill_instances=8, log_file="", transfer_shards=1,
                    fault_injection=False, load_failure_policy="recompute")


class Blocks:
    def __init__(self, ids):
        self.ids = ids

    def get_block_ids(self):
        return (list(self.ids),)


def request(rid, n, params, status="RUNNING", computed=0):
    return types.SimpleNamespace(request_id=rid, prompt_token_ids=list(range(n)), num_prompt_tokens=n,
                                 num_computed_tokens=computed, kv_transfer_params=params,
                                 status=types.SimpleNamespace(name=status))


def test_prefill_holds_blocks_and_returns_params():
    s = SchedulerSide(settings())
    r = request("p1", 10, {"do_remote_decode": True})
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s.update_state_after_alloc(r, Blocks([7, 3, 9]), 0)
    room = r.kv_transfer_params[P.ROOM]
    assert 0 < room < 2 ** 63
    meta = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={"p1": 10}))
    assert meta.layerwise["p1"].block_ids == [7, 3, 9] and meta.layerwise["p1"].room == room
    r.status.name = "FINISHED_LENGTH_CAPPED"
    delay, out = s.request_finished(r, [7, 3, 9, 11])
    assert delay is True and s.has_pending_push_work()
    assert out["do_remote_prefill"] is True and out["remote_block_ids"] == [7, 3, 9]
    assert (out[P.ROOM], out[P.BOOTSTRAP], out[P.BLOCK_SIZE], out[P.NUM_TOKENS], out["tp_size"]) == \
        (room, "10.0.0.1:8998", 4, 10, 2)
    meta = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={}))
    assert meta.sends["p1"].block_ids == [7, 3, 9]
    s.update_connector_output(types.SimpleNamespace(finished_sending={"p1"}, finished_recving=None))
    assert not s.has_pending_push_work()


def test_prefill_aborted_request_is_not_held():
    s = SchedulerSide(settings())
    r = request("p2", 4, {"do_remote_decode": True, P.ROOM: 12345})
    s.update_state_after_alloc(r, Blocks([1]), 0)
    assert r.kv_transfer_params[P.ROOM] == 12345  # the router's room is kept
    r.status.name = "FINISHED_ABORTED"
    assert s.request_finished(r, [1]) == (False, None)


def decode_params(**over):
    p = P.prefill_output(room=99, bootstrap="10.0.0.1:8998", engine_id="p", request_id="p1", block_ids=[1, 2, 3],
                         block_size=4, num_tokens=10, tp_size=2, lease_expiry=0.0)
    p.update(over)
    return p


def test_decode_loads_asynchronously_and_opens_the_room():
    s = SchedulerSide(settings("kv_consumer"))
    r = request("d1", 10, decode_params())
    assert s.get_num_new_matched_tokens(r, 0) == (10, True)
    s.update_state_after_alloc(r, Blocks([5, 6, 8, 40]), 10)
    assert r.kv_transfer_params["do_remote_prefill"] is False  # one transfer per request
    meta = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={}))
    spec = meta.recvs["d1"]
    assert (spec.room, spec.bootstrap, spec.block_ids, spec.num_tokens, spec.prefill_tp) == \
        (99, "10.0.0.1:8998", [5, 6, 8], 10, 2)
    # Aborted while loading: the room is ended and vLLM waits for get_finished to report it.
    r.status.name = "FINISHED_ABORTED"
    assert s.request_finished(r, [5, 6, 8, 40]) == (False, None)
    end = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={})).ends["d1"]
    assert (end.room, end.code, end.report) == (99, "aborted", True)


@pytest.mark.parametrize("over,code,words", [
    ({P.BLOCK_SIZE: 16}, "protocol_error", "block size mismatch: prefill 16 tokens, decode 4"),
    ({P.NUM_TOKENS: 11}, "protocol_error", "prefill holds 11 tokens"),
])
def test_decode_refuses_what_it_cannot_load(over, code, words):
    s = SchedulerSide(settings("kv_consumer"))
    r = request("d2", 10, decode_params(**over))
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)  # computed on decode instead
    s.update_state_after_alloc(r, Blocks([1, 2, 3]), 0)
    end = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={})).ends["d2"]
    assert end.code == code and words in end.reason and end.report is False  # prefill is told at once


def test_decode_aborted_before_it_had_blocks_tells_prefill():
    s = SchedulerSide(settings("kv_consumer"))
    r = request("d3", 10, decode_params(), status="FINISHED_ABORTED")
    assert s.request_finished(r, []) == (False, None)
    end = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={})).ends["d3"]
    assert (end.room, end.code, end.report) == (99, "aborted", False)


@pytest.mark.parametrize("over", [{P.ROOM: "99"}, {P.ROOM: 0}, {P.ROOM: 2 ** 63}, {P.BOOTSTRAP: "x"},
                                  {P.BOOTSTRAP: "h:70000"}, {P.BLOCK_SIZE: True}, {"tp_size": 0}])
def test_malformed_params_are_refused(over):
    with pytest.raises(P.ParamsError):
        P.parse_remote_prefill(decode_params(**over))


def test_decode_prefix_hit_in_vllms_order():
    """Issue 33 finding 8: vLLM's Scheduler.schedule (vllm/v1/core/sched/scheduler.py) calls
    get_num_new_matched_tokens(request, num_new_local_computed_tokens), allocate_slots,
    update_state_after_alloc, and only then sets request.num_computed_tokens: a local prefix hit
    ends the room as aborted (info), not as a protocol error."""
    s = SchedulerSide(settings("kv_consumer"))
    r = request("d4", 10, decode_params())
    assert s.get_num_new_matched_tokens(r, 4) == (0, False)
    assert r.num_computed_tokens == 0  # not set yet, as in vLLM
    s.update_state_after_alloc(r, Blocks([1, 2, 3]), 0)
    end = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={})).ends["d4"]
    assert end.code == "aborted" and "prefix cache" in end.reason and end.report is False


def test_decode_malformed_field_tells_prefill_at_once():
    """Issue 33 finding 13: one malformed field (a float block size) still tells the prefill
    instance at once (room, address and TP size are readable): it frees the blocks."""
    s = SchedulerSide(settings("kv_consumer"))
    r = request("d5", 10, decode_params(**{P.BLOCK_SIZE: 16.0}))
    assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    s.update_state_after_alloc(r, Blocks([1, 2, 3]), 0)
    end = s.build_connector_meta(types.SimpleNamespace(num_scheduled_tokens={})).ends["d5"]
    assert (end.room, end.bootstrap, end.code, end.report) == (99, "10.0.0.1:8998", "protocol_error", False)
    assert P.BLOCK_SIZE in end.reason


def test_string_false_is_not_true():
    """Issue 33 finding 15: do_remote_prefill / do_remote_decode "false" (a string) is not true."""
    assert not P.is_kvferry_decode(decode_params(do_remote_prefill="false"))
    s = SchedulerSide(settings())
    r = request("p3", 10, {"do_remote_decode": "false"})
    s.update_state_after_alloc(r, Blocks([1, 2, 3]), 0)
    assert P.ROOM not in r.kv_transfer_params
    r.status.name = "FINISHED_LENGTH_CAPPED"
    assert s.request_finished(r, [1, 2, 3]) == (False, None)
