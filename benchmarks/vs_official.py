"""keras_jumbo on each Keras backend vs the official Jumbo PyTorch release,
side by side in one run (issue #15).

Contenders, each measured in its own fresh process, rounds interleaved
(round 1: every contender, round 2: every contender, ...), medians
reported:

    official          the official `Jumbo` (PyTorch, eager)
    official_compile  the same under `torch.compile` (the paper's setting)
    jax, tensorflow, torch
                      keras_jumbo's `convert.official_jumbo_model` (the same
                      architecture and numerics, official-weight parity
                      tested) with Keras' default compilation per backend
                      (XLA on JAX, `tf.function` on TensorFlow, eager on
                      PyTorch); on JAX its steps compiled with
                      `keras_jumbo.runtime.jax_compiler_options()` (512-bit
                      vectors in XLA's element-wise code on AMD CPUs with
                      AVX-512)
    jax_xla_defaults  keras_jumbo on JAX with XLA's default compiler
                      options (`runtime.set_jax_compiler_options({})`):
                      what the library's options change
    jax_bf16_copy     inference only: keras_jumbo on JAX, predicting with
                      `models.with_config(model, dtype="bfloat16")`, the
                      model's copy with every weight stored in bfloat16
                      (rounded once; what a user deploys for bfloat16
                      inference: under `mixed_bfloat16` XLA casts every
                      float32 kernel in every step). Not a default
                      contender: ask for it with `--contenders`
    jax_kept          keras_jumbo on JAX after
                      `keras_jumbo.runtime.keep_freed_memory()` (what the
                      recipes do on JAX: each step's buffer is reused, not
                      page-faulted in again)
    jax_alt, jax_kept_alt
                      jax and jax_kept under the interpreter given with
                      `--jax-python` (e.g. a Python 3.12+ environment with a
                      newer jax than Python 3.11 installs), so that two jax
                      releases run side by side in one run. Not default
                      contenders: ask for them with `--contenders`
    tensorflow_xla    keras_jumbo on TensorFlow with `jit_compile=True`
                      (XLA; Keras' "auto" turns XLA off on CPU-only
                      TensorFlow machines)
    torch_compile     keras_jumbo on PyTorch with `jit_compile=True`
                      (`torch.compile` of Keras' steps)

Four more rows (`--no-matmul-floor` leaves them out; CPU, float32): what
the matmuls alone cost. keras_jumbo's JAX inference and training steps
are traced (`jax.make_jaxpr`; training = the gradient of the
cross-entropy loss), and every matmul and convolution in them (each
`dot_general` / `conv_general_dilated`, forward and backward, with its
exact shapes and dimension numbers) is timed alone, the best of
`--floor-reps`; a step's time is the sum over its products. Measured in
every round, in two processes:

    xla_matmuls       each product as one jitted XLA op on all `--threads`
                      threads: a step that did nothing but its matmuls,
                      one after another, at XLA:CPU's speed on these
                      shapes (no LayerNorm, softmax, GELU, copies or
                      optimizer)
    xla_matmuls_ideal the process pinned to one core, one thread; the sum
                      divided by `--threads`: every core busy with
                      single-core kernels, in perfect overlap. A step that
                      computes these products with XLA's kernels is not
                      faster than this: on these small shapes one thread
                      per core is the kernels' most efficient setting (and
                      a lone busy core may clock higher, which only
                      flatters this row)
    torch_matmuls, torch_matmuls_ideal
                      the same `dot_general`s as `torch.einsum`
                      (PyTorch's oneDNN/MKL kernels, which the official
                      code uses; each result checked against XLA's);
                      convolutions (the patch embedding) counted at
                      XLA's time

Their ratios read against the other rows: a JAX ratio above
`xla_matmuls_ideal`'s is out of reach of XLA's kernels on this CPU.

Measures: inference images/s (batch `--batch`, `predict_on_batch`, or the
module under `torch.no_grad()`), and training images/s (batch
`--train-batch`; AdamW lr 1e-3 wd 0.05, cross-entropy on integer labels;
`train_on_batch`, or forward + backward + `step()` for the official code)
and, for keras_jumbo, training images/s under `fit` (`training_fit`: one
epoch over `--steps` copies of the batch, read from NumPy arrays as a
user's are, after a warm-up epoch of the same size and up to the end of
training, i.e. without the data iterator's destruction as `fit`
returns (`_fit_rate`); `train_on_batch` also reads every variable out of
Keras' state and writes it back around each step, which `fit` does once
per epoch). For `predict_on_batch` and `train_on_batch` every contender's
batch is a tensor of its framework, made once before the timed loop (the
official code's `torch.randn`; `keras.ops.convert_to_tensor` for
keras_jumbo), so none copies its input from NumPy inside the loop.
Ratios: inference against `official_compile`, both training measures
against `official` (eager); `ratio` is the ratio of the medians,
`round_ratio` the median of each round's own ratio (both sides measured
minutes apart, so the steadier one when the machine has slow phases).
FLOP utilisation =
FLOPs per image x images/s / the fp32 matmul peak measured in the same run
(the best of a 2048^3 `torch.matmul` and a jitted JAX `dot`); FLOPs per
image = 2 x `count_macs` for inference and 3x that for a training step
(forward + backward ~ 2x forward).

Needs the official code (a checkout with `models/jumbo.py` and
`configs.py`, e.g. `../shared/peers/jumbo_official`), `einops` and
`timm==1.0.12` (`pip install einops timm==1.0.12 --no-deps`; only
`timm.layers` is used, entered without timm's package `__init__`, which
needs torchvision).

Usage (2-core CPU; about 20 minutes, of which the matmul floor ~2):
    python benchmarks/vs_official.py \
        --official-repo ../shared/peers/jumbo_official \
        --csv benchmarks/results/vs_official_cpu.csv
    # every contender with glibc's mmap of large buffers turned off
    python benchmarks/vs_official.py --official-repo DIR --allocator no-mmap
    # every contender with glibc's malloc on transparent huge pages
    python benchmarks/vs_official.py --official-repo DIR \
        --allocator huge-pages
    # every contender with another malloc (LD_PRELOAD), e.g. gperftools'
    # tcmalloc from Debian's libtcmalloc-minimal4
    python benchmarks/vs_official.py --official-repo DIR \
        --malloc-library /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
    # the paper's GPU comparison (Jumbo Table 6: RTX 4090, batch 512, bf16)
    python benchmarks/vs_official.py --official-repo DIR --device gpu \
        --batch 512 --train-batch 512 --bf16 --image-size 224
"""

