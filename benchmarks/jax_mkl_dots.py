"""JAX steps with every fp32 product on MKL instead of XLA:CPU's kernels.

The matmul floor of `vs_official.py` times each product of keras_jumbo's
JAX step alone, on XLA and on MKL (as `torch.einsum`). This script asks
the question inside the step: the same traced step of the `vs_official`
model (`convert.official_jumbo_model`), once as XLA compiles it and once
with every fp32 `dot_general` of its jaxpr replaced by an XLA FFI call
into MKL (`_mkl_gemm.cc`, built here with the system C++ compiler; MKL
is the one inside PyTorch's CPU wheel). Everything else in the step stays
XLA's. Per round, interleaved in one process, medians of `--steps` calls:

- `forward`: the inference forward pass (`training=False`, `--batch`);
- `gradient`: `jax.value_and_grad` of the training loss (`--train-batch`);
- `gradient + SGD`: the same and a plain SGD update of every trainable
  variable in the same jitted function, as any training step has.

It prints XLA's and MKL's milliseconds, XLA / MKL (above 1: MKL faster),
per step the milliseconds inside the MKL calls summed over the calls
(`MKL sum`; calls on two threads at once count twice) and the wall time
with at least one call running (`MKL wall`), the calls, the share of
their chunks the calling thread ran itself (XLA's pool threads took the
rest), and the largest relative differences of the outputs
(every weight randomised first, `keras_jumbo.testing.randomize_weights`).

    KERAS_BACKEND=jax python benchmarks/jax_mkl_dots.py [--rounds 3]

Needs JAX, PyTorch (for its MKL) and a C++ compiler (`c++`, or `$CXX`).
A measurement, not a library feature: results and what they say in
`benchmarks/README.md` (forty-seventh session).
"""

import argparse
import collections
import ctypes
import math
import os
import shutil
import subprocess
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

from _rounds import largest_relative_difference  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "keras_jumbo_benchmark_mkl_gemm"
COUNTERS = (
    "mkl_handler_ns",
    "mkl_busy_ns",
    "mkl_calls",
    "mkl_chunks",
    "mkl_caller_chunks",
)
# Sub-jaxprs the interpreter below walks into (the products inside them
# are replaced too); any other primitive is bound as it is.
CALL_PARAMS = {
    "pjit": "jaxpr",
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    "core_call": "call_jaxpr",
    "remat": "jaxpr",
    "checkpoint": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
    "custom_vjp_call_jaxpr": "fun_jaxpr",
}


def build_handler(workdir, chunks):
    """Compiles `_mkl_gemm.cc`, loads it with PyTorch's MKL and registers
    it with XLA; returns the loaded library (its counters)."""
    import jax

    try:
        import torch
    except ImportError as error:
        raise SystemExit(
            "jax_mkl_dots.py needs PyTorch (for its MKL)"
        ) from error
    compiler = (
        os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    )
    if compiler is None:
        raise SystemExit("jax_mkl_dots.py needs a C++ compiler (c++ or $CXX)")
    library = os.path.join(workdir, "libmkl_gemm.so")
    subprocess.run(
        [
            compiler,
            "-O2",
            "-std=c++17",
            "-shared",
            "-fPIC",
            "-pthread",
            "-w",
            "-I",
            jax.ffi.include_dir(),
            os.path.join(HERE, "_mkl_gemm.cc"),
            "-o",
            library,
        ],
        check=True,
    )
    torch_cpu = ctypes.CDLL(
        os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    )
    if not hasattr(torch_cpu, "sgemm_batch_"):
        raise SystemExit(
            "jax_mkl_dots.py needs a PyTorch built with MKL (x86-64 CPU wheels)"
        )
    handler = ctypes.CDLL(library)
    handler.set_blas.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int]
    handler.set_blas(
        ctypes.cast(torch_cpu.sgemm_, ctypes.c_void_p),
        ctypes.cast(torch_cpu.sgemm_batch_, ctypes.c_void_p),
        # The Fortran entry: the thread count by pointer.
        ctypes.cast(torch_cpu.mkl_set_num_threads_local_, ctypes.c_void_p),
        chunks,
    )
    for name in COUNTERS:
        # Every counter is a 64-bit total; ctypes' default `int` result
        # would wrap after ~2.1 s of nanoseconds.
        getattr(handler, name).restype = ctypes.c_longlong
    jax.ffi.register_ffi_target(
        TARGET, jax.ffi.pycapsule(handler.MklGemm), platform="cpu"
    )
    return handler


