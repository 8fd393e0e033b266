"""A decode instance's engine_id (kvferry.engine_id; docs/manager.md "Several decode instances"):
stable, nonzero, 31-bit, the same for every rank of an instance, different between instances; the
KVFERRY_ENGINE_ID override; the adapters' keys (vLLM's kv_transfer_config.engine_id, SGLang's
dist_init_addr or host and port)."""
import types

import pytest

from kvferry import engine_id as E


def test_derive_is_stable_nonzero_and_31_bit():
    # A fixed value: the derivation must not change between processes or releases (every rank of
    # an instance computes it on its own).
    assert E.derive("7d5b1c5e-0f1e-4a53-9f7e-3c1f2b0a9e11") == E.derive("7d5b1c5e-0f1e-4a53-9f7e-3c1f2b0a9e11")
    assert E.derive("") == 1 + int.from_bytes(__import__("hashlib").blake2b(b"", digest_size=8).digest(),
                                              "little") % ((1 << 31) - 1)
    ids = {E.derive(f"instance-{i}") for i in range(2000)}
    assert len(ids) == 2000
    assert all(1 <= i <= (1 << 31) - 1 for i in ids)


def test_override_and_its_bounds():
    assert E.decode_engine_id("a", {}) == E.derive("a")
    assert E.decode_engine_id("a", {"KVFERRY_ENGINE_ID": "42"}) == 42
    assert E.decode_engine_id("a", {"KVFERRY_ENGINE_ID": " "}) == E.derive("a")
    for bad in ("0", "-3", str(1 << 31), "x"):
        with pytest.raises(ValueError, match="KVFERRY_ENGINE_ID"):
            E.decode_engine_id("a", {"KVFERRY_ENGINE_ID": bad})


def test_sglang_key_is_shared_by_a_servers_ranks(monkeypatch):
    from kvferry.sglang.manager import KVManager
    monkeypatch.delenv("KVFERRY_ENGINE_ID", raising=False)
    rank = lambda args: KVManager.engine_id(types.SimpleNamespace(server_args=args))  # noqa: E731
    multi = types.SimpleNamespace(dist_init_addr="10.0.0.5:5000", port=30000)
    assert rank(multi) == E.derive("dist:10.0.0.5:5000")
    assert rank(multi) != rank(types.SimpleNamespace(dist_init_addr="10.0.0.6:5000", port=30000))
    one = types.SimpleNamespace(dist_init_addr=None, port=30000)
    assert rank(one) == rank(types.SimpleNamespace(dist_init_addr=None, port=30000))
    assert rank(one) != rank(types.SimpleNamespace(dist_init_addr=None, port=30001))


def test_a_prefill_engine_is_engine_0():
    import kvferry
    with pytest.raises(ValueError, match="engine_id is 0"):
        kvferry.KVManager("prefill", bytearray(1 << 20), num_layers=2, num_kv_heads=2, head_dim=8, page_size=4,
                          bootstrap_addr="", engine_id=3)
