"""Eager PyTorch inference: the FFN's exact GELU inside oneDNN's matmul.

Why `keras_jumbo._torch_kernels.linear_gelu` applies the GELU as oneDNN's
post-op (issue #15): in one process, on one model with the same weights
and batch, it alternates `predict_on_batch` steps with the post-op and
with the two ops it replaces (`exact_gelu(linear(...))`, swapped in
where the layers call it, `layers._utils.linear_gelu`: every `MLP` and
the Non-Deep ViT's branch FFNs), every weight randomised (no zero
head), and prints the largest difference of the outputs, the median
milliseconds of each and the median of the per-step ratios two ops /
post-op (above 1: the post-op is faster).

    python benchmarks/torch_gelu_post_op.py [--model official_jumbo_pico]
        [--image-size 128] [--batch 64] [--rounds 30] [--threads N]

`--model` is `official_jumbo_<size>` (`convert.official_jumbo_model`,
the model of `vs_official.py`) or a name `throughput.py` builds
(`non_deep_vit_6x2`, `jumbo_vit_nano`, `vit_res_tiny`, ...; time-series
models take their registered input and ignore `--image-size`).
"""

import argparse
import os
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import throughput  # noqa: E402
import torch  # noqa: E402

from keras_jumbo import _torch_kernels  # noqa: E402
from keras_jumbo import convert  # noqa: E402
from keras_jumbo.layers import _utils  # noqa: E402
from keras_jumbo.testing import randomize_weights  # noqa: E402


def _two_ops(x, kernel, bias=None):
    return _torch_kernels.exact_gelu(_torch_kernels.linear(x, kernel, bias))


VARIANTS = {"post_op": _torch_kernels.linear_gelu, "two_ops": _two_ops}


def build(name, image_size):
    """The model `--model` names, at `image_size` where it takes images."""
    prefix = "official_jumbo_"
    if name.startswith(prefix):
        return convert.official_jumbo_model(
            name[len(prefix) :], image_size=image_size
        )
    return throughput.build_model(name, image_size)[0]


def run(args):
    """`(largest |difference|, largest |output|, {variant: [ms per
    step]})`."""
    torch.set_num_threads(args.threads)
    model = randomize_weights(build(args.model, args.image_size))
    shape = (args.batch,) + tuple(model.input_shape[1:])
    x = np.random.default_rng(0).normal(size=shape).astype("float32")
    outputs = {}
    for name, function in VARIANTS.items():  # warm both paths up
        _utils.linear_gelu = function
        model.predict_on_batch(x)
        outputs[name] = np.asarray(model.predict_on_batch(x))
    difference = float(np.abs(outputs["post_op"] - outputs["two_ops"]).max())
    largest = float(np.abs(outputs["two_ops"]).max())
    times = {name: [] for name in VARIANTS}
    try:
        for index in range(args.rounds):
            order = list(VARIANTS) if index % 2 == 0 else list(VARIANTS)[::-1]
            for name in order:
                _utils.linear_gelu = VARIANTS[name]
                start = time.perf_counter()
                model.predict_on_batch(x)
                times[name].append((time.perf_counter() - start) * 1e3)
    finally:
        _utils.linear_gelu = VARIANTS["post_op"]
    return difference, largest, times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="official_jumbo_pico")
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args(argv)
    for name in ("image_size", "batch", "rounds", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    difference, largest, times = run(args)
    post_op, two_ops = times["post_op"], times["two_ops"]
    pairs = zip(two_ops, post_op, strict=True)
    ratio = statistics.median(a / b for a, b in pairs)
    print(
        f"{args.model}, {args.image_size} px, batch {args.batch}, eager "
        f"PyTorch predict_on_batch, {args.threads} threads, {args.rounds} "
        "alternated rounds (medians)"
    )
    print(
        f"largest |difference| of the outputs: {difference:.3g} (largest "
        f"|output| {largest:.3g}; every weight randomised)"
    )
    print("| post-op (ms) | two ops (ms) | two ops / post-op, per step |")
    print("|---|---|---|")
    print(
        f"| {statistics.median(post_op):.1f} | "
        f"{statistics.median(two_ops):.1f} | {ratio:.3f} |"
    )


if __name__ == "__main__":
    main()
