"""Throughput and memory of every image model family and size, one backend.

For each model (registry name; time-series models on random series of
their default shape): inference examples/s (Keras' compiled
predict step: XLA on JAX, tf.function on TensorFlow, eager on PyTorch),
training images/s (`train_on_batch`, AdamW + cross-entropy) and the peak
memory of a training step, each model in a fresh subprocess so that the
memory numbers do not mix. Peak memory comes from the device where the
backend exposes it (JAX `memory_stats`, `torch.cuda.max_memory_allocated`,
TensorFlow `get_memory_info`) and otherwise from the process' peak RSS
growth over the training steps (CPU; labelled `host_rss`). As the recipes
do (`--allocator auto`; `--allocator default` measures without it), every
worker starts with glibc's malloc on transparent huge pages where that
changes something (`keras_jumbo.runtime.with_huge_pages`), and on JAX each
image model's worker first calls `keras_jumbo.runtime.keep_freed_memory()`;
the CSV's
`allocator` column says which ran (`huge-pages`, `kept`, both, or
`default`).

`--rounds N` measures every model N times in alternating order (a fresh
worker each time unless `--in-process`) and records each model's median
(the largest training peak memory): a shared machine's
slow phases otherwise land on one model of a ratio (the NonDeep / deep
inference ratio read 0.99-1.32 in four single-round runs on one 2-core
machine, 1.07-1.12 interleaved in one process; benchmarks/README.md,
forty-first session).

Printed in the same run: JumboViT / RegistersViT inference throughput per
size (paper, Jumbo Tables 5-6 at 128 px on an RTX 4090: 101.7K / 105.9K =
0.96 at nano) and, on JAX, the training-step time with
`jit_compile=True` over `jit_compile=False` (one model, `--jit-model`).

Writes a CSV and a PNG plot of ImageNet-1K top-1 against inference
throughput in the style of the Jumbo paper's Fig. 4. The accuracies are
the papers' (Jumbo Tables 5, 6 and 10; Non-Deep ViT Table 1; ViT-ResNAS
Table 3), not measured here — the plot and the CSV say so; the
throughput is ours.

Defaults are GPU-sized (every registered model, batch 512, 128 px); on a
CPU, a subset of every family:
    KERAS_BACKEND=jax python benchmarks/throughput.py --models cpu \
        --batch 8 --steps 3 --image-size 224
    KERAS_BACKEND=jax python benchmarks/throughput.py --bf16 ...   # bfloat16
    # the issue #15 Non-Deep ratio, 3 interleaved rounds
    KERAS_BACKEND=jax python benchmarks/throughput.py --models \
        non_deep_vit_6x2 non_deep_vit_6x2:deep --batch 16 --steps 5 \
        --image-size 224 --rounds 3 --csv /tmp/nondeep.csv \
        --png /tmp/nondeep.png
"""

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_jumbo import models  # noqa: E402
from keras_jumbo import optimizers  # noqa: E402
from keras_jumbo import runtime  # noqa: E402

# The recipes' `--allocator` policy, shared (`recipes/` sits beside this
# directory and is not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recipes.common import allocator_label  # noqa: E402
from recipes.common import apply_allocator  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _rounds import round_ratio  # noqa: E402

# `--models cpu`: one or more sizes of every family, small enough for a CPU.
CPU_MODELS = (
    "jumbo_vit_pico",
    "jumbo_vit_nano",
    "jumbo_vit_tiny",
    "jumbo_vit_small",
    "registers_vit_nano",
    "registers_vit_tiny",
    "registers_vit_small",
    "vit_tiny",
    "non_deep_vit_6x2",
    "non_deep_vit_6x2:plain",
    "non_deep_vit_6x2:deep",
    "non_deep_vit_6x2:nodiversity",
    "non_deep_vit_4x3",
    "non_deep_vit_4x3:plain",
    "vit_res_tiny",
    "vit_resnas_tiny",
    "vit_resnas_small",
    "patchtst",
    "patchtst_registers",
    "patchtst_jumbo",
    "patchtst_forecaster",
    "ms_patchtst",
)
# Time-series models run on random series of their default shape (Jumbo
# A.2.2 classification: L=128; MS-PatchTST forecasting: L=336, 7 channels).
TIME_SERIES = (
    "patchtst",
    "patchtst_registers",
    "patchtst_jumbo",
    "patchtst_forecaster",
    "ms_patchtst",
)