import argparse
import csv
import functools
import importlib.util
import json
import operator
import os
import platform
import statistics
import subprocess
import sys
import time
import types

from _rounds import round_ratio

# `training_fit`: Keras contenders only (`_fit_rate`).
MEASURES = ("inference", "training", "training_fit")
CONTENDERS = (
    "official",
    "official_compile",
    "jax",
    "jax_xla_defaults",
    "jax_kept",
    "jax_bf16_copy",
    "jax_alt",
    "jax_kept_alt",
    "tensorflow",
    "tensorflow_xla",
    "torch",
    "torch_compile",
)
# `--allocator no-mmap`: glibc malloc settings, given to every contender's
# process alike, under which large buffers are reused from the heap instead
# of being mapped fresh from the kernel (and page-faulted in) at every
# allocation; benchmarks/README.md ("The allocator decides ...").
NO_MMAP_MALLOC = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_MAX_": "0",
    "MALLOC_TRIM_THRESHOLD_": "68719476736",
}
KERAS_BACKENDS = {
    "jax": "jax",
    "jax_xla_defaults": "jax",
    "jax_kept": "jax",
    "jax_bf16_copy": "jax",
    "jax_alt": "jax",
    "jax_kept_alt": "jax",
    "tensorflow": "tensorflow",
    "tensorflow_xla": "tensorflow",
    "torch": "torch",
    "torch_compile": "torch",
}


