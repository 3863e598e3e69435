"""Eager PyTorch: the shared Jumbo FFN's kernel gradients summed once.

Why `TransformerEncoder` runs its blocks through `keras_jumbo._torch_kernels.
summed_gradients` over its shared Jumbo FFN (issue #15): in one process,
on one model with the same weights and batch, it interleaves rounds of
eager training steps with the summation and without it (the encoder's
blocks called directly), and prints per variant the median
milliseconds of a `train_on_batch` step (AdamW), of the forward pass to
the loss and of `loss.backward()` alone, then the ratio without / with
(above 1: the summation is faster) of each.

    python benchmarks/torch_shared_gradients.py [--size pico]
        [--image-size 128] [--batch 32] [--rounds 8] [--steps 5]

The default model is the official Jumbo architecture
(`convert.official_jumbo_model`, whose blocks share one Jumbo FFN), the
model of `vs_official.py`.
"""

import argparse
import os
import statistics
import time

os.environ["KERAS_BACKEND"] = "torch"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from keras_jumbo import _torch_kernels  # noqa: E402
from keras_jumbo import convert  # noqa: E402
from keras_jumbo import optimizers  # noqa: E402
from keras_jumbo.layers import transformer_encoder  # noqa: E402

VARIANTS = {
    "summed": _torch_kernels.summed_gradients,
    "per_use": lambda variables, function: function(),
}


def _time(function, steps):
    start = time.perf_counter()
    for _ in range(steps):
        function()
    return (time.perf_counter() - start) / steps * 1e3


def run(args):
    torch.set_num_threads(args.threads)
    model = convert.official_jumbo_model(
        args.size, image_size=args.image_size, num_classes=args.num_classes
    )
    model.compile(
        optimizer=optimizers.AdamW(1e-3, weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=False,
    )
    rng = np.random.default_rng(0)
    size = args.image_size
    x = keras.ops.convert_to_tensor(
        rng.normal(size=(args.batch, size, size, 3)).astype("float32")
    )
    y = keras.ops.convert_to_tensor(
        rng.integers(0, args.num_classes, args.batch)
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    phase = {}

    def forward_backward():
        for variable in model.trainable_variables:
            variable.value.grad = None
        start = time.perf_counter()
        loss = loss_fn(model(x, training=True), y)
        middle = time.perf_counter()
        loss.backward()
        phase["forward"] += middle - start
        phase["backward"] += time.perf_counter() - middle

    times = {
        name: {"step": [], "forward": [], "backward": []} for name in VARIANTS
    }
    for context in VARIANTS.values():  # warm both paths up
        transformer_encoder.summed_gradients = context
        for _ in range(2):
            model.train_on_batch(x, y)
    for index in range(args.rounds):
        order = list(VARIANTS) if index % 2 == 0 else list(VARIANTS)[::-1]
        for name in order:
            transformer_encoder.summed_gradients = VARIANTS[name]
            model.train_on_batch(x, y)
            times[name]["step"].append(
                _time(lambda: model.train_on_batch(x, y), args.steps)
            )
            phase.update(forward=0.0, backward=0.0)
            _time(forward_backward, args.steps)
            for key in ("forward", "backward"):
                times[name][key].append(phase[key] / args.steps * 1e3)
    transformer_encoder.summed_gradients = VARIANTS["summed"]
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="pico")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    for name in ("image_size", "num_classes", "batch", "rounds", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    times = run(args)
    print(
        f"official Jumbo {args.size}, {args.image_size} px, batch "
        f"{args.batch}, eager PyTorch, {args.threads} threads, "
        f"{args.rounds} interleaved rounds of {args.steps} steps (medians)"
    )
    print("| measure | summed (ms) | per use (ms) | per use / summed |")
    print("|---|---|---|---|")
    for key in ("step", "forward", "backward"):
        summed = statistics.median(times["summed"][key])
        per_use = statistics.median(times["per_use"][key])
        print(
            f"| {key} | {summed:.1f} | {per_use:.1f} | {per_use / summed:.3f} |"
        )


if __name__ == "__main__":
    main()
