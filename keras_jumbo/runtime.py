"""Process-wide settings that make steps faster on a CPU.

- `keep_freed_memory()`: glibc keeps the memory a JAX training step frees.
  Call it at the top of a training script, before the first JAX
  computation.
- `restart_with_huge_pages()` / `with_huge_pages(environ)`: glibc's
  `malloc` on transparent huge pages, which it can only be told when a
  process starts (every backend; training steps up to 1.2x faster on a
  CPU).
- `jax_compiler_options()` / `set_jax_compiler_options(options)`: the XLA
  compiler options keras_jumbo's models compile their JAX steps with
  (`fit`, `evaluate`, `predict` and the `*_on_batch` calls). By default,
  512-bit vectors on AMD CPUs with AVX-512, nothing elsewhere.
- `accelerator_available()`: whether the Keras backend sees a GPU or TPU
  (the recipes' augmentation runs on the host without one).
"""

import ctypes
import functools
import os
import platform
import sys
from collections.abc import Mapping

import keras

# glibc's `mallopt` parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
# A trim threshold of -1 turns trimming off altogether (mallopt(3)); the
# largest positive one, 2 GiB, is below some steps' buffers
# (`keep_freed_memory`'s docstring).
_NEVER_TRIM = -1
SETTINGS = (
    (M_ARENA_MAX, 1),
    (M_MMAP_MAX, 0),
    (M_TRIM_THRESHOLD, _NEVER_TRIM),
)


def _glibc():
    """glibc as a `ctypes.CDLL`, or None (not Linux, or another libc)."""
    if platform.system() != "Linux":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    # musl and others have no `gnu_get_libc_version`.
    if not hasattr(libc, "gnu_get_libc_version"):
        return None
    return libc


