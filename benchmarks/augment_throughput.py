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
  cutmix_alpha=1.0, implementation="batched")` layer by layer
  (`compiled=False`) and compiled;
- `three_augment` / `three_augment_host`: that, compiled, against
  `implementation="host"` (`HostThreeAugment`, the reference's PIL calls
  per image);
- `rand_augment_eager` / `rand_augment`: the same for
  `rand_augment(implementation="batched")` (flip +
  `keras_jumbo.data.RandAugment`, timm's per-image
  `rand-m9-mstd0.5-inc1`, every operation family for the whole batch);
- `rand_augment` / `rand_augment_host`: that, compiled, against
  `rand_augment(implementation="host")` (`HostRandAugment`: each image's
  own operations with Pillow on uint8, in the calling process; the
  recipes' choice without an accelerator);
- `keras_rand_augment` / `rand_augment`: what `rand_augment` was before,
  flip + Keras' `RandAugment(factor=0.9)` + the mix, compiled, against
  ours compiled (`--no-keras-rand-augment` leaves it out: seconds a batch
  on JAX);
- `timm_rand_augment` / `rand_augment_host_nomix`: what the official code runs,
  flip + timm's `rand-m9-mstd0.5-inc1` on each uint8 PIL image in turn
  (bicubic, ImageNet-mean fill, one process), against our host form
  without the mix (bilinear); only when timm imports (`pip install timm==1.0.12
  --no-deps`, as `vs_official.py`).

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


def _keras_rand_augment(mix):
    layers = [
        keras.layers.RandomFlip("horizontal", dtype="float32"),
        keras.layers.RandAugment(
            value_range=(0, 255), num_ops=2, factor=0.9, dtype="float32"
        ),
    ]
    return data.BatchAugmentation(layers, data.MixUpOrCutMix(**mix))


def _timm_rand_augment(image_size):
    """timm's per-image PIL RandAugment, or None without timm."""
    try:
        from PIL import Image
        from timm.data.auto_augment import rand_augment_transform
    except ImportError:
        print("timm not importable: timm_rand_augment left out")
        return None
    from timm.data import auto_augment

    def posterize(img, bits_to_keep, **_):
        # PIL 13 refuses 0 bits (magnitude 10); PIL's mask then gives
        # black, as keras_jumbo's RandAugment does.
        mask = ~(2 ** (8 - bits_to_keep) - 1) & 255
        return img.point([i & mask for i in range(256)] * 3)

    auto_augment.NAME_TO_OP["PosterizeIncreasing"] = posterize
    hparams = dict(
        translate_const=int(image_size * 0.45),
        img_mean=(124, 116, 104),
        interpolation=Image.BICUBIC,
    )
    transform = rand_augment_transform("rand-m9-mstd0.5-inc1", hparams)

    def call(images, labels, seed):
        rng = np.random.default_rng(seed)
        out = []
        for image in images.astype("uint8"):
            if rng.random() < 0.5:
                image = image[:, ::-1]
            out.append(np.asarray(transform(Image.fromarray(image))))
        return np.stack(out).astype("float32"), labels

    return call


def contenders(keras_rand_augment, image_size):
    """`{pair: (slow name, slow, fast name, fast)}`."""
    mix = dict(mixup_alpha=0.8, cutmix_alpha=1.0)
    pairs = {
        "blur": (
            "keras_blur",
            _blur_contender(
                keras.layers.RandomGaussianBlur(
                    factor=1.0, kernel_size=7, sigma=(0.1, 2.0), dtype="float32"
                )
            ),
            "blur",
            _blur_contender(
                data.RandomGaussianBlur(sigma=(0.1, 2.0), dtype="float32")
            ),
        ),
    }
    batched = dict(implementation="batched")
    for name in ("three_augment", "rand_augment"):
        make = getattr(data, name)
        pairs[name] = (
            f"{name}_eager",
            make(**mix, **batched, compiled=False),
            name,
            make(**mix, **batched, compiled=True),
        )
        pairs[f"{name}_host"] = (
            name,
            pairs[name][3],
            f"{name}_host",
            make(**mix, implementation="host"),
        )
    if keras_rand_augment:
        pairs["keras_rand_augment"] = (
            "keras_rand_augment",
            _keras_rand_augment(mix),
            "rand_augment",
            pairs["rand_augment"][3],
        )
    timm_call = _timm_rand_augment(image_size)
    if timm_call is not None:
        pairs["timm_rand_augment"] = (
            "timm_rand_augment",
            timm_call,
            "rand_augment_host_nomix",
            data.rand_augment(implementation="host"),
        )
    return pairs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-keras-rand-augment", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.batch, args.image_size, args.image_size, 3)
    images = rng.integers(0, 256, shape).astype("float32")
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, args.batch)]
    pairs = contenders(not args.no_keras_rand_augment, args.image_size)
    first, times = {}, {}
    for pair, (slow_name, slow, fast_name, fast) in pairs.items():
        for name, call in ((slow_name, slow), (fast_name, fast)):
            if name in first:
                continue
            start = time.perf_counter()
            call(images, labels, 0)
            first[name] = time.perf_counter() - start
            times[name] = []
        if slow_name.endswith("_eager"):
            a = slow(images, labels, 1)[0]
            b = fast(images, labels, 1)[0]
            diff = np.abs(a - b)
            print(
                f"{pair}: eager vs compiled, max |diff| {diff.max():.2e}, "
                f"mean {diff.mean():.2e}"
            )
    calls = {}
    for slow_name, slow, fast_name, fast in pairs.values():
        calls.update({slow_name: slow, fast_name: fast})
    order = list(calls.items())
    for index in range(args.rounds):
        for name, call in order if index % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            call(images, labels, 2 + index)
            times[name].append(time.perf_counter() - start)
    print(
        f"backend {keras.backend.backend()}, batch {args.batch}, "
        f"{args.image_size} px, {args.rounds} rounds"
    )
    print(f"{'contender':24s} {'first s':>8s} {'ms/batch':>9s}")
    for name in times:
        median = 1000 * statistics.median(times[name])
        print(f"{name:24s} {first[name]:8.1f} {median:9.1f}")
    for slow_name, _, fast_name, _ in pairs.values():
        ratio = statistics.median(
            s / f
            for s, f in zip(times[slow_name], times[fast_name], strict=True)
        )
        print(f"speed-up {fast_name} over {slow_name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
