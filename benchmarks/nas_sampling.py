"""Cost of multi-architectural sampling (ViT-ResNAS §2.3).

A super-network step that trains N_a different sub-networks (one per
sub-batch, through per-example channel masks) should cost about the same as
a step that trains one sub-network on the whole batch: the shapes are the
same, only the masks differ. This prints the measured step times and their
ratio in one run (the paper picks N_a = 16).

Command (2 CPU cores, about 3 minutes with the defaults):
    KERAS_BACKEND=jax python benchmarks/nas_sampling.py
    # the paper's Tiny space at 224 px (GPU):
    python benchmarks/nas_sampling.py --space tiny --image-size 224 --batch 128

Measured 2026-11-22 (2 CPU cores, JAX, defaults, other jobs running):
7.00 s for one sub-network, 6.43 s for 16, ratio 0.92.
"""

import argparse
import time

import keras
import numpy as np

from keras_jumbo import nas


def step_time(model, images, labels, codes, steps):
    inputs = {"images": images, "architecture": codes}
    model.train_on_batch(inputs, labels)  # compile
    model.train_on_batch(inputs, labels)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model.train_on_batch(inputs, labels)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--image-size", type=int, default=112)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--num-architectures", type=int, default=16)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    space = nas.SearchSpace.preset(args.space)
    model = nas.build_supernet(
        space, num_classes=1000, image_size=args.image_size
    )
    model.compile(
        optimizer="adamw",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    images = rng.normal(size=(args.batch, args.image_size, args.image_size, 3))
    images = images.astype("float32")
    labels = rng.integers(0, 1000, size=args.batch)
    single = nas.architecture_codes(space, [space.sample(rng)], args.batch)
    multi = nas.architecture_codes(
        space,
        [space.sample(rng) for _ in range(args.num_architectures)],
        args.batch,
    )
    one = step_time(model, images, labels, single, args.steps)
    many = step_time(model, images, labels, multi, args.steps)
    print(
        f"backend {keras.backend.backend()}, space {args.space}, "
        f"{args.image_size} px, batch {args.batch}"
    )
    print(f"step, 1 sub-network:              {one * 1e3:8.1f} ms")
    print(
        f"step, {args.num_architectures} sub-networks (N_a):      "
        f"{many * 1e3:8.1f} ms"
    )
    print(f"ratio N_a={args.num_architectures} / N_a=1: {many / one:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