# ImageNet-1K top-1 (%) from the papers, by model and resolution; the
# source is written next to every number in the CSV and on the plot.
PAPER_TOP1 = {
    # Jumbo paper Table 6 (128 px, best learning rate) and Table 10 (224 px).
    ("jumbo_vit_pico", 128): (64.0, "Jumbo Table 6"),
    ("jumbo_vit_nano", 128): (68.8, "Jumbo Table 6"),
    ("jumbo_vit_tiny", 128): (73.0, "Jumbo Table 6"),
    ("jumbo_vit_small", 128): (78.5, "Jumbo Table 6"),
    ("jumbo_vit_pico", 224): (70.5, "Jumbo Table 10"),
    ("jumbo_vit_nano", 224): (74.5, "Jumbo Table 10"),
    ("jumbo_vit_tiny", 224): (77.7, "Jumbo Table 10"),
    ("jumbo_vit_small", 224): (81.8, "Jumbo Table 10"),
    # Jumbo paper Table 5 (128 px, R=16, best learning rate) and Table 10.
    ("registers_vit_nano", 128): (53.6, "Jumbo Table 5"),
    ("registers_vit_tiny", 128): (68.8, "Jumbo Table 5"),
    ("registers_vit_small", 128): (78.2, "Jumbo Table 5"),
    ("registers_vit_nano", 224): (61.0, "Jumbo Table 10"),
    ("registers_vit_tiny", 224): (74.5, "Jumbo Table 10"),
    ("registers_vit_small", 224): (81.9, "Jumbo Table 10"),
    # Non-Deep ViT Table 1 (224 px): 12-layer DeiT-Tiny and D-MAE-l-R.
    ("vit_tiny", 224): (72.2, "Non-Deep ViT Table 1 (DeiT-Tiny)"),
    # The reparameterised (":plain") models are the ones the paper deploys.
    ("non_deep_vit_6x2:plain", 224): (72.4, "Non-Deep ViT Table 1 (D-MAE-6-R)"),
    ("non_deep_vit_4x3:plain", 224): (67.0, "Non-Deep ViT Table 1 (D-MAE-4-R)"),
    ("non_deep_vit_3x4:plain", 224): (60.5, "Non-Deep ViT Table 1 (D-MAE-3-R)"),
    # ViT-ResNAS Table 3 (224 px).
    ("vit_res_tiny", 224): (80.1, "ViT-ResNAS Table 3"),
    ("vit_resnas_tiny", 224): (80.8, "ViT-ResNAS Table 3"),
    ("vit_resnas_small", 224): (81.7, "ViT-ResNAS Table 3"),
    ("vit_resnas_medium", 224): (82.4, "ViT-ResNAS Table 3"),
}


def all_models():
    """Every registered model, plus the reparameterised Non-Deep ViTs."""
    names = []
    for name in models.list_models():
        names.append(name)
        if name.startswith("non_deep_vit"):
            names.append(name + ":plain")
    return names


def _device_peak_bytes():
    """(peak bytes, source) from the accelerator, or (None, None)."""
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                return stats["peak_bytes_in_use"], "device"
        elif backend == "torch":
            import torch

            if torch.cuda.is_available():
                return torch.cuda.max_memory_allocated(), "device"
        elif backend == "tensorflow":
            import tensorflow as tf

            if tf.config.list_physical_devices("GPU"):
                return tf.config.experimental.get_memory_info("GPU:0")[
                    "peak"
                ], "device"
    except Exception:  # noqa: BLE001 - a missing stat is not fatal
        pass
    return None, None


