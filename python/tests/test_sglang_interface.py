"""kvferry.sglang against the stand-in of SGLang's interface (fake_sglang/, written by us from
SGLang's public code): every method the stand-in declares exists on our class with the same
parameter names, kinds and defaults and the same declared return type, so a signature drift fails
here; the attributes SGLang's schedulers read exist on live objects; unsupported setups fail at
construction naming the setting; KVTransferError carries SGLang's fields and kvferry's."""
import contextlib
import inspect
import os
import sys
import typing

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "fake_sglang"))

from sglang.srt.disaggregation.base import conn as standin  # noqa: E402  (the stand-in)
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

import kvferry  # noqa: E402
from kv_test_util import wait_until  # noqa: E402
import kvferry.sglang as ks  # noqa: E402

PAIRS = [(ks.KVManager, standin.BaseKVManager), (ks.KVSender, standin.BaseKVSender),
         (ks.KVReceiver, standin.BaseKVReceiver), (ks.KVBootstrapServer, standin.BaseKVBootstrapServer)]


def _name(a):
    if a is inspect.Signature.empty:
        return None
    if isinstance(a, str):
        return a.replace("typing.", "")
    if isinstance(a, type):
        return a.__name__
    return str(a).replace("typing.", "")


def _methods(cls):
    return {n: v for n, v in vars(cls).items() if callable(v) or isinstance(v, staticmethod)}


@pytest.mark.parametrize("ours,theirs", PAIRS, ids=lambda c: c.__name__)
def test_methods_match_the_interface(ours, theirs):
    for name, fn in _methods(theirs).items():
        assert hasattr(ours, name), f"{ours.__name__} lacks {name}"
        is_static = isinstance(inspect.getattr_static(theirs, name), staticmethod)
        assert isinstance(inspect.getattr_static(ours, name), staticmethod) == is_static, f"{name}: static-ness"
        want = inspect.signature(getattr(theirs, name))
        got = inspect.signature(getattr(ours, name))
        assert [(p.name, p.kind) for p in got.parameters.values()] == \
               [(p.name, p.kind) for p in want.parameters.values()], f"{ours.__name__}.{name}: {got} vs {want}"
        for p in want.parameters.values():
            assert got.parameters[p.name].default == p.default, f"{ours.__name__}.{name}({p.name}) default"
        if want.return_annotation is not inspect.Signature.empty:
            assert _name(got.return_annotation) == _name(want.return_annotation), \
                f"{ours.__name__}.{name} returns {got.return_annotation}, the interface {want.return_annotation}"


def test_kvargs_fields_and_enums():
    assert typing.get_type_hints(standin.KVArgs).keys() <= set(ks.KVArgs.__annotations__)
    for name in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"):
        assert int(getattr(ks.KVPoll, name)) == getattr(standin.KVPoll, name)
    assert [f.name for f in ks.rooms.KVTransferMetric.__dataclass_fields__.values()] == \
           [f.name for f in standin.KVTransferMetric.__dataclass_fields__.values()]
    assert list(ks.PrefillServerInfo.__dataclass_fields__) == list(standin.PREFILL_INFO_FIELDS)


def test_transfer_error_fields():
    e = ks.KVTransferError(7, "why", True, "prefill/tp1", "transfer_error")
    assert (e.bootstrap_room, e.failure_reason, e.is_from_another_rank, e.origin, e.code) == (
        7, "why", True, "prefill/tp1", "transfer_error")
    assert isinstance(e, Exception) and "why" in str(e)
    # SGLang builds it positionally with three arguments.
    assert ks.KVTransferError(7, "why", False).is_from_another_rank is False


# -- live objects: one prefill and one decode rank in this process, host memory ------------------

PAGE, PAGES, HEADS, HEAD_BYTES, LAYERS = 4, 8, 2, 32, 2


