"""`keras_jumbo.runtime.keep_freed_memory`: glibc keeps freed memory, so a
step's large buffers stop being page-faulted in again."""

import os
import re
import subprocess
import sys

import keras
import pytest

from keras_jumbo import runtime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _FakeLibc:
    def __init__(self, result=1):
        self.calls = []
        self.result = result

    def mallopt(self, param, value):
        self.calls.append((param, value))
        return self.result


@pytest.fixture
def dispatch_calls(monkeypatch):
    """Records the switch to synchronous JAX dispatch instead of making
    it in the test process."""
    calls = []
    monkeypatch.setattr(
        runtime,
        "_dispatch_jax_on_the_calling_thread",
        lambda: calls.append(True),
    )
    return calls


def test_sets_one_arena_no_mmap_and_no_trimming(monkeypatch, dispatch_calls):
    libc = _FakeLibc()
    monkeypatch.setattr(runtime, "_glibc", lambda: libc)
    assert runtime.keep_freed_memory() is True
    # glibc's parameter numbers (malloc.h): M_ARENA_MAX -8, M_MMAP_MAX -4,
    # M_TRIM_THRESHOLD -1; the threshold is the largest C int.
    assert libc.calls == [(-8, 1), (-4, 0), (-1, 2**31 - 1)]
    # JAX's computations then run on the calling thread; other backends
    # are left alone.
    assert dispatch_calls == (
        [True] if keras.backend.backend() == "jax" else []
    )


def test_reports_a_refused_setting_and_no_glibc(monkeypatch, dispatch_calls):
    monkeypatch.setattr(runtime, "_glibc", lambda: _FakeLibc(result=0))
    assert runtime.keep_freed_memory() is False
    monkeypatch.setattr(runtime, "_glibc", lambda: None)
    assert runtime.keep_freed_memory() is False
    assert dispatch_calls == []


# A jitted JAX function whose compiled form needs a 256 MB temporary
# buffer (the first matmul's output, read again by the second one, as in a
# backward pass). Prints JAX's dispatch setting, the minor page faults of
# each of the last calls, and (glibc's `malloc_stats`, on stderr) the
# largest total of memory ever mapped for single blocks.
_FAULTS = """
import ctypes, resource, sys
from keras_jumbo import runtime
if sys.argv[1] == "keep":
    assert runtime.keep_freed_memory()
import jax, jax.numpy as jnp
print(jax.config.read("jax_cpu_enable_async_dispatch"))
x = jnp.ones((8192, 64), jnp.float32)
w = jnp.ones((64, 8192), jnp.float32)
step = jax.jit(lambda x, w: jnp.tanh(x @ w) @ w.T)
step(x, w).block_until_ready()
faults = []
for _ in range(16):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x, w).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults, flush=True)
ctypes.CDLL("libc.so.6").malloc_stats()
"""
_BUFFER = 8192 * 8192 * 4


def _run_faults(mode):
    """(asynchronous dispatch, faults per call, max mmap bytes)."""
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT)
    for name in (
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_MAX_",
        "MALLOC_TRIM_THRESHOLD_",
    ):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    mapped = re.search(r"max mmap bytes\s*=\s*(\d+)", out.stderr)
    return (
        lines[-3] == "True",
        [int(n) for n in lines[-2].split()],
        int(mapped.group(1)),
    )


@pytest.mark.once
def test_a_jax_step_stops_mapping_and_faulting_its_buffer_in():
    """Measured, not timed: by default every call maps its 256 MB buffer
    afresh (~65,000 page faults of 4 KiB). With the setting applied before
    JAX starts, the buffer is never mapped on its own: it comes from the
    main heap, which grows to its steady size within a few calls, after
    which calls reuse the buffer (next to no faults). Before JAX's
    dispatch ran on the calling thread, a dispatch thread attached to an
    older malloc arena still mapped it at every call in some processes.
    Without glibc it changes nothing and says so."""
    if runtime._glibc() is None:
        assert runtime.keep_freed_memory() is False
        return
    asynchronous, default, default_mapped = _run_faults("default")
    assert asynchronous
    assert min(default) > 20_000, default
    assert default_mapped >= _BUFFER, default_mapped
    asynchronous, kept, kept_mapped = _run_faults("keep")
    assert not asynchronous
    # No block as large as the buffer was ever mapped on its own.
    assert kept_mapped < _BUFFER // 4, kept_mapped
    assert sorted(kept)[len(kept) // 2] < 1_000, kept  # the median