def _rss_bytes():
    """Current resident set size of this process (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _seconds_per_step(step, steps):
    step()  # warm-up / compile
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def image_size_for(name, image_size):
    """ViT-Res(NAS) needs sides divisible by 56 (patch 14, two 2x
    reductions; ViT-ResNAS §4): the nearest such size, at least 56."""
    if name.startswith("vit_res"):
        return max(56, 56 * round(image_size / 56))
    return image_size


def _build(name, image_size, num_classes):
    """A registry model; `name:plain` is a Non-Deep ViT reparameterised
    into the plain shallow ViT it collapses to (what is deployed);
    `name:deep` the L-layer one-branch model of the same MACs (6x2 -> 12
    layers, same heads and widths: the deep model the branchy one should
    cost as much as); `name:nodiversity` the branchy model without the
    diversity loss (`diversity_weight=0`; training cost of that term)."""
    base, _, variant = name.partition(":")
    model = models.create_model(
        base, num_classes=num_classes, image_size=image_size
    )
    if variant == "deep":
        config = model.get_config()
        return models.NonDeepViT(
            config["depth"] * config["num_branches"],
            1,
            num_classes=num_classes,
            image_size=image_size,
        )
    if variant == "nodiversity":
        config = model.get_config()
        config["diversity_weight"] = 0.0
        return type(model).from_config(config)
    if variant == "plain":
        from keras_jumbo import convert

        convert.set_join_lambda(model, 1.0)
        model = convert.reparameterize(model)
    return model


def build_model(name, image_size, num_classes=1000):
    """`(model, image size)`: a time-series model at its registered
    defaults (size None), or an image model (`_build`) at
    `image_size_for(name, image_size)`."""
    if name in TIME_SERIES:
        return models.create_model(name), None
    image_size = image_size_for(name, image_size)
    return _build(name, image_size, num_classes), image_size


def _inputs(model, batch, rng):
    """Random inputs and targets for `model` (labels, or a zero forecast)."""
    shape = (batch,) + tuple(model.input_shape[1:])
    x = rng.normal(size=shape).astype("float32")
    if len(model.output_shape) == 2:
        y = rng.integers(0, model.output_shape[-1], size=(batch,))
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        y = np.zeros((batch,) + tuple(model.output_shape[1:]), "float32")
        loss = keras.losses.MeanSquaredError()
    return x, y, loss


def measure(name, image_size, batch, steps, num_classes=1000, train=True):
    """Inference / training examples/s and training-step peak memory."""
    rng = np.random.default_rng(0)
    model, image_size = build_model(name, image_size, num_classes)
    x, y, loss = _inputs(model, batch, rng)
    row = {
        "model": name,
        "params_m": round(model.count_params() / 1e6, 2),
        "image_size": image_size,
        "input_shape": "x".join(str(d) for d in x.shape[1:]),
        "batch": batch,
        "dtype_policy": keras.config.dtype_policy().name,
    }
    if train:
        model.compile(optimizer=optimizers.AdamW(1e-4), loss=loss)
        rss_before = _rss_bytes()
        seconds = _seconds_per_step(lambda: model.train_on_batch(x, y), steps)
        row["train_img_s"] = round(batch / seconds, 1)
        peak, source = _device_peak_bytes()
        if peak is None:
            peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            peak, source = max(0, peak_rss - rss_before), "host_rss"
        row["train_peak_mb"] = round(peak / 2**20, 1)
        row["memory_source"] = source
    seconds = _seconds_per_step(lambda: model.predict_on_batch(x), steps)
    row["infer_img_s"] = round(batch / seconds, 1)
    top1, source = PAPER_TOP1.get((name, image_size), (None, ""))
    row["paper_top1"] = top1
    row["accuracy_source"] = f"paper: {source}" if source else ""
    return row


def jit_ratio(name, image_size, batch, steps, num_classes=1000):
    """JAX training-step time, jit_compile=True over jit_compile=False."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batch, image_size, image_size, 3)).astype("float32")
    y = rng.integers(0, num_classes, size=(batch,))
    times = {}
    for jit in (True, False):
        model = _build(name, image_size, num_classes)
        model.compile(
            optimizer=optimizers.AdamW(1e-4),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
        times[jit] = _seconds_per_step(
            lambda model=model: model.train_on_batch(x, y), steps
        )
    return times[True] / times[False], times


def _apply_allocator(flag, names):
    """`--allocator` for a process that measures `names`: the CSV's label
    (`recipes.common.allocator_label`: "huge-pages", "kept", both joined
    by "+", or "default"). Keeping memory follows the recipes' policy
    (`recipes.common.apply_allocator`: flag "auto" on JAX, with glibc)
    when an image model is among `names`; the time-series recipe does
    not call it (a PatchTST step of ~12 ms, batch 8, ran 15-20% slower
    with it; benchmarks/README.md). Call it before the process's first
    JAX computation."""
    images = [name for name in names if name not in TIME_SERIES]
    return allocator_label(bool(images) and apply_allocator(flag))


def _in_subprocess(args, name):
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        name,
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--image-size",
        str(args.image_size),
    ]
    command += ["--allocator", args.allocator]
    command += ["--bf16"] if args.bf16 else []
    command += ["--no-train"] if args.no_train else []
    # `--allocator auto`: the worker starts as the recipes restart.
    env = runtime.with_huge_pages() if args.allocator == "auto" else None
    out = subprocess.run(
        command, capture_output=True, text=True, check=False, env=env
    )
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_row(rows):
    """One model's rows over rounds as one: the median of each
    throughput, the largest peak memory, the rest from the first round;
    `rounds` says how many."""
    row = dict(rows[0], rounds=len(rows))
    for key in ("infer_img_s", "train_img_s"):
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            row[key] = round(statistics.median(values), 1)
    peaks = [r["train_peak_mb"] for r in rows if r.get("train_peak_mb")]
    if peaks:
        row["train_peak_mb"] = max(peaks)
    return row