def _matrix(shape, batch, contracting, left):
    """`(free dims, transposed)` when the operand is its batch dims first,
    then its free and contracting dims as two contiguous blocks (a row-
    major matrix per batch entry); None otherwise."""
    leading = len(batch)
    if tuple(batch) != tuple(range(leading)) or list(contracting) != sorted(
        contracting
    ):
        return None
    free = [d for d in range(leading, len(shape)) if d not in contracting]
    if not free or not contracting:
        return None
    middle = leading + len(free)
    if free == list(range(leading, middle)) and list(contracting) == list(
        range(middle, len(shape))
    ):
        contracting_last = True
    elif list(contracting) == list(
        range(leading, leading + len(contracting))
    ) and free == list(range(leading + len(contracting), len(shape))):
        contracting_last = False
    else:
        return None
    # The left operand is (m, k) untransposed, the right one (k, n).
    return free, (not contracting_last) if left else contracting_last


def mkl_dot_general(x, y, dimension_numbers, transposed=False, **params):
    """`lax.dot_general` on MKL when both operands are fp32 row-major
    matrices per batch entry; XLA's otherwise (counted in `FALLBACKS`).
    `transposed`: return the 2-D product transposed (computed as
    `op(y)ᵀ·op(x)ᵀ`, no copy), for a product whose one use is a transpose."""
    import numpy as np
    from jax import lax

    (x_contracting, y_contracting), (x_batch, y_batch) = dimension_numbers
    fp32 = (
        x.dtype == np.float32
        and y.dtype == np.float32
        and params.get("preferred_element_type") in (None, np.float32)
    )
    left = fp32 and _matrix(x.shape, x_batch, x_contracting, left=True)
    right = fp32 and _matrix(y.shape, y_batch, y_contracting, left=False)
    if not (left and right):
        FALLBACKS.append((x.shape, y.shape, dimension_numbers))
        out = lax.dot_general_p.bind(
            x, y, dimension_numbers=dimension_numbers, **params
        )
        return out.T if transposed else out
    (x_free, x_transposed), (y_free, y_transposed) = left, right
    rows = [x.shape[d] for d in x_free]
    cols = [y.shape[d] for d in y_free]
    depth = math.prod(x.shape[d] for d in x_contracting)
    if transposed:  # Cᵀ = op(y)ᵀ·op(x)ᵀ: y the left operand
        return _gemm(
            y, x, [], cols, rows, depth, not y_transposed, not x_transposed
        )
    batch = [x.shape[d] for d in x_batch]
    return _gemm(x, y, batch, rows, cols, depth, x_transposed, y_transposed)


def _gemm(a, b, batch, rows, cols, depth, a_transposed, b_transposed):
    """The FFI call: `batch + rows + cols` = op(a)·op(b) per batch entry."""
    import jax
    import numpy as np

    out_shape = tuple(batch) + tuple(rows) + tuple(cols)
    return jax.ffi.ffi_call(
        TARGET, jax.ShapeDtypeStruct(out_shape, np.float32)
    )(
        a,
        b,
        batch=np.int64(math.prod(batch)),
        m=np.int64(math.prod(rows)),
        n=np.int64(math.prod(cols)),
        k=np.int64(depth),
        ta=np.int64(a_transposed),
        tb=np.int64(b_transposed),
    )


