import math

import keras

from keras_jumbo.convert.join import set_join_lambda
from keras_jumbo.layers._utils import check_choice

SCHEDULES = {
    # Non-Deep ViT Appendix B.2, eq. 10-13; t in [0, 1] over the warmup.
    "linear": lambda t: t,
    "cosine": lambda t: 0.5 * (1.0 - math.cos(math.pi * t)),
    "exponential": lambda t: 1.0 - math.exp(-5.0 * t),
    "sqrt": math.sqrt,
    # Ablations (Table 5): join at once, or never.
    "instant": lambda t: 1.0,
    "none": lambda t: 0.0,
}


def join_lambda_at(schedule, step, warmup_steps):
    """λ after `step` training steps: the schedule over the warmup, then 1.

    Note: the exponential schedule ends the warmup at 1 - e^-5 ≈ 0.993 and
    then steps to 1 for the adjustment phase, as the paper's Fig. 3 shows.
    """
    check_choice("schedule", schedule, set(SCHEDULES))
    if schedule in ("instant", "none"):
        return SCHEDULES[schedule](0.0)
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return float(SCHEDULES[schedule](max(step, 0) / warmup_steps))


class JoinSchedule(keras.callbacks.Callback):
    """Drive the joining weight λ of a branchy model step by step.

    λ follows `schedule` over `warmup_steps` training steps (the Lambda
    Warmup Period), then stays at 1 (the Post-Joining Adjustment Phase);
    Non-Deep ViT §3.4 and Appendix B: 10k warmup steps, linear, by default.
    The step count starts from the optimizer's `iterations`, so a resumed
    run (`keras.callbacks.BackupAndRestore`) continues the schedule.

    Args:
        schedule: `"linear"`, `"cosine"`, `"exponential"` (1 - e^{-5t}),
            `"sqrt"`, or the ablations `"instant"` (λ=1 from the start) and
            `"none"` (λ=0 throughout).
        warmup_steps: int >= 0, length of the warmup in steps.
        update_every: int >= 1, set λ every this many steps (1 = each step).

    Example (`model` a `NonDeepViT`, `ds` a dataset):
    ```python
    model.fit(ds, epochs=30, callbacks=[JoinSchedule("linear", 10_000)])
    ```
    """

    def __init__(self, schedule="linear", warmup_steps=10_000, update_every=1):
        super().__init__()
        self.schedule = check_choice("schedule", schedule, set(SCHEDULES))
        for name, value, low in (
            ("warmup_steps", warmup_steps, 0),
            ("update_every", update_every, 1),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or (value < low)
            ):
                raise ValueError(
                    f"`{name}` must be an int >= {low}. "
                    f"Received: {name}={value!r}"
                )
        self.warmup_steps = warmup_steps
        self.update_every = update_every
        self.join_lambda = None
        self._step = 0

    def on_train_begin(self, logs=None):
        iterations = getattr(self.model.optimizer, "iterations", None)
        self._step = 0 if iterations is None else int(iterations.numpy())
        self._apply(force=True)

    def on_train_batch_begin(self, batch, logs=None):
        if self._step % self.update_every == 0:
            self._apply()

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["join_lambda"] = self.join_lambda

    def _apply(self, force=False):
        value = join_lambda_at(self.schedule, self._step, self.warmup_steps)
        if force or value != self.join_lambda:
            set_join_lambda(self.model, value)
            self.join_lambda = value
