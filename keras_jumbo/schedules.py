"""The schedules every model and recipe shares (one of each).

- `warmup_cosine`: the learning rate of every recipe (Jumbo A.2.1/A.2.2,
  DeiT): linear warm-up, then cosine decay, as Keras' `CosineDecay`
  (`WarmupCosineDecay`: the same numbers without `ops.cond`).
- `drop_path_rates`: stochastic depth per block, linear over depth (DeiT,
  timm) or constant (the official Jumbo code).
"""

import keras
from keras import ops

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate


@keras.saving.register_keras_serializable(package="keras_jumbo")
class WarmupCosineDecay(keras.optimizers.schedules.CosineDecay):
    """Keras' `CosineDecay` with a warm-up, the same values at every step,
    computed with `ops.where` instead of `ops.cond`.

    Keras' version picks the warm-up or the decay branch with `ops.cond`,
    which creates a named `Cond` operation at every call. Under
    `torch.compile` (PyTorch with `jit_compile=True`) that made the
    optimizer step recompile at every training step whenever anything
    else created a named operation between steps (`ops.pad` in the
    augmentation does), until Dynamo gave up and broke the graph there.
    Both branches are finite at every step, so selecting with `where` is
    exact. Same constructor and config as `CosineDecay`; `warmup_target`
    is required.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.warmup_target is None:
            raise ValueError(
                "`WarmupCosineDecay` needs a `warmup_target` (use Keras' "
                "`CosineDecay` without a warm-up). Received: "
                "warmup_target=None"
            )

    def __call__(self, step):
        with keras.name_scope(self.name):
            start = ops.convert_to_tensor(self.initial_learning_rate)
            dtype = start.dtype
            decay_steps = ops.cast(self.decay_steps, dtype)
            warmup_steps = ops.cast(self.warmup_steps, dtype)
            target = ops.cast(self.warmup_target, dtype)
            step = ops.minimum(
                ops.cast(step, dtype), decay_steps + warmup_steps
            )
            warming = self._warmup_function(step, warmup_steps, target, start)
            decaying = self._decay_function(
                step - warmup_steps, decay_steps, target, dtype
            )
            return ops.where(step < warmup_steps, warming, decaying)


def warmup_cosine(learning_rate, total_steps, warmup_fraction=0.1, end=0.0):
    """Linear warm-up over `warmup_fraction` of `total_steps` to
    `learning_rate`, then cosine decay to `end`.

    Example:
    >>> schedule = warmup_cosine(1e-3, total_steps=1000, end=1e-8)
    >>> round(float(schedule(100)), 6)
    0.001
    """
    check_positive_int("total_steps", total_steps)
    if not learning_rate > 0:
        raise ValueError(
            f"`learning_rate` must be > 0. Received: {learning_rate!r}"
        )
    if not 0.0 <= warmup_fraction < 1.0:
        raise ValueError(
            "`warmup_fraction` must be in [0, 1). "
            f"Received: warmup_fraction={warmup_fraction!r}"
        )
    warmup = max(1, int(round(warmup_fraction * total_steps)))
    return WarmupCosineDecay(
        0.0,
        decay_steps=max(1, total_steps - warmup),
        alpha=end / learning_rate,
        warmup_target=learning_rate,
        warmup_steps=warmup,
    )


def drop_path_rates(drop_path_rate, depth, schedule="linear"):
    """Stochastic-depth rate of each of `depth` blocks.

    `"linear"`: 0 for the first block up to `drop_path_rate` for the last
    (DeiT, timm); `"constant"`: `drop_path_rate` everywhere (the official
    Jumbo code).

    Example:
    >>> drop_path_rates(0.1, 3)
    [0.0, 0.05, 0.1]
    """
    check_rate("drop_path_rate", drop_path_rate)
    check_positive_int("depth", depth)
    check_choice("schedule", schedule, {"linear", "constant"})
    if schedule == "constant" or depth == 1:
        return [float(drop_path_rate)] * depth
    return [drop_path_rate * i / (depth - 1) for i in range(depth)]
