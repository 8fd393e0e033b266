"""kvferry's log lines into Python `logging` (see kvferry.__doc__).

The compiled side queues every line kvferry logs (any thread, no GIL involved); a daemon thread
here takes them (waiting with the GIL released) and emits each to logger "kvferry.<component>" at
its level. flush_logs() emits what is queued from the calling thread (tests, before reading
captured records). At interpreter exit the callback is removed, the thread joined (atexit runs before daemon threads
are stopped) and the queue emitted, so no kvferry thread ever waits on the interpreter; lines
logged after that (a manager torn down during finalization) go to stderr from warning up.
"""
from __future__ import annotations

import atexit
import logging
import threading

from . import _kvferry

TRACE = 5
logging.addLevelName(TRACE, "TRACE")
# kvferry's LogLevel (kvferry/log.h): trace, debug, info, warning, error, critical.
_LEVELS = (TRACE, logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)

_lock = threading.Lock()  # one emitter at a time keeps lines in order
_thread = None
_stopping = False


def _emit(lines) -> None:
    for level, component, msg, room, code, origin, extra in lines:
        logger = logging.getLogger("kvferry." + component)
        pylevel = _LEVELS[level] if 0 <= level < len(_LEVELS) else logging.INFO
        if not logger.isEnabledFor(pylevel):
            continue
        fields = {"room": room, "code": code or None, "origin": origin or None}
        for k, v in extra.items():
            fields.setdefault("kvferry_" + k, v)
        logger.log(pylevel, msg, extra=fields)


def flush_logs() -> None:
    """Emits every kvferry line queued so far, from this thread."""
    with _lock:
        _emit(_kvferry.log_take(0))


def _run() -> None:
    while not _stopping:
        if _kvferry.log_wait(100):
            with _lock:
                _emit(_kvferry.log_take(0))


def _stop() -> None:
    global _stopping
    _stopping = True
    _kvferry.log_uninstall()
    if _thread is not None:
        _thread.join(timeout=2)
    flush_logs()  # what was queued before the sink went


def start() -> None:
    """Installs the sink and the emitting thread (once per process; KVManager calls it)."""
    global _thread
    with _lock:
        if _thread is not None:
            return
        _kvferry.log_install(0)
        _thread = threading.Thread(target=_run, name="kvferry-logging", daemon=True)
        _thread.start()
        atexit.register(_stop)
