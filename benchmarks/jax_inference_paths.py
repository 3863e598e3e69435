"""The JAX inference paths, each on and off, in one process (ratios).

On JAX, three layers take another form at inference, and the models'
steps are compiled with XLA options (issue #15); `scores` and `short`
apply to the training step too (`--step train`):

- `head`: `MultiHeadSelfAttention` head by head on column slices of one
  q/k/v matmul (`attention.PER_HEAD_INFERENCE_BACKENDS`);
- `patch`: `PatchEmbedding` as one matmul over the gathered patches
  instead of the stride-P convolution
  (`patch_embedding.MATMUL_INFERENCE_BACKENDS`);
- `halves`: `TransformerEncoder` running its blocks on two halves of a
  large batch (`_micro_batch.MICRO_BATCH_INFERENCE_BACKENDS`);
- `slices`: with `halves`, a batch whose halves would hold more than
  `_micro_batch.MAX_MICRO_BATCH_ELEMENTS` numbers cut into more
  slices, run a pair at a time in a loop (off: two halves at most, as
  every setting from `all+slices` on has it);
- `maps`: with `slices`, PatchTST's encoder counting the attention maps
  its blocks pass on in the numbers a slice holds
  (`TransformerEncoder._numbers_per_sample`; off: tokens x width alone);
- `scores`: `MultiHeadSelfAttention` calls that return or add scores
  (PatchTST's blocks) as one q/k/v matmul with heads-first transposes
  (`attention.FUSED_SCORES_BACKENDS`; off: the heads-first einsums);
- `short`: a plain `MultiHeadSelfAttention` call with heads of width 8
  or less over a short sequence (PatchTST's classifier at 8 patches) as
  one q/k/v matmul and `ops.dot_product_attention`, in training and at
  inference (`attention.SHORT_NARROW_FUSED_BACKENDS`; off: the einsums in
  training, `head` at inference);
- `options`: the automatic `keras_jumbo.runtime.jax_compiler_options()`
  (512-bit vectors in XLA's element-wise code on AMD CPUs with AVX-512)
  instead of none (`set_jax_compiler_options({})`).

For each model, one instance per setting (same random weights) is
compiled with that setting; then their `predict_on_batch` (or, with
`--step train`, `train_on_batch`: AdamW, cross-entropy or MSE) steps are timed
in interleaved rounds (the median of 5 steps per round, the median over
rounds), so slow phases of the machine hit every setting alike. Prints ms
per step, each setting's speed-up over all paths off, and the largest
output difference from it.

    KERAS_BACKEND=jax python benchmarks/jax_inference_paths.py \\
        official_jumbo_pico:64:128 vit_tiny:32:224 patchtst_forecaster:32
    KERAS_BACKEND=jax python benchmarks/jax_inference_paths.py \
        patchtst_forecaster:64 --step train --settings all+maps library
    KERAS_BACKEND=jax python benchmarks/jax_inference_paths.py \
        patchtst:256 patchtst_jumbo:256 --step train \
        --settings all+scores library
"""

import argparse
import math
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import profile_train_step  # noqa: E402
import throughput  # noqa: E402

from keras_jumbo import optimizers  # noqa: E402
from keras_jumbo import runtime  # noqa: E402
from keras_jumbo.layers import _micro_batch  # noqa: E402
from keras_jumbo.layers import attention  # noqa: E402
from keras_jumbo.layers import patch_embedding  # noqa: E402
from keras_jumbo.layers.transformer_encoder import TransformerEncoder  # noqa: E402
from keras_jumbo.testing import randomize_weights  # noqa: E402

PATHS = {
    "head": (attention, "PER_HEAD_INFERENCE_BACKENDS"),
    "patch": (patch_embedding, "MATMUL_INFERENCE_BACKENDS"),
    "halves": (_micro_batch, "MICRO_BATCH_INFERENCE_BACKENDS"),
    "scores": (attention, "FUSED_SCORES_BACKENDS"),
    "short": (attention, "SHORT_NARROW_FUSED_BACKENDS"),
}
# The library's slice size, restored by `set_paths` (off: math.inf).
MAX_SLICE_ELEMENTS = _micro_batch.MAX_MICRO_BATCH_ELEMENTS
# The library's count of a sample's numbers (off: the default count).
NUMBERS_PER_SAMPLE = TransformerEncoder._numbers_per_sample
SETTINGS = {
    "none": (),
    "head": ("head",),
    "head+patch": ("head", "patch"),
    "head+halves": ("head", "halves"),
    "all": ("head", "patch", "halves"),
    "all+options": ("head", "patch", "halves", "options"),
    "all+slices": ("head", "patch", "halves", "options", "slices"),
    "all+maps": ("head", "patch", "halves", "options", "slices", "maps"),
}
SETTINGS["all+scores"] = SETTINGS["all+maps"] + ("scores",)
SETTINGS["library"] = SETTINGS["all+scores"] + ("short",)
# Every path on, XLA's default compiler options: what the automatic
# options change in the library's steps.
SETTINGS["library-options"] = tuple(
    path for path in SETTINGS["library"] if path != "options"
)


