"""TensorFlow's training attention, both forms, in one process (ratios).

On TensorFlow a plain `MultiHeadSelfAttention` call in training (no head
mask, residual or returned scores, or active attention dropout) runs as
one q/k/v matmul and `ops.dot_product_attention`
(`attention.FUSED_TRAINING_BACKENDS`; setting `library`) instead of the
heads-first einsums (setting `einsum`), as on PyTorch. For each model,
one instance per setting (same random weights) is compiled with that
setting, with XLA (`jit_compile=True`, the recipes' setting) unless
`--no-xla` (Keras' default on a CPU); then their `train_on_batch` steps
(AdamW, cross-entropy or MSE) are timed in interleaved rounds, as in
`jax_inference_paths.py`. Prints ms per step, the ratio over `einsum`
and the difference of the first step's loss.

    KERAS_BACKEND=tensorflow python benchmarks/tf_training_attention.py \\
        official_jumbo_pico:32:128 registers_vit_nano:32:128 patchtst:256
"""

import argparse
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax_inference_paths  # noqa: E402
import keras  # noqa: E402

from keras_jumbo.layers import attention  # noqa: E402

LIBRARY = attention.FUSED_TRAINING_BACKENDS


def apply(setting):
    attention.FUSED_TRAINING_BACKENDS = LIBRARY if setting == "library" else ()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "models",
        nargs="+",
        help="name:batch[:image_size], as for jax_inference_paths.py",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--no-xla",
        action="store_true",
        help="compile without XLA (Keras' default for TensorFlow on a CPU)",
    )
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        raise SystemExit("This path is TensorFlow's: KERAS_BACKEND=tensorflow.")
    for spec in args.models:
        jax_inference_paths.compare(
            *jax_inference_paths.parse_model(spec),
            args.rounds,
            ["einsum", "library"],
            "train",
            apply=apply,
            jit_compile=not args.no_xla,
        )


if __name__ == "__main__":
    main()