def keep_freed_memory():
    """Keep the memory a JAX training step frees in the process (glibc).

    On a CPU, XLA gives each compiled step a temporary buffer (271 MB for
    the pico Jumbo at batch 32, 128 px), which glibc's `malloc` maps fresh
    from the kernel and hands back when it is freed: every step then
    page-faults the whole buffer in again (~66,000 faults, ~0.1 s of
    kernel time zeroing pages). This sets, for the whole process, what
    `MALLOC_ARENA_MAX=1 MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=...`
    set from the environment: one malloc arena for every thread, no
    `mmap` for large blocks, and no trimming of the heap at all, so
    the buffer is reused from step to step. Measured on 2 CPU cores (JAX,
    pico, `train_on_batch`): 0 faults per step instead of ~66,000, and
    about +20% images/s (benchmarks/README.md, "The allocator from inside
    the process").

    On the JAX backend it also runs each computation on the thread that
    calls it (`jax_cpu_enable_async_dispatch=False`). Why: the setting of
    one arena applies only to threads that have not allocated yet, and
    `import keras` starts threads that do (pyarrow's, through pandas), so
    glibc can attach JAX's dispatch threads, started later, to one of
    their arenas; an arena other than the main one maps every block
    larger than 64 MB fresh and unmaps it when freed, whatever the
    settings. With asynchronous dispatch, one process in several still
    faulted the buffer in at some or all of its steps (all of them in one
    CI run of tests/test_runtime.py). Python's main thread, where Keras'
    `fit` runs, always allocates from the main arena, so the buffer is
    reused: after the heap has grown to its steady size in the first few
    steps, steps take no faults. Measured (JAX, pico, `fit` at batch 32,
    2 CPU cores): the same images/s as asynchronous dispatch when that
    kept its buffer (118 / 124 against 118 / 123), and never the faulting
    steps. XLA runs a step on the calling thread only when all its inputs
    are on the device: a batch still being copied there sends the step to
    one of XLA's threads, whose arena maps the buffer afresh (the
    12-layer ViT-Tiny at 224 px, batch 16: 1-3 steps of 8 at ~2.1 s
    instead of ~0.6 s, with up to 2 GB more peak memory, in 5 of 8 `fit`
    processes). So keras_jumbo's models (and its distillers) wait for
    each batch to be on the device before a step when dispatch is
    synchronous (`_keras_internals.WaitsForBatches`); a step of your own
    (`jax.jit`) gets the same by passing arrays that are ready
    (`jax.block_until_ready(jax.device_put(batch))`).

    It pays where a step's temporary buffer is large: image models, and
    the time-series models at large batches (`fit` steps of the PatchTST
    classifier at batch 256 ~10% faster, of the forecaster at batch 64
    ~18% faster). A step of ~12 ms (PatchTST+Jumbo at batch 8) ran 15-20%
    slower with it, in `fit` and `train_on_batch` alike (synchronous
    dispatch alone: 5-15% slower; any one of the three malloc settings
    alone, from the environment: 30-80% slower; benchmarks/README.md,
    twelfth session). The time-series recipe calls it for its MS-PatchTST
    fusion study only (steps of 0.14-3.5 s there).

    Trimming is off altogether (`M_TRIM_THRESHOLD` -1), not only below the
    2 GiB a positive threshold can reach: with that threshold (earlier
    versions of this function) a buffer above it was handed back after
    every step (MS-PatchTST, 3 scales, width 64, 26 channels, batch 64:
    ~4.2 GB, ~1.07 M faults a step, 4.6 s a `train_on_batch` step, as slow as
    glibc's defaults; now 0-1,000 faults and 3.5 s; on huge pages 3.4 s
    against 3.75 s for huge pages alone, where the old threshold also
    reached a 9 GB peak).

    Starting the process with glibc's malloc on transparent huge pages
    (`restart_with_huge_pages`) cuts the faults another way, on every
    backend and without the small steps' slowdown. The image recipes on
    JAX use both: on top of huge pages this measured 1.11-1.23x for the
    official pico Jumbo's training step and 1.02-1.07x in other runs; for
    NonDeepViT-6x2 at 224 px, batch 16, 1.14x in one `throughput.py` run
    and the same rate in a `fit` A/B (whose steps, before the models
    waited for their batches, faulted ~1.7 GB each in most processes;
    benchmarks/README.md, thirty-seventh and forty-third sessions).

    With jax 0.11 and later on glibc 2.36 (Debian 12) the process may
    keep one more step buffer than it needs: the 12-layer ViT-Tiny-shaped
    model at 224 px, batch 16, held a 2.3 GB heap from its second step
    on, against 1.4 GB on jax 0.10.2 (its step's temporary buffer is
    ~975 MB on both). XLA's buffers are aligned allocations (above
    malloc's 16 bytes), and glibc 2.36 reuses a freed block for such a
    request only if the block is larger than the request plus the
    alignment, so the first step's freed buffer, an exact fit with a
    live block above it, is passed over once. The heap stops growing
    after that, and the steps were not slower (benchmarks/README.md,
    sixty-fourth session). Where that memory matters, start Python with
    gperftools' tcmalloc in place of glibc's malloc (Debian / Ubuntu:
    `apt install libtcmalloc-minimal4`, then
    `LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 python
    train.py`; this function is harmless there, its glibc settings unused).
    Measured on the same model, processes alternated (sixty-fifth
    session): jax 0.12.1 with this function held 2.19-2.21 GB over the
    start after its steps on glibc (huge pages or not), 1.17-1.20 GB on
    tcmalloc, steps as fast (0.62-0.65 s); jax 0.10.2 1.24-1.28 GB on
    both, 0.70-0.76 s.

    Call it before the first JAX computation (after `import keras` is
    fine): JAX reads the dispatch setting when it creates its CPU client,
    and threads that allocated before the call keep their arena. Called
    later, it changes little. The process keeps its peak memory until it
    ends. It is not meant for TensorFlow (its allocator keeps memory
    already) or `torch.compile` (measured slower with it); the library's
    image recipes call it on JAX only.

    Returns:
        True if the settings were applied; False where there is no glibc
        (not Linux, or another C library), where nothing is changed.

    Example (at the top of a training script):

    ```python
    import keras
    import keras_jumbo

    keras_jumbo.runtime.keep_freed_memory()  # before the first JAX op
    model = keras_jumbo.models.JumboViT("pico", num_classes=10)
    ```
    """
    libc = _glibc()
    if libc is None:
        return False
    applied = all([libc.mallopt(p, v) == 1 for p, v in SETTINGS])
    if applied and keras.backend.backend() == "jax":
        _dispatch_jax_on_the_calling_thread()
    return applied


