"""`keras_jumbo.runtime.keep_freed_memory`: glibc keeps freed memory, so a
step's large buffers stop being page-faulted in again."""

import os
import re
import subprocess
import sys

import keras
import numpy as np
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
    # M_TRIM_THRESHOLD -1; a threshold of -1 is mallopt(3)'s "never trim".
    assert libc.calls == [(-8, 1), (-4, 0), (-1, -1)]
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


def _run_script(script, mode):
    """`script` run by a fresh Python on JAX with argument `mode`, without
    the environment's malloc settings; its finished process."""
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=ROOT)
    for name in (
        "MALLOC_ARENA_MAX",
        "MALLOC_MMAP_MAX_",
        "MALLOC_TRIM_THRESHOLD_",
    ):
        env.pop(name, None)
    out = subprocess.run(
        [sys.executable, "-c", script, mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _run_faults(mode):
    """(asynchronous dispatch, faults per call, max mmap bytes)."""
    out = _run_script(_FAULTS, mode)
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


# A block larger than 2 GiB (the largest positive trim threshold
# `mallopt` takes), written, freed, allocated and written again. Prints
# the resident MB before and after the free and the minor page faults of
# the second write.
_LARGE_BLOCK = """
import ctypes, resource, sys
from keras_jumbo import runtime
if sys.argv[1] == "keep":
    assert runtime.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
n = 2_400_000_000
def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 2**20
block = libc.malloc(n)
ctypes.memset(block, 1, n)
held = resident_mb()
libc.free(block)
freed = resident_mb()
block = libc.malloc(n)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ctypes.memset(block, 2, n)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(held, freed, faults, flush=True)
"""


@pytest.mark.once
def test_freed_memory_is_kept_above_2_gib():
    """A freed block larger than 2 GiB stays in the process and is reused
    (MS-PatchTST's ~4.2 GB step buffer at 26 channels, batch 64); with
    glibc's defaults it goes back to the kernel and faults in again."""
    if runtime._glibc() is None:
        return
    numbers = {}
    for mode in ("default", "keep"):
        out = _run_script(_LARGE_BLOCK, mode)
        numbers[mode] = [int(n) for n in out.stdout.split()[-3:]]
    held, freed, faults = numbers["default"]
    assert held > 2200 and freed < held - 2000, numbers
    # 2.4 GB are 586,000 pages of 4 KiB (1,145 of 2 MiB on huge pages).
    assert faults > 1_000, numbers
    held, freed, faults = numbers["keep"]
    assert held > 2200 and freed > held - 100, numbers
    assert faults < 100, numbers


# --- XLA compiler options of the models' JAX steps -------------------------

_CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
cpu family\t: 26
flags\t\t: fpu sse2 avx2 fma {extra}

processor\t: 1
vendor_id\t: {vendor}
flags\t\t: fpu sse2 avx2 fma {extra}
"""


@pytest.mark.parametrize(
    "vendor, extra, expected",
    [
        ("AuthenticAMD", "avx512f avx512bw", True),
        ("AuthenticAMD", "avx512bw", False),  # no avx512f
        ("AuthenticAMD", "", False),
        ("GenuineIntel", "avx512f avx512bw", False),  # not measured
    ],
)
def test_reads_vendor_and_avx512_from_cpuinfo(
    tmp_path, vendor, extra, expected
):
    path = tmp_path / "cpuinfo"
    path.write_text(_CPUINFO.format(vendor=vendor, extra=extra))
    assert runtime._amd_with_avx512(str(path)) is expected
    assert runtime._amd_with_avx512(str(tmp_path / "missing")) is False


@pytest.fixture
def automatic_options():
    """Every test leaves the automatic choice behind it."""
    runtime.set_jax_compiler_options(None)
    runtime._automatic_options.cache_clear()
    yield
    runtime.set_jax_compiler_options(None)
    runtime._automatic_options.cache_clear()


@pytest.mark.parametrize("amd_avx512", [True, False])
def test_automatic_options_are_wide_vectors_on_amd_avx512_cpus(
    monkeypatch, automatic_options, amd_avx512
):
    import jax

    monkeypatch.setattr(runtime, "_amd_with_avx512", lambda: amd_avx512)
    runtime._automatic_options.cache_clear()
    options = runtime.jax_compiler_options()
    on_cpu = jax.default_backend() == "cpu"
    assert options == (
        {"xla_cpu_prefer_vector_width": 512} if amd_avx512 and on_cpu else {}
    )
    options["changed"] = 1  # a copy
    assert "changed" not in runtime.jax_compiler_options()


def test_chosen_options_are_checked_and_kept(automatic_options):
    runtime.set_jax_compiler_options({"xla_cpu_prefer_vector_width": 256})
    assert runtime.jax_compiler_options() == {
        "xla_cpu_prefer_vector_width": 256
    }
    runtime.set_jax_compiler_options({})
    assert runtime.jax_compiler_options() == {}
    with pytest.raises(TypeError, match="options=.*prefer"):
        runtime.set_jax_compiler_options([("xla_cpu_prefer_vector_width", 1)])
    with pytest.raises(TypeError, match=r"options=\{1: 2\}"):
        runtime.set_jax_compiler_options({1: 2})
    with pytest.raises(ValueError, match="xla_cpu_no_such_option"):
        runtime.set_jax_compiler_options({"xla_cpu_no_such_option": True})
    # A refused choice leaves the previous one.
    assert runtime.jax_compiler_options() == {}
    runtime.set_jax_compiler_options(None)
    assert runtime.jax_compiler_options() == dict(runtime._automatic_options())


def test_model_steps_compile_with_the_options(monkeypatch, automatic_options):
    """On JAX, Keras' predict, train and test steps of a model class are
    jitted with the chosen options (a spy on the `jax.jit` Keras calls),
    and the 512-bit and 256-bit programs give the same numbers to
    round-off. On the other backends Keras' JAX trainer is never called
    (one width there: the options mean nothing to them)."""
    import jax
    from keras.src.backend.jax import trainer

    from keras_jumbo import models
    from keras_jumbo.testing import randomize_weights

    seen = []

    def spy(function, **kwargs):
        seen.append(kwargs.get("compiler_options"))
        return jax.jit(function, **kwargs)

    monkeypatch.setattr(trainer, "jit", spy)
    on_jax = keras.backend.backend() == "jax"
    x = np.random.default_rng(0).normal(size=(4, 32, 32, 3)).astype("float32")
    y = np.arange(4) % 10
    outputs = {}
    for width in (256, 512) if on_jax else (512,):
        options = {"xla_cpu_prefer_vector_width": width}
        runtime.set_jax_compiler_options(options)
        model = models.JumboViT(
            "pico", image_size=32, patch_size=8, num_classes=10
        )
        randomize_weights(model, seed=1)
        seen.clear()
        outputs[width] = np.asarray(model.predict_on_batch(x))
        assert seen == ([options] if on_jax else [])
        model.compile(optimizer="adamw", loss="sparse_categorical_crossentropy")
        seen.clear()
        model.test_on_batch(x, y)
        model.train_on_batch(x, y)
        assert seen == ([options, options] if on_jax else [])
    if on_jax:
        np.testing.assert_allclose(outputs[512], outputs[256], atol=1e-5)
    # With no options, Keras' own call: no `compiler_options` argument.
    runtime.set_jax_compiler_options({})
    seen.clear()
    model.make_predict_function(force=True)
    assert seen == ([None] if on_jax else [])


def test_accelerator_available_asks_the_backend(monkeypatch):
    runtime.accelerator_available.cache_clear()
    assert runtime.accelerator_available() is False  # the CPU machines
    runtime.accelerator_available.cache_clear()
    if keras.backend.backend() == "torch":
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    else:
        monkeypatch.setattr(
            keras.distribution, "list_devices", lambda: ["cpu:0", "gpu:0"]
        )
    try:
        assert runtime.accelerator_available() is True
    finally:
        runtime.accelerator_available.cache_clear()


# --- glibc's malloc on transparent huge pages --------------------------------


def test_with_huge_pages_adds_the_tunable_after_the_others():
    env = {"PATH": "/bin"}
    assert runtime.with_huge_pages(env) == {
        "PATH": "/bin",
        "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
    }
    assert env == {"PATH": "/bin"}  # a copy
    env = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.pthread.x=1"}
    assert runtime.with_huge_pages(env)["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.pthread.x=1:glibc.malloc.hugetlb=1"
    )
    # A value the user chose, 0 included, stays.
    for chosen in ("glibc.malloc.hugetlb=0", "a=1:glibc.malloc.hugetlb=2"):
        env = {"GLIBC_TUNABLES": chosen}
        assert runtime.with_huge_pages(env) == env
    assert "GLIBC_TUNABLES" in runtime.with_huge_pages()  # os.environ
    with pytest.raises(TypeError, match=r"environ=\['PATH=/bin'\]"):
        runtime.with_huge_pages(["PATH=/bin"])


@pytest.mark.parametrize(
    "text, mode",
    [
        ("always [madvise] never\n", "madvise"),
        ("[always] madvise never\n", "always"),
        ("always madvise [never]\n", "never"),
        ("always madvise never\n", None),
    ],
)
def test_transparent_huge_page_mode_is_the_bracketed_word(tmp_path, text, mode):
    path = tmp_path / "enabled"
    path.write_text(text)
    assert runtime.transparent_huge_page_mode(str(path)) == mode
    assert runtime.transparent_huge_page_mode(str(tmp_path / "no")) is None


@pytest.mark.parametrize(
    "version, mode, supported",
    [
        ((2, 36), "madvise", True),
        ((2, 35), "madvise", True),
        ((2, 34), "madvise", False),  # no such tunable before 2.35
        ((2, 36), "always", False),  # huge pages already
        ((2, 36), "never", False),
        ((2, 36), None, False),
        (None, "madvise", False),  # not glibc
    ],
)
def test_huge_pages_need_glibc_2_35_and_the_madvise_mode(
    monkeypatch, version, mode, supported
):
    monkeypatch.setattr(runtime, "_glibc_version", lambda: version)
    monkeypatch.setattr(runtime, "transparent_huge_page_mode", lambda: mode)
    assert runtime.huge_pages_supported() is supported


@pytest.fixture
def restart(monkeypatch):
    """`restart_with_huge_pages` where huge pages are supported, with
    `os.execve` recorded instead of run (and made to fail on request)."""
    calls = []
    failure = []

    def execve(path, argv, env):
        calls.append((path, list(argv), dict(env)))
        if failure:
            raise OSError(failure[0])

    monkeypatch.setattr(runtime.os, "execve", execve)
    monkeypatch.setattr(runtime, "huge_pages_supported", lambda: True)
    for name in ("GLIBC_TUNABLES", runtime._RESTARTED):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(runtime.sys, "argv", ["train.py", "--epochs", "3"])
    monkeypatch.setattr(
        runtime.sys, "orig_argv", ["python", "train.py", "--epochs", "3"]
    )
    return calls, failure


def test_restart_starts_the_same_command_with_the_tunable(
    monkeypatch, capsys, restart
):
    calls, failure = restart
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")
    runtime.restart_with_huge_pages()
    ((path, argv, env),) = calls
    assert path == sys.executable
    assert argv == ["python", "train.py", "--epochs", "3"]
    assert env["GLIBC_TUNABLES"] == (
        "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    )
    assert env[runtime._RESTARTED] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert "restarting with GLIBC_TUNABLES" in capsys.readouterr().out
    # `exec` failing: said, and the program goes on without huge pages.
    failure.append("no such file")
    assert runtime.restart_with_huge_pages() is False
    assert "not restarted (no such file)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case",
    ["restarted", "chosen", "off", "unsupported", "stdin", "interactive"],
)
def test_restart_happens_at_most_once_and_only_for_a_script(
    monkeypatch, restart, case
):
    calls, _ = restart
    if case == "restarted":
        monkeypatch.setenv(runtime._RESTARTED, "1")
    elif case == "chosen":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    elif case == "off":
        monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0")
    elif case == "unsupported":
        monkeypatch.setattr(runtime, "huge_pages_supported", lambda: False)
    elif case == "stdin":
        monkeypatch.setattr(runtime.sys, "argv", ["-"])
    else:

        class Flags:
            interactive = 1

        monkeypatch.setattr(runtime.sys, "flags", Flags())
    assert runtime.restart_with_huge_pages() is False
    assert calls == []


# A script that restarts itself, then has glibc's malloc map 96 MB and
# touch it; prints its PID and tunables before and after, and how many kB
# of the process's anonymous memory are huge pages before and after the
# allocation. (numpy asks for huge pages for its own large arrays, so the
# check goes through `malloc`.)
_RESTART = """
import ctypes, os, sys
from keras_jumbo import runtime
print("start", os.getpid(), os.environ.get("GLIBC_TUNABLES"), *sys.argv[1:])
if __name__ == "__main__":
    runtime.restart_with_huge_pages()
    def huge_kb():
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
        return 0
    before = huge_kb()
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    size = 96 * 2**20
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    print("huge", runtime.huge_pages_active(), huge_kb() - before)
"""


def _run_restart(tmp_path, tunables=None):
    script = tmp_path / "restart.py"
    script.write_text(_RESTART)
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop(runtime._RESTARTED, None)
    env.pop("GLIBC_TUNABLES", None)
    if tunables is not None:
        env["GLIBC_TUNABLES"] = tunables
    out = subprocess.run(
        [sys.executable, str(script), "a", "b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [line.split() for line in out.stdout.splitlines()]


@pytest.mark.once
def test_a_restarted_script_gets_huge_pages_from_malloc(tmp_path):
    """Measured in the process, not timed: after the restart (same PID,
    same arguments, the tunable added), 96 MB that `malloc` hands out and
    the program touches are backed by huge pages; in a process started with
    `glibc.malloc.hugetlb=0`, none of them are. Where huge pages are not
    supported (another kernel mode, old glibc, no glibc), the script runs
    once, unchanged."""
    lines = _run_restart(tmp_path)
    if not runtime.huge_pages_supported():
        assert [line[0] for line in lines] == ["start", "huge"]
        assert lines[1][1] == "False"
        return
    start, said, again, huge = lines
    assert start[0] == "start" and start[2:] == ["None", "a", "b"]
    assert said[:3] == ["keras_jumbo:", "restarting", "with"]
    assert again[:2] == start[:2]  # the same process
    assert again[2:] == ["glibc.malloc.hugetlb=1", "a", "b"]
    assert huge[:2] == ["huge", "True"]
    assert int(huge[2]) >= 64 * 1024, huge  # kB: most of the 96 MB
    # Asked against: no restart and no huge pages from malloc.
    start, huge = _run_restart(tmp_path, "glibc.malloc.hugetlb=0")
    assert start[2:] == ["glibc.malloc.hugetlb=0", "a", "b"]
    assert huge[:2] == ["huge", "False"]
    assert int(huge[2]) < 8 * 1024, huge