# --- the official code ---------------------------------------------------
def import_official(repo):
    """The official `Jumbo` class and `get_config` from a checkout `repo`."""
    if not os.path.isfile(os.path.join(repo, "models", "jumbo.py")):
        raise FileNotFoundError(
            "--official-repo must be a checkout of the official Jumbo code "
            f"(with models/jumbo.py). Received: {repo!r}"
        )
    import torch

    if importlib.util.find_spec("torchvision") is None:
        # timm.layers asks torchvision for one name Jumbo never uses.
        misc = types.ModuleType("torchvision.ops.misc")
        misc.FrozenBatchNorm2d = type(
            "FrozenBatchNorm2d", (torch.nn.Module,), {}
        )
        ops = types.ModuleType("torchvision.ops")
        ops.misc = misc
        vision = types.ModuleType("torchvision")
        vision.ops = ops
        sys.modules.update(
            {
                "torchvision": vision,
                "torchvision.ops": ops,
                "torchvision.ops.misc": misc,
            }
        )
    if "timm" not in sys.modules:
        spec = importlib.util.find_spec("timm")
        if spec is None:
            raise ImportError(
                "The official code needs timm: "
                "pip install einops 'timm==1.0.12' --no-deps"
            )
        timm = types.ModuleType("timm")  # skip timm/__init__ (torchvision)
        timm.__path__ = list(spec.submodule_search_locations)
        sys.modules["timm"] = timm
    sys.path.insert(0, os.path.abspath(repo))
    from configs import get_config
    from models.jumbo import Jumbo

    return Jumbo, get_config


# --- one contender, in its own process -------------------------------------
def _rate(step, batch, warmup, steps, sync=lambda: None):
    for _ in range(warmup):
        step()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return batch * steps / (time.perf_counter() - start)


def _official(args, compiled):
    import torch

    torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "gpu" else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device gpu: PyTorch sees no GPU")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    Jumbo, get_config = import_official(args.official_repo)
    config = get_config(args.size)
    num_jumbo = config.pop("J")
    config.update(img_size=args.image_size, num_classes=args.num_classes)
    model = Jumbo(device, num_jumbo, **config).to(device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.bf16)
    gen = torch.Generator().manual_seed(0)
    size = args.image_size
    x = torch.randn(args.batch, 3, size, size, generator=gen).to(device)
    run = torch.compile(model) if compiled else model
    model.eval()

    def infer():
        with torch.no_grad(), autocast:
            run(x)

    inference = _rate(infer, args.batch, args.warmup, args.steps, sync)
    model.train()
    xt = torch.randn(args.train_batch, 3, size, size, generator=gen).to(device)
    yt = torch.randint(0, args.num_classes, (args.train_batch,)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), 1e-3, weight_decay=0.05)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = loss_fn(run(xt), yt)
        loss.backward()
        optimizer.step()

    training = _rate(train, args.train_batch, args.warmup, args.steps, sync)
    return {"inference": inference, "training": training}


