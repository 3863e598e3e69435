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
                      PyTorch)
    jax_kept          keras_jumbo on JAX after
                      `keras_jumbo.runtime.keep_freed_memory()` (what the
                      recipes do on JAX: each step's buffer is reused, not
                      page-faulted in again)
    tensorflow_xla    keras_jumbo on TensorFlow with `jit_compile=True`
                      (XLA; Keras' "auto" turns XLA off on CPU-only
                      TensorFlow machines)
    torch_compile     keras_jumbo on PyTorch with `jit_compile=True`
                      (`torch.compile` of Keras' steps)

Measures: inference images/s (batch `--batch`, `predict_on_batch`, or the
module under `torch.no_grad()`), and training images/s (batch
`--train-batch`; AdamW lr 1e-3 wd 0.05, cross-entropy on integer labels;
`train_on_batch`, or forward + backward + `step()` for the official code).
Ratios: inference against `official_compile`, training against `official`
(eager). FLOP utilisation = FLOPs per image x images/s / the fp32 matmul
peak measured in the same run (the best of a 2048^3 `torch.matmul` and a
jitted JAX `dot`); FLOPs per image = 2 x `count_macs` for inference and 3x
that for a training step (forward + backward ~ 2x forward).

Needs the official code (a checkout with `models/jumbo.py` and
`configs.py`, e.g. `../shared/peers/jumbo_official`), `einops` and
`timm==1.0.12` (`pip install einops timm==1.0.12 --no-deps`; only
`timm.layers` is used, entered without timm's package `__init__`, which
needs torchvision).

Usage (2-core CPU; about 10 minutes):
    python benchmarks/vs_official.py \
        --official-repo ../shared/peers/jumbo_official \
        --csv benchmarks/results/vs_official_cpu.csv
    # every contender with glibc's mmap of large buffers turned off
    python benchmarks/vs_official.py --official-repo DIR --allocator no-mmap
    # the paper's GPU comparison (Jumbo Table 6: RTX 4090, batch 512, bf16)
    python benchmarks/vs_official.py --official-repo DIR --device gpu \
        --batch 512 --train-batch 512 --bf16 --image-size 224
"""

import argparse
import csv
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types

CONTENDERS = (
    "official",
    "official_compile",
    "jax",
    "jax_kept",
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
    "jax_kept": "jax",
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
    import keras
    import numpy as np

    if contender == "jax_kept":
        from keras_jumbo import runtime

        # Before the first JAX computation (the model's initialisers).
        if not runtime.keep_freed_memory():
            raise SystemExit("jax_kept: keep_freed_memory needs glibc")

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
    inference = _rate(
        lambda: model.predict_on_batch(x), args.batch, args.warmup, args.steps
    )
    xt = rng.normal(size=(args.train_batch, size, size, 3)).astype("float32")
    yt = rng.integers(0, args.num_classes, args.train_batch)
    training = _rate(
        lambda: model.train_on_batch(xt, yt),
        args.train_batch,
        args.warmup,
        args.steps,
    )
    return {
        "inference": inference,
        "training": training,
        "macs": models.count_macs(model),
    }


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


def worker(args):
    if args.worker == "peak":
        result = _matmul_peak(args)
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
    if name in KERAS_BACKENDS:
        env["KERAS_BACKEND"] = KERAS_BACKENDS[name]
    elif name == "peak":
        env["KERAS_BACKEND"] = "jax"
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [os.path.abspath(root), env.get("PYTHONPATH")])
    )
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--worker", name, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=args.timeout,
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(
        f"Contender {name!r} failed (exit {out.returncode}):\n"
        + out.stderr[-3000:]
    )


def summarize(results, peak_gflops, macs):
    """Rows `(contender, measure, median img/s, ratio, utilisation)`.

    `results[contender][measure]` is the list of per-round images/s.
    Inference ratios are against `official_compile`, training ratios
    against `official` (eager); a missing reference leaves the ratio None.
    """
    reference = {"inference": "official_compile", "training": "official"}
    flops = {"inference": 2 * macs, "training": 6 * macs}
    rows = []
    for measure in ("inference", "training"):
        base = results.get(reference[measure], {}).get(measure)
        base = statistics.median(base) if base else None
        for contender, measures in results.items():
            rate = statistics.median(measures[measure])
            rows.append(
                {
                    "contender": contender,
                    "measure": measure,
                    "images_per_second": rate,
                    "rounds": len(measures[measure]),
                    "ratio": rate / base if base else None,
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
        "--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS)
    )
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument(
        "--allocator",
        choices=("default", "no-mmap"),
        default="default",
        help="glibc malloc settings of every contender's process: the "
        "default, or no-mmap (MALLOC_MMAP_MAX_=0 and friends; large "
        "buffers reused instead of page-faulted in at every step)",
    )
    parser.add_argument("--csv", help="write the rows here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("batch", "train_batch", "steps", "rounds", "threads"):
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
    ] + (["--bf16"] if args.bf16 else [])
    peak = _run_worker("peak", args, passed)
    peak_gflops = max(peak.values())
    print(
        f"fp32 matmul peak: torch {peak['torch_gflops']:.0f}, JAX "
        f"{peak['jax_gflops']:.0f} GFLOP/s",
        flush=True,
    )
    results, macs = {}, None
    for round_index in range(args.rounds):
        for contender in args.contenders:
            result = _run_worker(contender, args, passed)
            macs = result.get("macs", macs)
            entry = results.setdefault(
                contender, {"inference": [], "training": []}
            )
            entry["inference"].append(result["inference"])
            entry["training"].append(result["training"])
            print(
                f"round {round_index + 1} {contender}: inference "
                f"{result['inference']:.0f} img/s, training "
                f"{result['training']:.0f} img/s",
                flush=True,
            )
    rows = summarize(results, peak_gflops, macs)
    print(
        f"\n{args.size}, {args.image_size} px, inference batch {args.batch}, "
        f"training batch {args.train_batch}, {args.device}"
        f"{', bf16' if args.bf16 else ''}, {args.allocator} allocator, "
        f"{args.rounds} rounds (median), "
        f"{platform.machine()} {os.cpu_count()} cores, {args.threads} "
        "threads"
    )
    print(
        "| contender | measure | img/s | ratio | FLOP utilisation |\n"
        "|---|---|---|---|---|"
    )
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.2f}"
        util = (
            ""
            if row["flop_utilisation"] is None
            else f"{100 * row['flop_utilisation']:.0f}%"
        )
        print(
            f"| {row['contender']} | {row['measure']} | "
            f"{row['images_per_second']:.0f} | {ratio} | {util} |"
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
                        "peak_gflops": round(peak_gflops, 1),
                        "macs": macs,
                    }
                )
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
