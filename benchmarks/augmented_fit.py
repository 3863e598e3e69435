"""`model.fit` with the recipes' augmentation, batched vs on the host.

The image recipes augment each training batch in the input pipeline
(`keras_jumbo.data.ImageBatches`), so the augmentation's time adds to every
step. This trains one model (JumboViT, `--size`, 10 classes, AdamW) for
`--rounds` interleaved epochs of `--steps` batches on random uint8 images,
once per `{--augmentation}(mixup_alpha=0.8, cutmix_alpha=1.0,
implementation=...)` (`rand_augment`, the default, or `three_augment`):

- `batched`: Keras layers (`RandomFlip` + the `RandAugment` layer; the
  3-Augment layers), one compiled program a batch (the form for an
  accelerator);
- `host`: `HostRandomFlip` + `HostRandAugment` / `HostThreeAugment`, each
  image with Pillow on the numpy batch (what `implementation="auto"`
  picks without an accelerator).

The model compiles with Keras' default `jit_compile` (on TensorFlow
without an accelerator: no XLA; the recipes turn XLA on for long runs), so
the TensorFlow speed-ups are against a slower step than the recipes'.

Prints each contender's images/s (median epoch) and the host / batched
speed-up (median of the per-round ratios). As the image recipes do, the
script starts again with glibc's malloc on transparent huge pages
(`restart_with_huge_pages()`) and keeps freed memory on JAX
(`keep_freed_memory()`).

Command:
    KERAS_BACKEND=jax python benchmarks/augmented_fit.py --image-size 128
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_jumbo import data  # noqa: E402
from keras_jumbo import models  # noqa: E402

# The recipes' `--allocator` policy, shared (`recipes/` sits beside this
# directory and is not installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from recipes.common import apply_allocator  # noqa: E402
from recipes.common import restart_with_huge_pages  # noqa: E402

IMPLEMENTATIONS = ("batched", "host")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="pico")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--augmentation",
        default="rand_augment",
        choices=("rand_augment", "three_augment"),
    )
    args = parser.parse_args()
    apply_allocator("auto")
    rng = np.random.default_rng(0)
    count = args.batch * args.steps
    shape = (count, args.image_size, args.image_size, 3)
    images = rng.integers(0, 256, shape).astype("uint8")
    labels = rng.integers(0, 10, count)
    model = models.JumboViT(
        args.size, image_size=args.image_size, num_classes=10
    )
    model.compile(
        keras.optimizers.AdamW(1e-4),
        keras.losses.CategoricalCrossentropy(from_logits=True),
    )
    feeds = {
        name: data.ImageBatches(
            images,
            labels,
            args.batch,
            num_classes=10,
            augmentation=getattr(data, args.augmentation)(
                mixup_alpha=0.8, cutmix_alpha=1.0, implementation=name
            ),
            mean=(0.5,) * 3,
            std=(0.25,) * 3,
            drop_remainder=True,
        )
        for name in IMPLEMENTATIONS
    }
    for feed in feeds.values():  # compile
        model.fit(feed, epochs=1, verbose=0)
    times = {name: [] for name in feeds}
    order = list(feeds.items())
    for index in range(args.rounds):
        for name, feed in order if index % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            model.fit(feed, epochs=1, verbose=0)
            times[name].append(time.perf_counter() - start)
    print(
        f"backend {keras.backend.backend()}, {args.augmentation}, "
        f"JumboViT {args.size}, "
        f"{args.image_size} px, batch {args.batch}, {args.steps} steps an "
        f"epoch, {args.rounds} rounds"
    )
    for name, seconds in times.items():
        rate = count / statistics.median(seconds)
        rounds = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"{name:8s} {rate:7.1f} img/s  (epochs: {rounds} s)")
    ratio = statistics.median(
        b / h for b, h in zip(times["batched"], times["host"], strict=True)
    )
    print(f"speed-up host over batched: {ratio:.2f}x")


if __name__ == "__main__":
    restart_with_huge_pages()
    main()