def _evaluate(jaxpr, consts, args):
    import jax.extend
    from jax import lax

    env = {}

    def read(var):
        return var.val if isinstance(var, jax.extend.core.Literal) else env[var]

    env.update(zip(jaxpr.constvars, consts, strict=True))
    env.update(zip(jaxpr.invars, args, strict=True))
    # A 2-D product whose one use is a (1, 0) transpose is computed
    # transposed (XLA gives its own products that layout for free; without
    # this the shared Jumbo FFN's weight gradients are summed from 12
    # column-wise reads).
    uses = collections.Counter(
        var
        for eqn in jaxpr.eqns
        for var in eqn.invars
        if not isinstance(var, jax.extend.core.Literal)
    )
    uses.update(
        v for v in jaxpr.outvars if not isinstance(v, jax.extend.core.Literal)
    )
    transposed = {
        eqn.invars[0]
        for eqn in jaxpr.eqns
        if eqn.primitive is lax.transpose_p
        and tuple(eqn.params["permutation"]) == (1, 0)
        and not isinstance(eqn.invars[0], jax.extend.core.Literal)
        and uses[eqn.invars[0]] == 1
    }
    produced_transposed = set()
    for eqn in jaxpr.eqns:
        inputs = [read(var) for var in eqn.invars]
        if eqn.primitive is lax.dot_general_p:
            params = dict(eqn.params)
            numbers = params.pop("dimension_numbers")
            flip = eqn.outvars[0] in transposed and not numbers[1][0]
            if flip:
                produced_transposed.add(eqn.outvars[0])
            outputs = [
                mkl_dot_general(*inputs, numbers, transposed=flip, **params)
            ]
        elif (
            eqn.primitive is lax.transpose_p
            and eqn.invars[0] in produced_transposed
        ):
            outputs = inputs  # already computed transposed
        elif eqn.primitive.name in CALL_PARAMS:
            inner = eqn.params[CALL_PARAMS[eqn.primitive.name]]
            outputs = _evaluate(
                getattr(inner, "jaxpr", inner),
                getattr(inner, "consts", []),
                inputs,
            )
        else:
            outputs = eqn.primitive.bind(*inputs, **eqn.params)
            if not eqn.primitive.multiple_results:
                outputs = [outputs]
        env.update(zip(eqn.outvars, outputs, strict=True))
    return [read(var) for var in jaxpr.outvars]


def on_mkl(function):
    """`function` with every product of its jaxpr on MKL (jit it)."""
    import jax

    def replaced(*args):
        closed, shapes = jax.make_jaxpr(function, return_shape=True)(*args)
        outputs = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args))
        return jax.tree.unflatten(jax.tree.structure(shapes), outputs)

    return replaced