# glibc's malloc tunable (glibc 2.35 and later) that makes `malloc` call
# `madvise(MADV_HUGEPAGE)` on the memory it maps and on its heap's growth,
# so that a kernel whose transparent-huge-page mode is "madvise" (Debian's
# and many distributions' default) backs it with 2 MiB pages: one page
# fault where there were 512, and fewer TLB misses. glibc reads tunables
# when a process starts (`GLIBC_TUNABLES`), never later.
HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb"
HUGE_PAGES_VALUE = "1"
# Where Linux says which transparent-huge-page mode it runs in, e.g.
# "always [madvise] never".
THP_MODE_PATH = "/sys/kernel/mm/transparent_hugepage/enabled"
# Set in the restarted process's environment, so that it never restarts
# again (also when `GLIBC_TUNABLES` is changed before a second call).
_RESTARTED = "KERAS_JUMBO_RESTARTED_WITH_HUGE_PAGES"


def transparent_huge_page_mode(path=THP_MODE_PATH):
    """The kernel's transparent-huge-page mode: "always", "madvise",
    "never", or None where it cannot be read (not Linux, no THP)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    for word in text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return None


def _glibc_version():
    """glibc's version as a tuple of ints, or None without glibc."""
    libc = _glibc()
    if libc is None:
        return None
    libc.gnu_get_libc_version.restype = ctypes.c_char_p
    text = libc.gnu_get_libc_version().decode()
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def huge_pages_supported():
    """Whether starting Python with glibc's malloc on transparent huge
    pages (`with_huge_pages`) changes anything here: Linux, glibc 2.35 or
    later, and the kernel's mode "madvise" (with "always" every process's
    large allocations get huge pages already; with "never", none can)."""
    version = _glibc_version()
    return (
        version is not None
        and version >= (2, 35)
        and transparent_huge_page_mode() == "madvise"
    )


def _tunables(environ):
    """`GLIBC_TUNABLES` of `environ` as an ordered dict of name: value."""
    text = environ.get("GLIBC_TUNABLES", "")
    pairs = (item.partition("=") for item in text.split(":") if item)
    return {name: value for name, _, value in pairs}


def with_huge_pages(environ=None):
    """A copy of `environ` (default: this process's) for starting a new
    Python process whose glibc `malloc` uses transparent huge pages: its
    `GLIBC_TUNABLES` gains `glibc.malloc.hugetlb=1`, after the tunables
    already there. A `glibc.malloc.hugetlb` value already set is left as
    it is (an explicit choice, 0 included).

    Measured on 2 CPU cores (Intel Xeon, kernel mode "madvise"; separate
    processes, steps per second; benchmarks/README.md, thirty-sixth
    session): JAX training steps 1.17x (pico Jumbo, batch 32), 1.22x
    (PatchTST forecaster, batch 64), 1.23x (MS-PatchTST, 28 channels, a
    step with a multi-GB buffer, where `keep_freed_memory` does not stop
    the faults); eager PyTorch 1.03-1.05x, TensorFlow 1.02x, JAX predict
    steps 1.01-1.05x; an 11 ms step (PatchTST+Jumbo, batch 8) 1.02-1.06x,
    where `keep_freed_memory` made it 0.8x. The process's page faults
    fall 2.7-75x. Numerics: unchanged (only where memory comes from).

    Args:
        environ: mapping of environment variables, or None for
            `os.environ`.

    Returns:
        A new dict (unchanged contents where `glibc.malloc.hugetlb` is
        already set).

    Raises:
        TypeError: `environ` is not a mapping (or None).
    """
    if environ is not None and not isinstance(environ, Mapping):
        raise TypeError(
            "`environ` must be a mapping of environment variables or None. "
            f"Received: environ={environ!r:.200}"
        )
    environ = dict(os.environ if environ is None else environ)
    tunables = _tunables(environ)
    if HUGE_PAGES_TUNABLE not in tunables:
        tunables[HUGE_PAGES_TUNABLE] = HUGE_PAGES_VALUE
        environ["GLIBC_TUNABLES"] = ":".join(
            f"{name}={value}" for name, value in tunables.items()
        )
    return environ