def build(name, image_size):
    """A named setting of `profile_train_step.py` (the official pico
    architecture, ...) or a model of `throughput.py` (`name:plain`, time
    series)."""
    if name in profile_train_step.MODELS:
        return profile_train_step.build(name, image_size, 1000)
    return throughput.build_model(name, image_size)[0]


def parse_model(spec):
    """`name:batch[:image_size]` -> (name, batch, image_size or 224)."""
    name, batch, *size = spec.split(":")
    return name, int(batch), int(size[0]) if size else 224


def set_paths(on):
    for path, (module, constant) in PATHS.items():
        setattr(module, constant, ("jax",) if path in on else ())
    _micro_batch.MAX_MICRO_BATCH_ELEMENTS = (
        MAX_SLICE_ELEMENTS if "slices" in on else math.inf
    )
    runtime.set_jax_compiler_options(None if "options" in on else {})
    TransformerEncoder._numbers_per_sample = (
        NUMBERS_PER_SAMPLE if "maps" in on else lambda self, shape: None
    )


def compare(
    name,
    batch,
    image_size,
    rounds,
    settings,
    step="predict",
    apply=None,
    jit_compile="auto",
):
    """Time `name`'s steps with each of `settings` (one instance each,
    interleaved rounds) and print the ratios. `apply(setting)` switches
    the library to a setting before its instance compiles (default: this
    script's `SETTINGS`); `jit_compile` goes to `model.compile` for
    training (TensorFlow: `tf_training_attention.py`)."""
    apply = apply or (lambda setting: set_paths(SETTINGS[setting]))
    instances = {}
    for setting in settings:
        # The same random weights in every instance (norm scales around 1,
        # positive variances): no identity-like layer; the same dropout
        # seeds (training).
        keras.utils.set_random_seed(0)
        instances[setting] = randomize_weights(build(name, image_size))
    rng = np.random.default_rng(0)
    x, y, loss = throughput._inputs(instances[settings[0]], batch, rng)
    outputs, steps_of = {}, {}
    for setting, model in instances.items():
        # The first call compiles the step with these paths.
        apply(setting)
        if step == "train":
            model.compile(
                optimizer=optimizers.AdamW(1e-4),
                loss=loss,
                jit_compile=jit_compile,
            )
            steps_of[setting] = lambda m=model: m.train_on_batch(x, y)
        else:
            steps_of[setting] = lambda m=model: m.predict_on_batch(x)
        outputs[setting] = np.asarray(steps_of[setting]())
    apply(settings[-1])
    times = {setting: [] for setting in settings}
    for round_index in range(rounds):
        order = settings if round_index % 2 == 0 else settings[::-1]
        for setting in order:
            steps = []
            for _ in range(5):
                start = time.perf_counter()
                steps_of[setting]()
                steps.append(time.perf_counter() - start)
            times[setting].append(statistics.median(steps) * 1e3)
    base = statistics.median(times[settings[0]])
    cells = []
    for setting in settings:
        ms = statistics.median(times[setting])
        diff = np.nanmax(np.abs(outputs[setting] - outputs[settings[0]]))
        cells.append(f"{setting} {ms:.1f} ms x{base / ms:.3f} (d {diff:.0e})")
    print(f"{name}, {step}, batch {batch}, {image_size} px: ", end="")
    print("; ".join(cells))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "models",
        nargs="+",
        help="name:batch[:image_size]; a named setting of "
        "profile_train_step.py (official_jumbo_pico: vs_official.py's "
        "model) or any model of throughput.py",
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--settings",
        nargs="+",
        default=list(SETTINGS),
        choices=list(SETTINGS),
        help="the first is the baseline of the ratios",
    )
    parser.add_argument(
        "--step",
        choices=("predict", "train"),
        default="predict",
        help="train: `train_on_batch` (the first step's loss is compared)",
    )
    args = parser.parse_args(argv)
    if keras.backend.backend() != "jax":
        raise SystemExit("These paths are JAX's: KERAS_BACKEND=jax.")
    for spec in args.models:
        compare(
            *parse_model(spec),
            args.rounds,
            args.settings,
            args.step,
        )


if __name__ == "__main__":
    main()
