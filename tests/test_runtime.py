"""`keras_jumbo.runtime.keep_freed_memory`: glibc keeps freed memory, so a
step's large buffers stop being page-faulted in again."""

import os
import subprocess
import sys

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


def test_sets_one_arena_no_mmap_and_no_trimming(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(runtime, "_glibc", lambda: libc)
    assert runtime.keep_freed_memory() is True
    # glibc's parameter numbers (malloc.h): M_ARENA_MAX -8, M_MMAP_MAX -4,
    # M_TRIM_THRESHOLD -1; the threshold is the largest C int.
    assert libc.calls == [(-8, 1), (-4, 0), (-1, 2**31 - 1)]


def test_reports_a_refused_setting_and_no_glibc(monkeypatch):
    monkeypatch.setattr(runtime, "_glibc", lambda: _FakeLibc(result=0))
    assert runtime.keep_freed_memory() is False
    monkeypatch.setattr(runtime, "_glibc", lambda: None)
    assert runtime.keep_freed_memory() is False


# A jitted JAX function whose compiled form needs a 256 MB temporary
# buffer (the first matmul's output, read again by the second one, as in a
# backward pass); prints the minor page faults of each of the last calls.
_FAULTS = """
import resource, sys
from keras_jumbo import runtime
if sys.argv[1] == "keep":
    assert runtime.keep_freed_memory()
import jax, jax.numpy as jnp
x = jnp.ones((8192, 64), jnp.float32)
w = jnp.ones((64, 8192), jnp.float32)
step = jax.jit(lambda x, w: jnp.tanh(x @ w) @ w.T)
step(x, w).block_until_ready()
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step(x, w).block_until_ready()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(*faults)
"""


def _faults_per_call(mode):
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
    return [int(n) for n in out.stdout.split()[-8:]]


@pytest.mark.once
def test_a_jax_step_stops_faulting_its_buffer_in():
    """Measured, not timed: by default every call maps its 256 MB buffer
    afresh (~65,000 page faults of 4 KiB); with the setting applied
    before JAX starts, the heap settles within a few calls and the buffer
    is reused (next to no faults) in most calls. Not in every call on a
    busy machine: a step whose buffer a thread with an older malloc arena
    allocates (one created during `import keras`) still maps it (about
    one call in three with other processes on both cores; see
    `keep_freed_memory`). Without glibc it changes nothing and says so."""
    if runtime._glibc() is None:
        assert runtime.keep_freed_memory() is False
        return
    default = _faults_per_call("default")
    kept = _faults_per_call("keep")
    assert min(default) > 20_000, default
    assert sorted(kept)[len(kept) // 2] < 1_000, kept  # the median