def _keras(args, contender):
    # jax_alt / jax_kept_alt: jax / jax_kept under `--jax-python`.
    contender = contender.removesuffix("_alt")
    import keras
    import numpy as np

    from keras_jumbo import runtime

    if contender == "jax_kept":
        # Before the first JAX computation (the model's initialisers).
        if not runtime.keep_freed_memory():
            raise SystemExit("jax_kept: keep_freed_memory needs glibc")
    if contender == "jax_xla_defaults":
        runtime.set_jax_compiler_options({})

    if args.device == "gpu":
        backend = keras.backend.backend()
        if backend == "jax":
            import jax

            found = jax.devices()[0].platform == "gpu"
        elif backend == "tensorflow":
            import tensorflow as tf

            found = bool(tf.config.list_physical_devices("GPU"))
        else:
            import torch

            found = torch.cuda.is_available()
        if not found:
            raise SystemExit(f"--device gpu: {backend} sees no GPU")
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(args.threads)
    if args.bf16:
        keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    from keras_jumbo import convert
    from keras_jumbo import models
    from keras_jumbo import optimizers

    model = convert.official_jumbo_model(
        args.size, image_size=args.image_size, num_classes=args.num_classes
    )
    model.compile(
        optimizer=optimizers.AdamW(1e-3, weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=(
            True if contender in ("torch_compile", "tensorflow_xla") else "auto"
        ),
    )
    rng = np.random.default_rng(0)
    size = args.image_size
    x = rng.normal(size=(args.batch, size, size, 3)).astype("float32")
    # The batch as a tensor of the backend, made once, as the official
    # contender's `torch.randn` batch: no contender copies its input from
    # NumPy inside the timed loop.
    batch = keras.ops.convert_to_tensor(x)
    predictor = model
    if contender == "jax_bf16_copy":
        predictor, _ = models.with_config(model, dtype="bfloat16")
    inference = _rate(
        lambda: predictor.predict_on_batch(batch),
        args.batch,
        args.warmup,
        args.steps,
    )
    if contender == "jax_bf16_copy":  # inference only
        return {"inference": inference, "macs": models.count_macs(model)}
    xt = rng.normal(size=(args.train_batch, size, size, 3)).astype("float32")
    yt = rng.integers(0, args.num_classes, args.train_batch)
    train_batch = keras.ops.convert_to_tensor(xt)
    train_labels = keras.ops.convert_to_tensor(yt)
    training = _rate(
        lambda: model.train_on_batch(train_batch, train_labels),
        args.train_batch,
        args.warmup,
        args.steps,
    )
    return {
        "inference": inference,
        "training": training,
        "training_fit": _fit_rate(model, xt, yt, args),
        "macs": models.count_macs(model),
    }


def _fit_rate(model, xt, yt, args):
    """Images/s of `model.fit` over `--steps` copies of the training
    batch (one epoch, no shuffling, after a warm-up epoch of the same
    size), from the call to the end of training (`on_train_end`).

    `train_on_batch` reads every variable out of Keras' state and writes
    it back around each step; `fit` keeps the state between the steps of
    an epoch, as a user's training does. The epoch's setup (its data
    iterator, callbacks) is inside the time. Two one-off costs are not
    (benchmarks/README.md, fortieth session; TensorFlow with XLA, pico,
    2-core Zen 4 EPYC):

    - the first `fit` on data of a new size, which costs as a first step
      costs compilation (~2.2 s once): hence the warm-up of the same size
      (a `--warmup`-step epoch before left it in the timed one);
    - the data iterator's destruction when `fit` returns: in the first
      few `fit` calls of a process that ran other steps before, TF's
      tf.data iterator waits 0-10 s there for one of its threads,
      probably its autotuning one (`RootDataset::Iterator::~Iterator`;
      no wait with autotuning off), once per call, after the last step.
      It read TensorFlow's `fit` at ~0.45x its `train_on_batch`.
    """
    import keras
    import numpy as np

    x = np.concatenate([xt] * args.steps)
    y = np.concatenate([yt] * args.steps)

    class TrainEnd(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.time = time.perf_counter()

    train_end = TrainEnd()

    def epoch():
        model.fit(
            x,
            y,
            batch_size=args.train_batch,
            epochs=1,
            shuffle=False,
            verbose=0,
            callbacks=[train_end],
        )

    epoch()
    start = time.perf_counter()
    epoch()
    return args.train_batch * args.steps / (train_end.time - start)


def _matmul_peak(args):
    """fp32 matmul GFLOP/s, 2048^3, the best of torch and jitted JAX."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    n = 2048
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    torch_rate = _rate(lambda: a @ b, 1, 2, 10) * 2 * n**3 / 1e9
    import jax
    import jax.numpy as jnp

    x = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), "float32")
    dot = jax.jit(jnp.dot)
    jax_rate = (
        _rate(lambda: dot(x, x).block_until_ready(), 1, 2, 10) * 2 * n**3 / 1e9
    )
    return {"torch_gflops": torch_rate, "jax_gflops": jax_rate}


def _step_products(model, x, y, training):
    """`[(eqn, count)]`: every `dot_general` / `conv_general_dilated` of
    the JAX inference step (`training=False`) or of the gradient of the
    training loss, sub-jaxprs included, equal products counted once."""
    import jax
    import jax.extend
    import keras

    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def forward(weights, x):
        return model.stateless_call(
            weights, non_trainable, x, training=training
        )[0]

    if training:

        def loss(weights, x, y):
            return keras.ops.mean(
                keras.losses.sparse_categorical_crossentropy(
                    y, forward(weights, x), from_logits=True
                )
            )

        traced = jax.make_jaxpr(jax.value_and_grad(loss))(trainable, x, y)
    else:
        traced = jax.make_jaxpr(forward)(trainable, x)
    jaxpr_types = (jax.extend.core.Jaxpr, jax.extend.core.ClosedJaxpr)
    counts, first = {}, {}

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("dot_general", "conv_general_dilated"):
                key = (
                    eqn.primitive.name,
                    tuple(tuple(v.aval.shape) for v in eqn.invars),
                    repr(sorted(eqn.params.items())),
                )
                counts[key] = counts.get(key, 0) + 1
                first.setdefault(key, eqn)
            for param in eqn.params.values():
                for sub in (
                    param if isinstance(param, (list, tuple)) else [param]
                ):
                    if isinstance(sub, jaxpr_types):
                        walk(getattr(sub, "jaxpr", sub))

    walk(traced.jaxpr)
    return [(first[key], count) for key, count in counts.items()]


def _product_flops(eqn):
    """2 x multiply-adds of one `dot_general` or `conv_general_dilated`."""
    import math

    lhs, rhs = (v.aval.shape for v in eqn.invars)
    out = math.prod(eqn.outvars[0].aval.shape)
    if eqn.primitive.name == "dot_general":
        (contracting, _), _ = eqn.params["dimension_numbers"]
        return 2 * out * math.prod(lhs[i] for i in contracting)
    # rhs_spec: (output features, input features per group, spatial...);
    # each output element sums over the kernel's input features and taps.
    spec = eqn.params["dimension_numbers"].rhs_spec
    return 2 * out * math.prod(rhs[i] for i in spec[1:])


def _einsum_equation(eqn):
    """The `torch.einsum` equation of a `dot_general` (its output is
    batch axes, then the lhs's free axes, then the rhs's)."""
    lhs, rhs = (len(v.aval.shape) for v in eqn.invars)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    left = [None] * lhs
    right = [None] * rhs
    for i, j in zip((*lb, *lc), (*rb, *rc), strict=True):
        left[i] = right[j] = next(letters)
    left = [c or next(letters) for c in left]
    right = [c or next(letters) for c in right]
    out = [left[i] for i in lb]
    out += [c for i, c in enumerate(left) if i not in (*lb, *lc)]
    out += [c for i, c in enumerate(right) if i not in (*rb, *rc)]
    return f"{''.join(left)},{''.join(right)}->{''.join(out)}"


def _time_products(products, rng, reps):
    """Best seconds of each product alone, `(on XLA, on torch)` lists:
    all on XLA first, then on torch (whose idle threads would otherwise
    spin beside XLA's); a convolution's torch time is its XLA time. Each
    torch result is checked against XLA's (the same product)."""
    import jax
    import numpy as np
    import torch
    from xla_backward import best_ms  # this script's directory

    def best_seconds(function, arrays):
        return best_ms(function, arrays, reps, calls=1) / 1e3

    inputs, outputs, xla = [], [], []
    for eqn, _ in products:
        arrays = [
            rng.normal(size=v.aval.shape).astype("float32") for v in eqn.invars
        ]
        on_xla = [jax.numpy.asarray(array) for array in arrays]
        op = jax.jit(functools.partial(eqn.primitive.bind, **eqn.params))
        xla.append(best_seconds(op, on_xla))
        inputs.append(arrays)
        outputs.append(np.asarray(op(*on_xla)))
    on_torch = []
    for (eqn, _), arrays, expected, seconds in zip(
        products, inputs, outputs, xla, strict=True
    ):
        if eqn.primitive.name != "dot_general":
            on_torch.append(seconds)
            continue
        equation = _einsum_equation(eqn)
        tensors = [torch.from_numpy(array) for array in arrays]
        with torch.no_grad():
            got = torch.einsum(equation, *tensors).numpy()
            scale = np.abs(expected).max()
            if not np.allclose(got, expected, atol=1e-4 * scale, rtol=0):
                raise AssertionError(
                    f"torch.einsum({equation!r}) is not the product {eqn}"
                )
            on_torch.append(
                best_seconds(functools.partial(torch.einsum, equation), tensors)
            )
    return xla, on_torch


def _matmul_floor(args):
    """Seconds per step of keras_jumbo's JAX steps counting only their
    matmuls, each timed alone on XLA and (dot products) on torch."""
    import numpy as np
    import torch

    from keras_jumbo import convert
    from keras_jumbo import models

    torch.set_num_threads(args.threads)
    model = convert.official_jumbo_model(
        args.size, image_size=args.image_size, num_classes=args.num_classes
    )
    rng = np.random.default_rng(0)
    size = args.image_size
    result = {"macs": models.count_macs(model)}
    for measure, batch in (
        ("inference", args.batch),
        ("training", args.train_batch),
    ):
        x = rng.normal(size=(batch, size, size, 3)).astype("float32")
        y = rng.integers(0, args.num_classes, batch)
        products = _step_products(model, x, y, measure == "training")
        xla, on_torch = _time_products(products, rng, args.floor_reps)
        counts = [count for _, count in products]
        seconds = {
            "xla": sum(map(operator.mul, counts, xla)),
            "torch": sum(map(operator.mul, counts, on_torch)),
        }
        flops = sum(count * _product_flops(eqn) for eqn, count in products)
        result[measure] = {
            "batch": batch,
            "products": sum(count for _, count in products),
            "distinct": len(products),
            "gflop": flops / 1e9,
            **seconds,
        }
    return result


def worker(args):
    if args.worker == "peak":
        result = _matmul_peak(args)
    elif args.worker in ("matmul_floor", "matmul_floor_one_core"):
        if args.worker == "matmul_floor_one_core":
            # Before JAX or torch start their thread pools.
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
            args.threads = 1
        result = _matmul_floor(args)
    elif args.worker.startswith("official"):
        result = _official(args, args.worker == "official_compile")
    else:
        result = _keras(args, args.worker)
    print("RESULT " + json.dumps(result), flush=True)


# --- the driver ----------------------------------------------------------
def _run_worker(name, args, argv):
    env = dict(os.environ)
    if args.allocator == "no-mmap":
        env.update(NO_MMAP_MALLOC)
    elif args.allocator == "huge-pages":
        from keras_jumbo import runtime

        env = runtime.with_huge_pages(env)
    if args.malloc_library:
        env["LD_PRELOAD"] = os.pathsep.join(
            filter(None, [args.malloc_library, env.get("LD_PRELOAD")])
        )
    if name in KERAS_BACKENDS:
        env["KERAS_BACKEND"] = KERAS_BACKENDS[name]
    elif name in ("peak", "matmul_floor", "matmul_floor_one_core"):
        env["KERAS_BACKEND"] = "jax"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.abspath(root), env.get("PYTHONPATH")])
    )
    python = args.jax_python if name.endswith("_alt") else sys.executable
    out = subprocess.run(
        [python, os.path.abspath(__file__), "--worker", name, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(
        f"Worker {name!r} failed (exit {out.returncode}):\n"
        + out.stderr[-3000:]
    )


def summarize(results, peak_gflops, macs):
    """Rows `(contender, measure, median img/s, ratio, utilisation)`.

    `results[contender][measure]` is the list of per-round images/s.
    Inference ratios are against `official_compile`, training ratios
    (`train_on_batch` and `fit`) against `official`'s training (eager); a
    missing reference leaves the ratio None; a contender without a measure
    (`training_fit` for the official code and the floors) has no row.
    """
    reference = {
        "inference": ("official_compile", "inference"),
        "training": ("official", "training"),
        "training_fit": ("official", "training"),
    }
    flops = {
        "inference": 2 * (macs or 0),
        "training": 6 * (macs or 0),
        "training_fit": 6 * (macs or 0),
    }
    rows = []
    for measure in MEASURES:
        base_contender, base_measure = reference[measure]
        base_rounds = results.get(base_contender, {}).get(base_measure)
        base = statistics.median(base_rounds) if base_rounds else None
        for contender, measures in results.items():
            if not measures.get(measure):
                continue
            rate = statistics.median(measures[measure])
            rows.append(
                {
                    "contender": contender,
                    "measure": measure,
                    "images_per_second": rate,
                    "rounds": len(measures[measure]),
                    "ratio": rate / base if base else None,
                    "round_ratio": round_ratio(measures[measure], base_rounds),
                    "flop_utilisation": (
                        flops[measure] * rate / (peak_gflops * 1e9)
                        if macs and peak_gflops
                        else None
                    ),
                }
            )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--official-repo", required=True)
    parser.add_argument("--size", default="pico")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--contenders",
        nargs="+",
        choices=CONTENDERS,
        default=[
            c
            for c in CONTENDERS
            if c not in ("jax_bf16_copy", "jax_alt", "jax_kept_alt")
        ],
    )
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument(
        "--allocator",
        choices=("default", "no-mmap", "huge-pages"),
        default="default",
        help="glibc malloc settings of every contender's process: the "
        "default, no-mmap (MALLOC_MMAP_MAX_=0 and friends; large "
        "buffers reused instead of page-faulted in at every step), or "
        "huge-pages (GLIBC_TUNABLES=glibc.malloc.hugetlb=1: malloc's "
        "memory on transparent huge pages, "
        "keras_jumbo.runtime.with_huge_pages)",
    )
    parser.add_argument(
        "--malloc-library",
        help="a malloc replacement (shared library) preloaded into every "
        "contender's process alike (LD_PRELOAD), e.g. "
        "libtcmalloc_minimal.so.4 or libjemalloc.so.2; with --allocator, "
        "glibc's settings then go unused",
    )
    parser.add_argument(
        "--no-matmul-floor",
        dest="matmul_floor",
        action="store_false",
        help="leave out the matmul floor: the xla_matmuls / torch_matmuls "
        "rows and their _ideal twins (the steps' matmuls, each timed "
        "alone; measured on CPU in float32 only)",
    )
    parser.add_argument(
        "--floor-reps",
        type=int,
        default=20,
        help="timings per product for the matmul floor (the best counts)",
    )
    parser.add_argument(
        "--jax-python",
        help="the Python interpreter of the jax_alt / jax_kept_alt "
        "contenders, e.g. a Python 3.12+ environment with a newer jax than "
        "this one's (it needs keras and keras_jumbo; every other contender "
        "and the matmul floor stay on this interpreter)",
    )
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in (
        "batch",
        "train_batch",
        "steps",
        "rounds",
        "threads",
        "floor_reps",
    ):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.worker:
        return worker(args)
    if not os.path.isfile(
        os.path.join(args.official_repo, "models", "jumbo.py")
    ):
        parser.error(
            "--official-repo must be a checkout of the official Jumbo code "
            f"(with models/jumbo.py). Received: {args.official_repo!r}"
        )
    if args.malloc_library and not os.path.isfile(args.malloc_library):
        parser.error(
            "--malloc-library must be a shared library file. "
            f"Received: {args.malloc_library!r}"
        )
    alternates = [c for c in args.contenders if c.endswith("_alt")]
    if alternates and not args.jax_python:
        parser.error(
            f"--contenders {' '.join(alternates)} need --jax-python. "
            "Received: no --jax-python"
        )
    if args.jax_python and not (
        os.path.isfile(args.jax_python) and os.access(args.jax_python, os.X_OK)
    ):
        parser.error(
            "--jax-python must be an executable Python interpreter. "
            f"Received: {args.jax_python!r}"
        )
    passed = [
        f"--official-repo={args.official_repo}",
        f"--size={args.size}",
        f"--image-size={args.image_size}",
        f"--num-classes={args.num_classes}",
        f"--batch={args.batch}",
        f"--train-batch={args.train_batch}",
        f"--steps={args.steps}",
        f"--warmup={args.warmup}",
        f"--device={args.device}",
        f"--threads={args.threads}",
        f"--floor-reps={args.floor_reps}",
    ] + (["--bf16"] if args.bf16 else [])
    peak = _run_worker("peak", args, passed)
    peak_gflops = max(peak.values())
    print(
        f"fp32 matmul peak: torch {peak['torch_gflops']:.0f}, JAX "
        f"{peak['jax_gflops']:.0f} GFLOP/s",
        flush=True,
    )
    floors = {}
    if args.matmul_floor and args.device == "cpu" and not args.bf16:
        if hasattr(os, "sched_setaffinity"):
            floors = {"": "matmul_floor", "_ideal": "matmul_floor_one_core"}
        else:
            floors = {"": "matmul_floor"}
            print("no os.sched_setaffinity here: no *_matmuls_ideal rows")
    results, macs = {}, None
    for round_index in range(args.rounds):
        for contender in args.contenders:
            result = _run_worker(contender, args, passed)
            macs = result.get("macs", macs)
            entry = results.setdefault(contender, {})
            for measure in MEASURES:
                if measure in result:
                    entry.setdefault(measure, []).append(result[measure])
            fit = result.get("training_fit")
            print(
                f"round {round_index + 1} {contender}: inference "
                f"{result['inference']:.0f} img/s"
                + (
                    f", training {result['training']:.0f} img/s"
                    if "training" in result
                    else ""
                )
                + (f", fit {fit:.0f} img/s" if fit else ""),
                flush=True,
            )
        for suffix, name in floors.items():
            floor = _run_worker(name, args, passed)
            macs = floor.pop("macs")
            for measure, found in floor.items():
                print(
                    f"round {round_index + 1} {name}, {measure} (batch "
                    f"{found['batch']}, {found['products']} products, "
                    f"{found['distinct']} distinct, {found['gflop']:.2f} "
                    f"GFLOP): XLA {1e3 * found['xla']:.1f} ms, torch "
                    f"{1e3 * found['torch']:.1f} ms"
                    + (f" on one core, / {args.threads}" if suffix else ""),
                    flush=True,
                )
                for kernels in ("xla", "torch"):
                    seconds = found[kernels] / (args.threads if suffix else 1)
                    results.setdefault(
                        f"{kernels}_matmuls{suffix}",
                        {"inference": [], "training": []},
                    )[measure].append(found["batch"] / seconds)
    rows = summarize(results, peak_gflops, macs)
    print(
        f"\n{args.size}, {args.image_size} px, inference batch {args.batch}, "
        f"training batch {args.train_batch}, {args.device}"
        f"{', bf16' if args.bf16 else ''}, {args.allocator} allocator"
        + (
            f" under {os.path.basename(args.malloc_library)}"
            if args.malloc_library
            else ""
        )
        + f", {args.rounds} rounds (median), "
        f"{platform.machine()} {os.cpu_count()} cores, {args.threads} "
        "threads"
    )
    print(
        "| contender | measure | img/s | ratio | ratio per round (median) "
        "| FLOP utilisation |\n"
        "|---|---|---|---|---|---|"
    )
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        round_ratio = (
            "" if row["round_ratio"] is None else f"{row['round_ratio']:.2f}"
        )
        util = (
            ""
            if row["flop_utilisation"] is None
            else f"{100 * row['flop_utilisation']:.0f}%"
        )
        print(
            f"| {row['contender']} | {row['measure']} | "
            f"{row['images_per_second']:.0f} | {ratio} | {round_ratio} | "
            f"{util} |"
        )
    if args.csv:
        os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
        with open(args.csv, "w", newline="") as handle:
            writer = csv.DictWriter(
                handle,
                fieldnames=[
                    *rows[0],
                    "size",
                    "image_size",
                    "batch",
                    "train_batch",
                    "device",
                    "bf16",
                    "allocator",
                    "malloc_library",
                    "peak_gflops",
                    "macs",
                ],
            )
            writer.writeheader()
            for row in rows:
                writer.writerow(
                    {
                        **row,
                        "size": args.size,
                        "image_size": args.image_size,
                        "batch": args.batch,
                        "train_batch": args.train_batch,
                        "device": args.device,
                        "bf16": args.bf16,
                        "allocator": args.allocator,
                        "malloc_library": os.path.basename(
                            args.malloc_library or ""
                        ),
                        "peak_gflops": round(peak_gflops, 1),
                        "macs": macs,
                    }
                )
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
