"""Inference throughput of JumboViT vs RegistersViT (R=16), one backend.

Reproduces the comparison behind the Jumbo paper's Fig. 1/4 and Table 3:
at the same width, ViT+Jumbo (J=6) costs little more than ViT+Registers
(R=16); the paper reports a throughput ratio Jumbo/Registers of about 0.96
at nano, 128 px (RTX 4090, torch.compile, batch 512: 101.7K vs 105.9K
images/s, Tables 5-6).

Both models run through Keras' compiled predict function (XLA on JAX,
tf.function on TensorFlow, eager on PyTorch) on random 128 px images,
after warm-up. The batch is a tensor of the backend, made once (as in
`vs_official.py`: no copy from NumPy inside the timed loop). As the image
recipes do (`--allocator auto`, the default; `--allocator default`
measures without either), the script starts again with glibc's malloc on
transparent huge pages (`keras_jumbo.runtime.restart_with_huge_pages`)
and, on JAX, calls `keras_jumbo.runtime.keep_freed_memory()` first. The
two models are timed in `--rounds` interleaved rounds (the order
alternates), so a slow phase of a shared machine hits both; the script
prints each round's ratio and the median images/s and ratio.
Beside it, the ratio the two models' multiply-accumulates alone predict
(`count_macs`: Registers' MACs / Jumbo's, the ratio at equal FLOP
efficiency) and the measured ratio over it ("efficiency": below 1 when
Jumbo's work runs slower per MAC than Registers'). `--dtype bfloat16` is
`mixed_bfloat16`; `--dtype pure-bfloat16` stores the weights in bfloat16
too (no float32 -> bfloat16 cast of every kernel in every step: on JAX's
CPU the casts of Jumbo's wide FFN kernels are what slows Jumbo under
mixed precision). Defaults are GPU-sized
(batch 512); on a CPU use e.g. `--batch 64 --steps 10`.

Command:
    KERAS_BACKEND=jax python benchmarks/jumbo_vs_registers.py \
        --batch 32 --steps 3
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_jumbo.models import JumboViT  # noqa: E402
from keras_jumbo.models import RegistersViT  # noqa: E402
from keras_jumbo.models import count_macs  # noqa: E402

# The recipes' `--allocator` policy, shared (`recipes/` sits beside this
# directory and is not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recipes.common import allocator_label  # noqa: E402
from recipes.common import apply_allocator  # noqa: E402
from recipes.common import restart_with_huge_pages  # noqa: E402


def images_per_second(model, images, steps, warmup):
    for _ in range(warmup):
        keras.ops.convert_to_numpy(model.predict_on_batch(images))
    start = time.perf_counter()
    for _ in range(steps):
        keras.ops.convert_to_numpy(model.predict_on_batch(images))
    return steps * images.shape[0] / (time.perf_counter() - start)


def compare(jumbo, registers, images, steps, warmup, rounds):
    """Images/s of both models per round (order alternating) and the
    ratio Jumbo / Registers of each round."""
    rates = {"jumbo": [], "registers": []}
    models = {"jumbo": jumbo, "registers": registers}
    for round_index in range(rounds):
        order = ["jumbo", "registers"]
        if round_index % 2:
            order.reverse()
        for name in order:
            rates[name].append(
                images_per_second(models[name], images, steps, warmup)
            )
    ratios = [
        j / r for j, r in zip(rates["jumbo"], rates["registers"], strict=True)
    ]
    return rates, ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["pico", "nano"])
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "pure-bfloat16"],
        help="bfloat16: mixed_bfloat16 (float32 weights, cast to bfloat16 "
        "in every step); pure-bfloat16: the bfloat16 policy, every weight "
        'stored in bfloat16 (what `with_config(model, dtype="bfloat16")` '
        "makes of a trained model for inference)",
    )
    parser.add_argument(
        "--allocator",
        choices=("auto", "default"),
        default="auto",
        help="auto (what the image recipes do): run as a script, start "
        "again with glibc's malloc on transparent huge pages, and on JAX "
        "keras_jumbo.runtime.keep_freed_memory() before the first "
        "computation; default: glibc's defaults",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1; received {args.rounds}")
    kept = apply_allocator(args.allocator)
    policies = {"bfloat16": "mixed_bfloat16", "pure-bfloat16": "bfloat16"}
    if args.dtype in policies:
        keras.config.set_dtype_policy(policies[args.dtype])
    rng = np.random.default_rng(0)
    images = keras.ops.convert_to_tensor(
        rng.normal(
            size=(args.batch, args.image_size, args.image_size, 3)
        ).astype("float32")
    )
    print(
        f"backend={keras.backend.backend()} dtype={args.dtype} "
        f"batch={args.batch} steps={args.steps} rounds={args.rounds} "
        f"image={args.image_size}px allocator={allocator_label(kept)}"
    )
    print(
        f"{'size':<6} {'Jumbo img/s':>12} {'Registers img/s':>16} "
        f"{'ratio':>7} {'MAC ratio':>10} {'efficiency':>11}  rounds"
    )
    for size in args.sizes:
        common = dict(num_classes=args.num_classes, image_size=args.image_size)
        jumbo = JumboViT(size, **common)
        registers = RegistersViT(size, num_registers=16, **common)
        rates, ratios = compare(
            jumbo, registers, images, args.steps, args.warmup, args.rounds
        )
        ratio = statistics.median(ratios)
        mac_ratio = count_macs(registers) / count_macs(jumbo)
        print(
            f"{size:<6} {statistics.median(rates['jumbo']):>12.1f} "
            f"{statistics.median(rates['registers']):>16.1f} "
            f"{ratio:>7.3f} {mac_ratio:>10.3f} {ratio / mac_ratio:>11.3f}  "
            + " ".join(f"{r:.3f}" for r in ratios)
        )
    print("paper (RTX 4090, nano, 128 px, batch 512): ratio 0.96")


if __name__ == "__main__":
    restart_with_huge_pages()
    main()