def kv_args(tp_rank=0, decode=False):
    a = ks.KVArgs()
    kv = [np.zeros((PAGES, PAGE * HEADS * HEAD_BYTES), np.uint8) for _ in range(2 * LAYERS)]
    aux = [np.zeros((4, 64), np.uint8), np.zeros((4, 8), np.uint64)]
    a._keep = kv + aux
    a.engine_rank, a.pp_rank, a.system_dp_rank, a.page_size = tp_rank, 0, 0, PAGE
    a.kv_data_ptrs = [x.ctypes.data for x in kv]
    a.kv_data_lens = [x.nbytes for x in kv]
    a.kv_item_lens = [x.nbytes // PAGES for x in kv]
    a.aux_data_ptrs = [x.ctypes.data for x in aux]
    a.aux_data_lens = [x.nbytes for x in aux]
    a.aux_item_lens = [x.nbytes // 4 for x in aux]
    a.state_types, a.state_data_ptrs, a.state_data_lens, a.state_item_lens = [], [], [], []
    a.kv_cache_dtype_str = "auto"
    if not decode:  # SGLang's prefill sets the heads; its decode does not
        a.kv_head_num, a.total_kv_head_num = HEADS, HEADS
    return a


@pytest.fixture
def host_env(monkeypatch):
    for k, v in {"KVFERRY_KV_MEMORY": "host", "KVFERRY_STATE_MEMORY": "host", "KVFERRY_TRANSPORT": "tcp",
                 "KVFERRY_TOTAL_KV_HEADS": str(HEADS), "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE": "1",
                 "KVFERRY_LOOKUP_TIMEOUT_MS": "20000"}.items():
        monkeypatch.setenv(k, v)


@contextlib.contextmanager
def _managers():
    """A prefill and a decode KVManager behind one bootstrap server, as SGLang builds them; yields
    (prefill, decode, bootstrap address) with decode's view of the prefill instance fetched."""
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    sargs = ServerArgs(disaggregation_bootstrap_port=server.port, disaggregation_transfer_backend="kvferry")
    p = ks.KVManager(kv_args(), DisaggregationMode.PREFILL, sargs, False)
    d = ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE, sargs, False)
    try:
        addr = f"127.0.0.1:{server.port}"
        assert d.try_ensure_parallel_info(addr) is True
        yield p, d, addr
    finally:
        p.close()
        d.close()


def test_live_objects_have_what_the_schedulers_read(host_env):
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    sargs = ServerArgs(disaggregation_bootstrap_port=server.port, disaggregation_transfer_backend="kvferry")
    p = ks.KVManager(kv_args(), DisaggregationMode.PREFILL, sargs, False)
    d = ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE, sargs, False)
    try:
        for a in standin.MANAGER_ATTRS_PREFILL:
            assert hasattr(p, a), a
        for a in standin.MANAGER_ATTRS_DECODE:
            assert hasattr(d, a), a
        addr = f"127.0.0.1:{server.port}"
        assert d.try_ensure_parallel_info(addr) is True
        info = d.prefill_info_table[addr]
        assert (info.attn_tp_size, info.dp_size, info.page_size, info.target_tp_ranks) == (1, 1, PAGE, [0])
        s = ks.KVSender(p, addr, 11, [0], 0)
        r = ks.KVReceiver(d, addr, 11)
        for a in standin.SENDER_ATTRS:
            assert hasattr(s, a), a
        assert r.poll() == ks.KVPoll.Bootstrapping
        r.init(0)
        for a in standin.RECEIVER_ATTRS:
            assert hasattr(r, a), a
        assert r.poll() == ks.KVPoll.WaitingForInput and s.poll() == ks.KVPoll.Bootstrapping
        assert s.pop_decode_prefix_len() == 0
        assert s.should_send_kv_chunk(0, True) and not s.should_send_kv_chunk(0, False)
        assert ks.KVReceiver.query_prefill_dp_ranks(addr, [11]) == {}
        r.abort()
        assert r.poll() == ks.KVPoll.Failed
        with pytest.raises(ks.KVTransferError) as e:
            r.failure_exception()
        # The decode server's ranks carry its engine_id (kvferry.engine_id: one prefill serves several).
        assert (e.value.code, e.value.origin, e.value.is_from_another_rank) == ("aborted", f"decode{d.engine_id()}/tp0",
                                                                                False)
        assert isinstance(s.get_transfer_metric(), ks.rooms.KVTransferMetric)
        s.clear()
        r.clear()
    finally:
        p.close()
        d.close()


