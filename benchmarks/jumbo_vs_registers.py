"""Inference throughput of JumboViT vs RegistersViT (R=16), one backend.

Reproduces the comparison behind the Jumbo paper's Fig. 1/4 and Table 3:
at the same width, ViT+Jumbo (J=6) costs little more than ViT+Registers
(R=16); the paper reports a throughput ratio Jumbo/Registers of about 0.96
at nano, 128 px (RTX 4090, torch.compile, batch 512: 101.7K vs 105.9K
images/s, Tables 5-6).

Both models run through Keras' compiled predict function (XLA on JAX,
tf.function on TensorFlow, eager on PyTorch) on random 128 px images,
after warm-up; the script prints images/s per model and the ratio measured
in this one run. Defaults are GPU-sized (batch 512); on a CPU use e.g.
`--batch 32 --steps 3`.

Command:
    KERAS_BACKEND=jax python benchmarks/jumbo_vs_registers.py \
        --batch 32 --steps 3
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_jumbo.models import JumboViT  # noqa: E402
from keras_jumbo.models import RegistersViT  # noqa: E402


def images_per_second(model, images, steps, warmup):
    for _ in range(warmup):
        keras.ops.convert_to_numpy(model.predict_on_batch(images))
    start = time.perf_counter()
    for _ in range(steps):
        keras.ops.convert_to_numpy(model.predict_on_batch(images))
    return steps * len(images) / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["pico", "nano"])
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"]
    )
    args = parser.parse_args(argv)
    if args.dtype == "bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    rng = np.random.default_rng(0)
    images = rng.normal(
        size=(args.batch, args.image_size, args.image_size, 3)
    ).astype("float32")
    print(
        f"backend={keras.backend.backend()} dtype={args.dtype} "
        f"batch={args.batch} steps={args.steps} image={args.image_size}px"
    )
    print(
        f"{'size':<6} {'Jumbo img/s':>12} {'Registers img/s':>16} {'ratio':>7}"
    )
    for size in args.sizes:
        common = dict(num_classes=args.num_classes, image_size=args.image_size)
        jumbo = JumboViT(size, **common)
        registers = RegistersViT(size, num_registers=16, **common)
        jumbo_rate = images_per_second(jumbo, images, args.steps, args.warmup)
        reg_rate = images_per_second(registers, images, args.steps, args.warmup)
        print(
            f"{size:<6} {jumbo_rate:>12.1f} {reg_rate:>16.1f} "
            f"{jumbo_rate / reg_rate:>7.3f}"
        )
    print("paper (RTX 4090, nano, 128 px, batch 512): ratio 0.96")


if __name__ == "__main__":
    main()
