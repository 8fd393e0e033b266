"""fail_from_agreement() waits for the failure board without the module's lock (kvferry/manager.h:
"the lock is not held while it waits"): another thread's calls on the same manager go on meanwhile,
and close() waits for the call instead of pulling the manager from under it. Found by the attack on
stop 41's change to the board lookups: the binding held its own mutex for the whole wait, so an
unrelated room's poll() on another thread waited up to the full wait_s."""
import threading
import time

import kvferry
from kv_test_util import make_manager, make_pool, wait_until

WAIT_S = 5.0  # no record ever comes: the call waits all of it


def test_other_calls_go_on_while_an_agreement_waits_and_close_waits_for_it():
    server = kvferry.BootstrapServer()
    addr = f"127.0.0.1:{server.port}"
    pool = make_pool()
    mgr = make_manager("prefill", pool, addr, "shm")
    waiting, other = kvferry.KVSender(mgr, 501), kvferry.KVSender(mgr, 502)
    started, result = threading.Event(), {}

    def agree():
        started.set()
        result["error"] = waiting.fail_from_agreement("failed on another rank (test)", "aborted", WAIT_S)

    t = threading.Thread(target=agree)
    t.start()
    assert started.wait(10)
    time.sleep(0.3)  # into its wait (if not yet, the poll below passes without showing anything)
    # The agreement holds no lock of the module while it waits: a poll of another room returns
    # while the agreement thread is still waiting (it waits WAIT_S for a record that never comes).
    assert wait_until(lambda: other.poll() == kvferry.KVPoll.Bootstrapping, 10)
    assert t.is_alive(), "poll() waited for the agreement's board wait"
    # close() while it waits: returns once the agreement is done; the call's answer is whole.
    mgr.close()
    t.join(30)
    assert not t.is_alive()
    e = result["error"]
    assert e.bootstrap_room == 501 and e.code == "aborted" and e.is_from_another_rank
