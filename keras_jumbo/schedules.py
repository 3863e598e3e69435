"""The schedules every model and recipe shares (one of each).

- `warmup_cosine`: the learning rate of every recipe (Jumbo A.2.1/A.2.2,
  DeiT): linear warm-up, then cosine decay, as Keras' `CosineDecay`.
- `drop_path_rates`: stochastic depth per block, linear over depth (DeiT,
  timm) or constant (the official Jumbo code).
"""

import keras

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate


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
    return keras.optimizers.schedules.CosineDecay(
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
