"""Batch augmentation time per batch, one backend, contenders interleaved.

The image recipes augment every training batch in the training loop
(`keras_jumbo.data.augmented_batches`), so a slow augmentation adds to
every step. Contenders, each timed per batch in `--rounds` interleaved
rounds (order alternating) after a first, compiling call:

- `keras_blur` / `blur`: Keras' `RandomGaussianBlur(factor=1.0,
  kernel_size=7, sigma=(0.1, 2.0))` (what 3-Augment used before) against
  `keras_jumbo.data.RandomGaussianBlur(sigma=(0.1, 2.0))` (radius 6),
  each as one compiled program (`TrainingModeModel.predict_on_batch`);
- `three_augment_eager` / `three_augment`: `three_augment(mixup_alpha=0.8,
  cutmix_alpha=1.0)` layer by layer (`compiled=False`) and compiled;
- `rand_augment_eager` / `rand_augment`: the same for `rand_augment`
  (`--no-rand-augment` leaves it out: Keras' RandAugment is slow on JAX).

Prints the first call's seconds, the median ms per batch and each pair's
speed-up (eager or Keras time / ours), and the largest difference between
the eager and compiled outputs for one seed.

Command:
    KERAS_BACKEND=jax python benchmarks/augment_throughput.py \
        --image-size 224 --batch 32
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from keras_jumbo import data  # noqa: E402
from keras_jumbo.data import TrainingModeModel  # noqa: E402


def _blur_contender(layer):
    model = TrainingModeModel([layer])

    def call(images, labels, seed):
        data.reseed(layer, seed)
        return keras.ops.convert_to_numpy(model.predict_on_batch(images))

    return call


def contenders(rand_augment):
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0)
    pairs = {
        "blur": (
            _blur_contender(
                keras.layers.RandomGaussianBlur(
                    factor=1.0, kernel_size=7, sigma=(0.1, 2.0), dtype="float32"
                )
            ),
            _blur_contender(
                data.RandomGaussianBlur(sigma=(0.1, 2.0), dtype="float32")
            ),
        ),
        "three_augment": (
            data.three_augment(**mix, compiled=False),
            data.three_augment(**mix, compiled=True),
        ),
    }
    if rand_augment:
        pairs["rand_augment"] = (
            data.rand_augment(**mix, compiled=False),
            data.rand_augment(**mix, compiled=True),
        )
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-rand-augment", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.batch, args.image_size, args.image_size, 3)
    images = rng.uniform(0, 255, shape).astype("float32")
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, args.batch)]
    pairs = contenders(not args.no_rand_augment)
    names = {"blur": ("keras_blur", "blur")}
    first, times = {}, {}
    for pair, (slow, fast) in pairs.items():
        slow_name, fast_name = names.get(pair, (f"{pair}_eager", pair))
        for name, call in ((slow_name, slow), (fast_name, fast)):
            start = time.perf_counter()
            call(images, labels, 0)
            first[name] = time.perf_counter() - start
            times[name] = []
        if pair != "blur":
            a = slow(images, labels, 1)[0]
            b = fast(images, labels, 1)[0]
            diff = np.abs(a - b).max()
            print(f"{pair}: eager vs compiled, max |diff| {diff:.2e}")
    for index in range(args.rounds):
        for pair, (slow, fast) in pairs.items():
            slow_name, fast_name = names.get(pair, (f"{pair}_eager", pair))
            order = [(slow_name, slow), (fast_name, fast)]
            for name, call in order if index % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                call(images, labels, 2 + index)
                times[name].append(time.perf_counter() - start)
    print(
        f"backend {keras.backend.backend()}, batch {args.batch}, "
        f"{args.image_size} px, {args.rounds} rounds"
    )
    print(f"{'contender':22s} {'first s':>8s} {'ms/batch':>9s}")
    for name in times:
        median = 1000 * statistics.median(times[name])
        print(f"{name:22s} {first[name]:8.1f} {median:9.1f}")
    for pair in pairs:
        slow_name, fast_name = names.get(pair, (f"{pair}_eager", pair))
        ratio = statistics.median(
            s / f
            for s, f in zip(times[slow_name], times[fast_name], strict=True)
        )
        print(f"speed-up {fast_name} over {slow_name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
