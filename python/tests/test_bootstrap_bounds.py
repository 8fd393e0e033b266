"""kvferry.sglang.bootstrap's HTTP calls against a server that answers without end (issue 33's
attack, findings 3 and 4): SGLang's decode asks whichever bootstrap address a request names, so the
server may be anyone's. An answer dripped a byte at a time ends at the call's budget (a multiple of
its timeout: urllib's timeout applies to each read); one without end is cut at MAX_RESPONSE_BYTES."""
import http.server
import threading
import time

import pytest

from kvferry.sglang import bootstrap


def _server(gap_s: float, chunk: int):
    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                while not stop.is_set():
                    self.wfile.write(b" " * chunk)
                    self.wfile.flush()
                    if gap_s:
                        time.sleep(gap_s)
            except OSError:
                pass

        def log_message(self, *args):
            pass

    stop = threading.Event()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, stop


@pytest.fixture
def endless(request):
    srv, stop = _server(*request.param)
    yield f"127.0.0.1:{srv.server_address[1]}"
    stop.set()
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("endless", [(0.02, 1)], indirect=True)
def test_a_dripped_answer_ends_at_the_calls_budget(endless):
    status, text = bootstrap.request("GET", endless, "/route", timeout=0.3)
    assert status == 0, (status, text[:80])
    assert "in time" in text


@pytest.mark.parametrize("endless", [(0, 1 << 16)], indirect=True)
def test_an_answer_without_end_is_cut_at_the_size_bound(endless):
    status, text = bootstrap.request("GET", endless, "/route", timeout=5.0)
    assert status == 200
    assert len(text) == bootstrap.MAX_RESPONSE_BYTES