def _median_ms(function, args, steps):
    """Median ms of a call, and the process' CPU seconds per wall second
    over the calls (2.0: both cores busy, spinning included)."""
    import jax
    import numpy as np

    times = []
    cpu = time.process_time()
    wall = time.perf_counter()
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(function(*args))
        times.append(time.perf_counter() - start)
    busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    return float(np.median(times)) * 1e3, busy


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="pico")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64, help="forward batch")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="calls per round")
    parser.add_argument(
        "--chunks", type=int, default=2, help="MKL chunks per XLA thread"
    )
    opts = parser.parse_args(argv)
    for name in ("rounds", "steps", "chunks"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")

    import jax
    import keras
    import numpy as np

    if keras.backend.backend() != "jax":
        raise SystemExit("jax_mkl_dots.py measures JAX: KERAS_BACKEND=jax")
    from keras_jumbo import convert
    from keras_jumbo import testing

    workdir = tempfile.mkdtemp(prefix="jax_mkl_dots_")
    try:
        handler = build_handler(workdir, opts.chunks)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    model = convert.official_jumbo_model(
        opts.size, image_size=opts.image_size, num_classes=1000
    )
    testing.randomize_weights(model)  # no zero head, no identity norms
    rng = np.random.default_rng(0)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]
    size = opts.image_size
    x = jax.numpy.asarray(
        rng.normal(size=(opts.batch, size, size, 3)).astype("float32")
    )
    xt = jax.numpy.asarray(
        rng.normal(size=(opts.train_batch, size, size, 3)).astype("float32")
    )
    yt = jax.numpy.asarray(rng.integers(0, 1000, opts.train_batch))

    def forward(weights, x):
        return model.stateless_call(weights, fixed, x, training=False)[0]

    def loss(weights, x, y):
        logits = model.stateless_call(weights, fixed, x, training=True)[0]
        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True
            )
        )

    gradient = jax.value_and_grad(loss)

    def sgd_step(weights, x, y):
        value, grads = gradient(weights, x, y)
        return value, [
            w - 1e-3 * g for w, g in zip(weights, grads, strict=True)
        ]

    cases = [
        ("forward", forward, (trainable, x), opts.batch),
        ("gradient", gradient, (trainable, xt, yt), opts.train_batch),
        ("gradient + SGD", sgd_step, (trainable, xt, yt), opts.train_batch),
    ]
    compiled = {}
    for name, function, args, _ in cases:
        on_xla, mkl = jax.jit(function), jax.jit(on_mkl(function))
        difference = largest_relative_difference(on_xla(*args), mkl(*args))
        compiled[name] = (on_xla, mkl, difference)
    times = {name: ([], [], [], []) for name, *_ in cases}
    for _ in range(opts.rounds):
        for name, _, args, _ in cases:
            on_xla, mkl, _ = compiled[name]
            xla_ms, mkl_ms, inside, busy = times[name]
            xla_ms.append(_median_ms(on_xla, args, opts.steps))
            before = [getattr(handler, c)() for c in COUNTERS]
            mkl_ms.append(_median_ms(mkl, args, opts.steps))
            after = [getattr(handler, c)() for c in COUNTERS]
            busy.append((xla_ms[-1][1], mkl_ms[-1][1]))
            xla_ms[-1], mkl_ms[-1] = xla_ms[-1][0], mkl_ms[-1][0]
            inside.append(
                [
                    (b - a) / opts.steps
                    for a, b in zip(before, after, strict=True)
                ]
            )
    print(
        f"{opts.size}, {opts.image_size} px, forward batch {opts.batch}, "
        f"training batch {opts.train_batch}; {opts.rounds} rounds of "
        f"{opts.steps} calls; distinct products left on XLA: "
        f"{len(set(map(str, FALLBACKS)))}"
    )
    print(
        f"{'step':16s} {'XLA ms':>8s} {'MKL ms':>8s} {'XLA/MKL':>8s} "
        f"{'MKL sum':>8s} {'MKL wall':>8s} {'calls':>6s} {'caller':>7s} "
        f"{'max rel diff':>13s}"
    )
    for name, *_ in cases:
        xla_ms, mkl_ms, inside, busy = times[name]
        handler_ns, busy_ns, calls, chunks, caller = np.median(
            np.array(inside), axis=0
        )
        xla_median, mkl_median = np.median(xla_ms), np.median(mkl_ms)
        print(
            f"{name:16s} {xla_median:8.1f} {mkl_median:8.1f} "
            f"{xla_median / mkl_median:8.2f} {handler_ns / 1e6:8.1f} "
            f"{busy_ns / 1e6:8.1f} "
            f"{calls:6.0f} {caller / max(chunks, 1):7.0%} "
            f"{compiled[name][2]:13.1e}"
        )
        print(
            f"{'':16s} per round: XLA "
            + ", ".join(f"{v:.1f}" for v in xla_ms)
            + "; MKL "
            + ", ".join(f"{v:.1f}" for v in mkl_ms)
            + "; cores busy XLA / MKL "
            + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in busy)
        )


FALLBACKS = []

if __name__ == "__main__":
    main()