def huge_pages_active():
    """Whether this process's glibc `malloc` asks for transparent huge
    pages: it started with `glibc.malloc.hugetlb` set to a non-zero
    value and `huge_pages_supported()`."""
    value = _tunables(os.environ).get(HUGE_PAGES_TUNABLE, "0")
    return value not in ("", "0") and huge_pages_supported()


def restart_with_huge_pages():
    """Start the running Python program again, in the same process (`exec`,
    same PID, arguments and environment), with glibc's `malloc` on
    transparent huge pages (`with_huge_pages`), where that changes
    something (`huge_pages_supported()`) and it was not asked for or
    against yet. A training script's first statement under
    `if __name__ == "__main__":`; the library's examples and recipes
    (`--allocator auto`) do it. Not for notebooks, interactive sessions
    or code that others import: it replaces the process.

    The alternative is to start Python with the variable set, e.g.
    `GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python train.py`. Either way,
    all backends benefit (measured gains in `with_huge_pages`); on JAX,
    `keep_freed_memory()` still pays on top for image models (the image
    recipes call both).

    Returns:
        False without restarting: not supported here, the tunable already
        set (by the user or a restart), a program read from standard
        input, an interactive session, or `exec` failing (said on
        standard output). Otherwise it does not return.
    """
    if os.environ.get(_RESTARTED) or not huge_pages_supported():
        return False
    if HUGE_PAGES_TUNABLE in _tunables(os.environ):
        return False
    # An interactive session, or a program read from standard input
    # (`sys.argv[0]` "" or "-"): nothing to start again.
    if sys.flags.interactive or sys.argv[0] in ("", "-"):
        return False
    environ = with_huge_pages()
    environ[_RESTARTED] = "1"
    print(
        "keras_jumbo: restarting with GLIBC_TUNABLES="
        f"{environ['GLIBC_TUNABLES']} (transparent huge pages for malloc; "
        "keras_jumbo.runtime.restart_with_huge_pages)",
        flush=True,
    )
    sys.stderr.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, environ)
    except OSError as error:
        print(f"keras_jumbo: not restarted ({error})", flush=True)
        return False