def per_round_ratio(numerators, denominators, key):
    """`_rounds.round_ratio` of `key` over the rounds (the two rows of a
    round measured side by side), as text to print after the ratio of
    medians; empty for a single round."""
    if len(numerators) < 2:
        return ""
    ratio = round_ratio(
        [row[key] for row in numerators], [row[key] for row in denominators]
    )
    return f" (per round: median {ratio:.2f})"


def plot(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    families = {}
    for row in rows:
        if row.get("paper_top1") is None:
            continue
        family = row["model"].replace(":", "_").rsplit("_", 1)[0]
        families.setdefault(family, []).append(row)
    for family, members in families.items():
        members.sort(key=lambda r: r["infer_img_s"])
        axis.plot(
            [r["infer_img_s"] for r in members],
            [r["paper_top1"] for r in members],
            marker="o",
            label=family,
        )
        for r in members:
            axis.annotate(
                r["model"].replace(":", "_").rsplit("_", 1)[1],
                (r["infer_img_s"], r["paper_top1"]),
                fontsize=7,
            )
    axis.set_xscale("log")
    axis.set_xlabel("inference throughput, images/s (measured here)")
    axis.set_ylabel("ImageNet-1K top-1 % (from the papers, not measured)")
    axis.set_title(title, fontsize=9)
    axis.grid(alpha=0.3)
    if families:
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models",
        nargs="+",
        default=["all"],
        help="registry names (name:plain = reparameterised Non-Deep ViT, "
        "name:deep = its L-layer one-branch model of the same MACs, "
        "name:nodiversity = without the diversity loss), "
        "'all' (every registered model, the default) or 'cpu' (a subset)",
    )
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--no-train", action="store_true")
    parser.add_argument("--jit-model", default="jumbo_vit_nano")
    parser.add_argument("--csv", default="benchmarks/results/throughput.csv")
    parser.add_argument("--png", default="benchmarks/results/throughput.png")
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every model this many times, in alternating order "
        "(each time in a fresh worker unless --in-process); the CSV and "
        "the ratios take each model's median over rounds, and the printed "
        "ratios also the median of the per-round ratios, so that a slow "
        "phase of a shared machine does not land on one model of a pair",
    )
    parser.add_argument(
        "--allocator",
        choices=("auto", "default"),
        default="auto",
        help="auto (what the recipes do): every worker starts with glibc's "
        "malloc on transparent huge pages (keras_jumbo.runtime."
        "with_huge_pages; with --in-process, only if this process did), "
        "and on JAX keras_jumbo.runtime.keep_freed_memory() runs before "
        "the first computation of every image model's worker (as in the "
        "image recipes; the time-series recipe does not call it; with "
        "--in-process, for the whole process when any image model is "
        "listed); default: glibc's defaults and JAX's asynchronous "
        "dispatch. Written to the CSV's `allocator` column",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise ValueError(f"`--rounds` must be >= 1. Received: {args.rounds}")
    if args.bf16:
        keras.config.set_dtype_policy("mixed_bfloat16")
    if args.worker:
        allocator = _apply_allocator(args.allocator, [args.worker])
        row = measure(
            args.worker,
            args.image_size,
            args.batch,
            args.steps,
            train=not args.no_train,
        )
        row["allocator"] = allocator
        print(json.dumps(row))
        return row

    if args.models == ["all"]:
        args.models = all_models()
    elif args.models == ["cpu"]:
        args.models = list(CPU_MODELS)
    unknown = sorted(
        {name.partition(":")[0] for name in args.models}
        - set(models.list_models())
    )
    if unknown:
        raise ValueError(f"Unknown `--models`: {unknown}")
    allocator = "default"
    if args.in_process:
        allocator = _apply_allocator(args.allocator, args.models)
    # rounds_of[name]: that model's row in each round.
    rounds_of = {name: [] for name in args.models}
    for round_index in range(args.rounds):
        order = args.models if round_index % 2 == 0 else args.models[::-1]
        for name in order:
            if args.in_process:
                row = measure(
                    name,
                    args.image_size,
                    args.batch,
                    args.steps,
                    train=not args.no_train,
                )
                row["allocator"] = allocator
            else:
                row = _in_subprocess(args, name)
            rounds_of[name].append(row)
            prefix = f"round {round_index + 1} " if args.rounds > 1 else ""
            print(
                f"{prefix}{name:<22}{row['params_m']:>8.2f}M  infer "
                f"{row['infer_img_s']:>9.1f} img/s  train "
                f"{row.get('train_img_s', float('nan')):>8.1f} img/s  peak "
                f"{row.get('train_peak_mb', float('nan')):>8.1f} MB "
                f"({row.get('memory_source', '-')})",
                flush=True,
            )
    rows = [median_row(rounds_of[name]) for name in args.models]
    if args.rounds > 1:
        for row in rows:
            print(
                f"median {row['model']:<22}infer {row['infer_img_s']:>9.1f} "
                f"img/s  train {row.get('train_img_s', float('nan')):>8.1f} "
                "img/s",
                flush=True,
            )
    os.makedirs(os.path.dirname(args.csv) or ".", exist_ok=True)
    fields = sorted({key for row in rows for key in row})
    with open(args.csv, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    title = (
        f"{keras.backend.backend()}, {args.image_size} px, batch {args.batch}"
        f"{', bf16' if args.bf16 else ''}; accuracies from the papers"
    )
    plot(rows, args.png, title)
    print(f"wrote {args.csv} and {args.png}")

    by_name = {row["model"]: row for row in rows}
    jumbo, registers = (
        by_name.get("patchtst_jumbo"),
        by_name.get("patchtst_registers"),
    )
    if jumbo and registers:
        print(
            "PatchTST+Jumbo / +Registers inference throughput: "
            f"{jumbo['infer_img_s'] / registers['infer_img_s']:.2f} "
            "(R from Proposition 1 matches the per-layer FLOPs)"
        )
    branchy, deep = (
        by_name.get("non_deep_vit_6x2"),
        by_name.get("non_deep_vit_6x2:deep"),
    )
    if branchy and deep:
        pair = rounds_of["non_deep_vit_6x2:deep"], rounds_of["non_deep_vit_6x2"]
        line = (
            "NonDeepViT-6x2 / 12-layer one-branch time (same MACs): "
            f"inference {deep['infer_img_s'] / branchy['infer_img_s']:.2f}"
            f"{per_round_ratio(*pair, 'infer_img_s')}"
        )
        if branchy.get("train_img_s") and deep.get("train_img_s"):
            line += (
                f", training {deep['train_img_s'] / branchy['train_img_s']:.2f}"
                f"{per_round_ratio(*pair, 'train_img_s')}"
            )
        print(
            line + f" at {branchy['image_size']} px, batch "
            f"{branchy['batch']} (the paper's premise: 1.0; issue #15 goal "
            "<= 1.2 / 1.15, set at 224 px, batch 16)"
        )
    lean = by_name.get("non_deep_vit_6x2:nodiversity")
    if lean and deep and lean.get("train_img_s") and deep.get("train_img_s"):
        print(
            "NonDeepViT-6x2 without the diversity loss / 12-layer training "
            f"time: {deep['train_img_s'] / lean['train_img_s']:.2f}"
        )
    for size in models.VIT_SIZES:
        jumbo = by_name.get(f"jumbo_vit_{size}")
        registers = by_name.get(f"registers_vit_{size}")
        if jumbo and registers:
            pair = (
                rounds_of[f"jumbo_vit_{size}"],
                rounds_of[f"registers_vit_{size}"],
            )
            print(
                f"Jumbo/Registers inference throughput, {size}: "
                f"{jumbo['infer_img_s'] / registers['infer_img_s']:.2f}"
                f"{per_round_ratio(*pair, 'infer_img_s')} "
                "(paper, nano at 128 px on an RTX 4090: 0.96)"
            )
    if keras.backend.backend() == "jax" and not args.no_train:
        ratio, times = jit_ratio(
            args.jit_model, args.image_size, args.batch, args.steps
        )
        print(
            f"JAX train step, jit_compile=True / False ({args.jit_model}): "
            f"{ratio:.2f} ({times[True] * 1e3:.1f} ms vs "
            f"{times[False] * 1e3:.1f} ms)"
        )
    return rows


if __name__ == "__main__":
    main()