def test_a_receiver_failed_by_its_group_defers_the_free(host_env, monkeypatch):
    """Issue 30, fix 1. SGLang's decode (decode.py, DecodeTransferQueue.pop_transferred) calls
    failure_exception() on every rank once its TP group's MIN poll is Failed, then frees the room's
    pages at once unless the receiver's abort_notified is True (then it waits for the manager's
    is_abort_release_safe). Here this rank's own room had not failed (the failure was another
    rank's) and the prefill's writes are still in flight (held): failure_exception() must fail the
    room here, say is_from_another_rank, and set abort_notified, since a write can still land.
    Before the fix abort_notified was set by poll() only, so such a rank freed at once."""
    monkeypatch.setenv("KVFERRY_FAULT_INJECTION", "1")
    with _managers() as (p, d, addr):
        s = ks.KVSender(p, addr, 12, [0], 0)
        r = ks.KVReceiver(d, addr, 12)
        r.init(0)
        r.send_metadata(np.array([1, 2], np.int32), 1, [])
        assert wait_until(lambda: s.poll() == ks.KVPoll.WaitingForInput)
        p._mgr.hold_writes(12)  # the writes stay in flight
        s.init(2, 0)
        s.send(np.array([3, 4], np.int32), [])
        assert wait_until(lambda: p._mgr.held_writes(12) > 0)
        assert r.poll() != ks.KVPoll.Failed and not r.abort_notified
        with pytest.raises(ks.KVTransferError) as e:
            r.failure_exception()  # the group said Failed
        assert e.value.is_from_another_rank is True
        # What SGLang reads next, before any other call (no poll() in between).
        assert r.abort_notified is True, "a rank failed by its group freed while a write could still land"
        assert not r.release_safe()
        assert r.poll() == ks.KVPoll.Failed
        assert not d.is_abort_release_safe(12, 1)
        p._mgr.release_held_writes(12)
        assert wait_until(lambda: d.is_abort_release_safe(12, 1))
        s.clear()
        r.clear()


def test_a_sender_decode_never_asks_for_fails_at_its_bootstrap_deadline(host_env, monkeypatch):
    """SGLang's prefill (prefill.py, PrefillBootstrapQueue.pop_bootstrapped) polls a sender until
    WaitingForInput and init()s it only then; a request decode never asks for must fail at the
    bootstrap deadline (SGLang's backends: the sender's poll after bootstrap_timeout), which
    kvferry's manager keeps (the adapter holds no deadline of its own). A decode rank that asks
    later is answered with that cause, not left to its waiting timeout."""
    monkeypatch.setenv("KVFERRY_BOOTSTRAP_TIMEOUT_MS", "300")
    monkeypatch.setenv("KVFERRY_WAITING_TIMEOUT_MS", "3600000")
    with _managers() as (p, d, addr):
        s = ks.KVSender(p, addr, 13, [0], 0)
        assert wait_until(lambda: s.poll() == ks.KVPoll.Failed)
        with pytest.raises(ks.KVTransferError) as e:
            s.failure_exception()
        assert (e.value.code, e.value.origin, e.value.is_from_another_rank) == \
            ("bootstrap_timeout", "prefill/tp0", False)
        r = ks.KVReceiver(d, addr, 13)
        r.init(0)
        r.send_metadata(np.array([1, 2], np.int32), 1, [])
        assert wait_until(lambda: r.poll() == ks.KVPoll.Failed)
        with pytest.raises(ks.KVTransferError) as e:
            r.failure_exception()
        assert (e.value.code, e.value.origin, e.value.is_from_another_rank) == \
            ("bootstrap_timeout", "prefill/tp0", True)
        assert wait_until(lambda: r.release_safe() and s.release_safe())
        s.clear()
        r.clear()


@pytest.mark.parametrize("field,value,needle", [
    ("dp_size", 2, "--dp-size"), ("pp_size", 2, "--pp-size"), ("attn_cp_size", 2, "context parallelism"),
])
def test_unsupported_parallelism_fails_at_construction(host_env, field, value, needle):
    sargs = ServerArgs(**{field: value})
    with pytest.raises(ks.UnsupportedConfiguration, match=needle):
        ks.KVManager(kv_args(), DisaggregationMode.PREFILL, sargs, False)


def test_dp_attention_refusals_name_the_setting(host_env):
    """DP attention is served (test_sglang_harness.py); what is not is refused at construction."""
    dp2 = dict(tp_size=2, dp_size=2, enable_dp_attention=True)
    # Decode DP attention with SGLang's decode default (auto: round_robin): kvferry's prefill
    # writes a room to decode DP rank room % dp, so decode must dispatch by bootstrap_room.
    with pytest.raises(ks.UnsupportedConfiguration, match="follow_bootstrap_room"):
        ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE, ServerArgs(**dp2), False)
    with pytest.raises(ks.UnsupportedConfiguration, match="multiple"):
        ks.KVManager(kv_args(), DisaggregationMode.PREFILL, ServerArgs(**{**dp2, "tp_size": 3}), False)
    a = kv_args(tp_rank=1)  # prefill: engine_rank is the global TP rank, so DP rank 1 with attn_tp 1
    a.system_dp_rank = 0
    with pytest.raises(ks.UnsupportedConfiguration, match="attention DP rank 1"):
        ks.KVManager(a, DisaggregationMode.PREFILL, ServerArgs(**dp2), False)