def _dispatch_jax_on_the_calling_thread():
    """Run JAX CPU computations on the thread that calls them, so their
    buffers come from that thread's malloc arena (`keep_freed_memory`)."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


# XLA's CPU code generator emits 256-bit vectors by default, even on CPUs
# with AVX-512 (on some Intel CPUs 512-bit instructions lower the clock).
# AMD's Zen 4 (as two 256-bit halves) and Zen 5 run them at full clock.
# With this option XLA's own element-wise fusions (exact GELU's erf,
# LayerNorm, the softmax's exponentials, slices) use 512-bit vectors; the
# matmuls (XNNPACK) already did. Measured on a 2-core AMD Zen 5 (JAX
# predict steps, in-process A/B): the GELU fusion 0.128 ms against 0.256;
# pico Jumbo's step 2.5% faster, ViT-Tiny's 7.8%, PatchTST, Non-Deep ViT
# and ViT-Res 1.4-1.8%; training steps -1% to +3%; outputs within 1e-6 of
# the default (benchmarks/README.md, twentieth session). On a 2-core Zen 4
# (fortieth session, 8 interleaved rounds): pico's predict step 1.033x,
# ViT-Tiny's 1.038x, pico's training step 1.077x.
WIDE_VECTOR_OPTIONS = {"xla_cpu_prefer_vector_width": 512}

# `set_jax_compiler_options(None)`: the automatic choice.
_AUTOMATIC = None
_chosen_options = _AUTOMATIC


def jax_compiler_options():
    """The XLA compiler options of keras_jumbo's models' JAX steps.

    `ConfiguredModel` (every model class) compiles the steps Keras makes
    for `fit`, `evaluate`, `predict` and `train_on_batch` /
    `test_on_batch` / `predict_on_batch` with these options (Keras itself
    compiles them with none). Unless `set_jax_compiler_options` chose
    others: `WIDE_VECTOR_OPTIONS` (512-bit vectors in XLA's own
    element-wise code) when JAX runs on a CPU whose vendor is AMD and
    which has AVX-512 (Linux, read from `/proc/cpuinfo`), and this JAX
    accepts the option; `{}` everywhere else (other CPUs, GPUs, TPUs, not
    measured). Numerics: float32 round-off (within 1e-6 of the default).

    Returns:
        A new dict, `{XLA option name: value}`.
    """
    if _chosen_options is not _AUTOMATIC:
        return dict(_chosen_options)
    return dict(_automatic_options())


def set_jax_compiler_options(options):
    """Choose the XLA compiler options of the models' JAX steps.

    Applies to steps compiled afterwards: a model that already ran a step
    keeps it until Keras makes it again (`model.compile(...)`, or
    `model.make_predict_function(force=True)`).

    Args:
        options: dict `{XLA option name: value}` (e.g. `{}` for XLA's
            defaults, or `{"xla_cpu_prefer_vector_width": 256}`), checked
            by compiling a small function with them; or None for the
            automatic choice (`jax_compiler_options`).

    Raises:
        TypeError: `options` is not a dict with string keys, or None.
        ValueError: JAX refuses an option (unknown name or bad value).
    """
    global _chosen_options
    if options is None:
        _chosen_options = _AUTOMATIC
        return
    if not isinstance(options, dict) or not all(
        isinstance(name, str) for name in options
    ):
        raise TypeError(
            "`options` must be a dict {XLA option name: value} or None. "
            f"Received: options={options!r:.200}"
        )
    error = _refusal(options)
    if error is not None:
        raise ValueError(
            f"JAX refuses these compiler options: {error}. Received: "
            f"options={options!r:.200}"
        )
    _chosen_options = dict(options)


def _refusal(options):
    """JAX's error message compiling a small function with `options`, or
    None when it compiles."""
    import jax
    import numpy as np

    try:
        jax.jit(lambda x: x + 1, compiler_options=options).lower(
            np.float32(0)
        ).compile()
    except Exception as error:  # JaxRuntimeError, TypeError, ...
        return str(error).strip().splitlines()[0][:300]
    return None


@functools.cache
def _automatic_options():
    import jax

    if jax.default_backend() != "cpu" or not _amd_with_avx512():
        return {}
    if _refusal(WIDE_VECTOR_OPTIONS) is not None:
        return {}
    return WIDE_VECTOR_OPTIONS


def cpu_fields(path="/proc/cpuinfo"):
    """The first processor's fields in /proc/cpuinfo (`{"vendor_id":
    "GenuineIntel", "flags": "...", ...}`), or {} where there is none."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def _amd_with_avx512(path="/proc/cpuinfo"):
    """Whether the CPU's vendor is AMD and it has AVX-512 (Linux)."""
    fields = cpu_fields(path)
    return (
        fields.get("vendor_id") == "AuthenticAMD"
        and "avx512f" in fields.get("flags", "").split()
    )


@functools.cache
def accelerator_available():
    """Whether the Keras backend has a device other than the CPU (a GPU,
    a TPU, Apple's MPS). Asked once per process: JAX and TensorFlow list
    their devices, PyTorch is asked for CUDA and MPS."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        return bool(
            torch.cuda.is_available() or torch.backends.mps.is_available()
        )
    if backend in ("jax", "tensorflow"):
        devices = keras.distribution.list_devices()
        return any(not d.lower().startswith("cpu") for d in devices)
    return False
