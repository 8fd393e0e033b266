"""The SGLang plugin (kvferry.sglang.plugin) against a stand-in SGLang package (fake_sglang/, ours):
the installed metadata has the entry point in group sglang.srt.plugins, SGLang's loader shape runs
it, and `kvferry` then resolves to kvferry's classes through the backend lookup (also where a module
imported the lookup by name); SGLANG_PLUGINS without kvferry leaves it out; without SGLang the
plugin does nothing. Each case runs in a fresh interpreter (a plugin patches process state)."""
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
FAKE = os.path.join(HERE, "fake_sglang")


def run(code, with_sglang=True, plugins=None):
    paths = ([FAKE] if with_sglang else []) + [os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.pop("SGLANG_PLUGINS", None)
    if plugins is not None:
        env["SGLANG_PLUGINS"] = plugins
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


def test_entry_point_is_in_the_installed_metadata():
    out = run("""
        from importlib.metadata import entry_points, distribution
        eps = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "kvferry"]
        assert len(eps) == 1, eps
        assert eps[0].value == "kvferry.sglang.plugin:register", eps[0].value
        assert distribution("kvferry").version
        print("ok")
    """, with_sglang=False)
    assert out.strip() == "ok"


def test_loader_registers_kvferry_and_the_lookup_returns_its_classes():
    out = run("""
        from sglang.srt.disaggregation import decode  # imported the lookup by name before the plugin ran
        from sglang.srt.disaggregation import utils
        from sglang.srt import server_args
        from sglang.srt.plugins import load_plugins
        import kvferry.sglang as ks

        load_plugins()
        assert "kvferry" in server_args.DISAGG_TRANSFER_BACKEND_CHOICES
        assert server_args.DISAGG_TRANSFER_BACKEND_CHOICES.count("kvferry") == 1
        tb = utils.TransferBackend("kvferry")
        assert tb is utils.TransferBackend.KVFERRY and tb.value == "kvferry" and tb.name == "KVFERRY"
        assert tb in list(utils.TransferBackend)
        K = utils.KVClassType
        got = {t: utils.get_kv_class(tb, t) for t in K}
        assert got == {K.KVARGS: ks.KVArgs, K.MANAGER: ks.KVManager, K.SENDER: ks.KVSender,
                       K.RECEIVER: ks.KVReceiver, K.BOOTSTRAP_SERVER: ks.KVBootstrapServer}, got
        args = server_args.ServerArgs(disaggregation_transfer_backend="kvferry")
        assert decode.receiver_class(args) is ks.KVReceiver
        # Every other backend still gets SGLang's own classes.
        assert utils.get_kv_class(utils.TransferBackend.MOONCAKE, K.SENDER) == "in-tree:mooncake:sender"
        load_plugins()  # idempotent
        assert server_args.DISAGG_TRANSFER_BACKEND_CHOICES.count("kvferry") == 1
        print("ok")
    """)
    assert out.strip() == "ok"


def test_sglang_plugins_filter_leaves_kvferry_out_unless_named():
    code = """
        from sglang.srt.disaggregation import utils
        from sglang.srt.plugins import load_plugins
        load_plugins()
        try:
            utils.TransferBackend("kvferry")
            print("registered")
        except ValueError:
            print("absent")
    """
    assert run(code, plugins="someone_else").strip() == "absent"
    assert run(code, plugins="someone_else, kvferry").strip() == "registered"


def test_plugin_does_nothing_without_sglang():
    out = run("""
        import sys
        from kvferry.sglang import plugin
        plugin.register()
        assert "sglang" not in sys.modules
        assert plugin._done is False
        print("ok")
    """, with_sglang=False)
    assert out.strip() == "ok"