def test_dp_attention_rooms_on_the_wrong_dp_rank(host_env, monkeypatch):
    """Prefill tp2 dp2 and a decode rank of DP 0 (tp2 dp2, attention TP 1): the registration gives
    decode dp_size 2 and follow_bootstrap_room; a prefill room dispatched to DP 1 that
    follow_bootstrap_room puts on DP 0 fails there as in SGLang (CommonKVSender.__init__), or is
    registered at the bootstrap service with SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1;
    a decode room on a DP rank other than room % 2 fails on it, naming both."""
    monkeypatch.setenv("KVFERRY_PEER_DP_SIZE", "2")
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    addr = f"127.0.0.1:{server.port}"
    dp2 = dict(tp_size=2, dp_size=2, enable_dp_attention=True, disaggregation_bootstrap_port=server.port)
    prefill = []
    for rank in (0, 1):
        a = kv_args(tp_rank=rank)
        a.system_dp_rank = rank
        prefill.append(ks.KVManager(a, DisaggregationMode.PREFILL, ServerArgs(**dp2), False))
    d = ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE,
                     ServerArgs(**dp2, load_balance_method="follow_bootstrap_room"), False)
    try:
        assert d.try_ensure_parallel_info(addr) is True
        info = d.prefill_info_table[addr]
        assert (info.dp_size, info.attn_tp_size, info.follow_bootstrap_room) == (2, 1, True)
        s = ks.KVSender(prefill[1], addr, 10, [0], 0)
        assert s.poll() == ks.KVPoll.Failed
        with pytest.raises(ks.KVTransferError, match="follow_bootstrap_room conflict") as e:
            s.failure_exception()
        assert (e.value.code, e.value.origin) == ("invalid_argument", "prefill/tp0/dp1")
        monkeypatch.setenv("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "1")
        s2 = ks.KVSender(prefill[1], addr, 12, [0], 0)
        assert s2.poll() == ks.KVPoll.Bootstrapping
        assert ks.KVReceiver.query_prefill_dp_ranks(addr, [12, 10]) == {"12": 1}
        r = ks.KVReceiver(d, addr, 13)
        r.init(1)
        assert r.poll() == ks.KVPoll.Failed
        with pytest.raises(ks.KVTransferError, match="decode dp_rank 0 got bootstrap_room 13") as e:
            r.failure_exception()
        assert (e.value.code, e.value.origin) == ("invalid_argument", f"decode{r.kv_mgr.engine_id()}/tp0")
        for x in (s, s2, r):
            x.clear()
    finally:
        for m in prefill + [d]:
            m.close()


def test_decode_needs_deferred_release_and_no_decode_prefix(host_env, monkeypatch):
    sargs = ServerArgs(disaggregation_decode_enable_radix_cache=True)
    with pytest.raises(ks.UnsupportedConfiguration, match="decode-enable-radix-cache"):
        ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE, sargs, False)
    monkeypatch.delenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE")
    with pytest.raises(ks.UnsupportedConfiguration, match="DEFERRED_DECODE_KV_RELEASE"):
        ks.KVManager(kv_args(decode=True), DisaggregationMode.DECODE, ServerArgs(), False)


def test_device_memory_on_gpu_id_is_refused_at_construction_without_a_gpu(host_env, monkeypatch):
    """KVArgs' KV pointers as device memory on KVArgs.gpu_id, aux rows on the host (the backend's
    defaults): the gpu_id reaches registration, and memory this machine cannot back as device memory
    of that GPU (here: host arrays; no GPU, or a kvferry without CUDA) fails construction naming the
    buffer, its device and why (docs/gpu.md)."""
    monkeypatch.setenv("KVFERRY_KV_MEMORY", "cuda")
    monkeypatch.delenv("KVFERRY_AUX_MEMORY", raising=False)
    server = ks.KVBootstrapServer("127.0.0.1", 0)
    sargs = ServerArgs(disaggregation_bootstrap_port=server.port)
    args = kv_args()
    args.gpu_id = 3
    descs = ks.settings.buffer_descs(args)
    assert {(d.kind, d.memory, d.device) for d in descs} == {("kv", "cuda", 3), ("aux", "host", 0)}
    with pytest.raises(ValueError, match=r"kv buffer 0 \(cuda device 3\): .*(built without CUDA|no usable CUDA "
                                         r"device|no such device|not device memory)"):
        ks.KVManager(args, DisaggregationMode.PREFILL, sargs, False)
    args.gpu_id = "x"
    with pytest.raises(ks.UnsupportedConfiguration, match="KVArgs.gpu_id 'x' is not a CUDA device ordinal"):
        ks.KVManager(args, DisaggregationMode.PREFILL, sargs, False)
