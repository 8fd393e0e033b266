"""Device buffers through the Python module (docs/gpu.md, "Memory kinds"): a buffer tuple's sixth
field is the CUDA device ordinal, and registration refuses what this machine cannot back, naming
the buffer and its device."""
import numpy as np
import pytest

import kvferry
from kvferry import _kvferry


def _manager(buffers):
    g = kvferry._geometry(1, 1, 8, 2, 2, "custom", "GQA")
    m = _kvferry.Manager("prefill", None, buffers, g, 16, 4, "", "tcp", 0, 1, 0, {}, "", 1)
    m.close()


def _tuples(kv, *tail):
    return [(x.ctypes.data, x.nbytes, x.nbytes // 4, "kv") + tail for x in kv]


@pytest.fixture
def kv():
    return [np.zeros((4, 16 * 16), np.uint8) for _ in range(2)]


def test_device_ordinal_reaches_registration(kv):
    # Host memory said to be device 5's: no build and no machine accepts it; the refusal names it.
    with pytest.raises(ValueError, match=r"kv buffer 0 \(cuda device 5\): "):
        _manager(_tuples(kv, "cuda", 5))
    with pytest.raises(ValueError, match=r"kv buffer 0 \(cuda device 0\): "):
        _manager(_tuples(kv, "cuda"))  # five fields: device 0


def test_buffer_tuples_are_checked(kv):
    with pytest.raises(ValueError, match=r"memory\[, device\]"):
        _manager(_tuples(kv, "host", 0, 9))
    with pytest.raises(ValueError, match="host memory names cuda device 3"):
        _manager(_tuples(kv, "host", 3))
    _manager(_tuples(kv, "host", 0))
