import keras

from keras_jumbo._keras_internals import find_layers
from keras_jumbo.layers import TokenDropping
from keras_jumbo.layers._utils import check_rate


def token_dropping_layers(model):
    """Every `TokenDropping` layer inside `model` (nested models too)."""
    return find_layers(model, TokenDropping)


def set_token_drop_rate(model, rate):
    """Set the drop rate of every `TokenDropping` layer of `model`.

    Returns True when a layer's kept-token count changed, i.e. compiled
    train functions must be traced again.
    """
    changed = False
    for layer in token_dropping_layers(model):
        changed = layer.set_rate(rate) or changed
    return changed


class TokenDropSchedule(keras.callbacks.Callback):
    """Linearly change the token drop rate over training.

    At each train step t of T (T = epochs x steps per epoch, or
    `total_steps`), every `TokenDropping` layer of the model gets
    `rate = start + (end - start) * t / (T - 1)`. The Jumbo paper (§4.2,
    A.2.1) trains ImageNet-21K from 90% down to 10%:
    `TokenDropSchedule(0.9, 0.1)`. The step count starts from the
    optimizer's `iterations`, so a run resumed by
    `keras.callbacks.BackupAndRestore` continues the schedule.

    Compiled train steps fix tensor shapes when traced, so when the number
    of kept tokens changes the callback asks the model to trace its train
    function again (at most once per distinct kept count: with N patches
    at most N retraces over the whole run, none for PyTorch eager).

    Args:
        start: float in [0, 1), the rate at the first step.
        end: float in [0, 1), the rate at the last step.
        total_steps: int or None; None derives it from `fit`'s epochs and
            steps per epoch.

    Example (`ds` a dataset):
    ```python
    model = JumboViT("nano", token_drop_rate=0.9)
    model.fit(ds, epochs=50, callbacks=[TokenDropSchedule(0.9, 0.1)])
    ```
    """

    def __init__(self, start=0.9, end=0.1, total_steps=None):
        super().__init__()
        self.start = check_rate("start", start)
        self.end = check_rate("end", end)
        if total_steps is not None and (
            isinstance(total_steps, bool)
            or not isinstance(total_steps, int)
            or total_steps < 1
        ):
            raise ValueError(
                "`total_steps` must be a positive int or None. "
                f"Received: total_steps={total_steps!r}"
            )
        self.total_steps = total_steps
        self._step = 0
        self.rate = self.start

    def rate_at(self, step, total_steps):
        """The scheduled rate at 0-based `step` of `total_steps`."""
        if total_steps <= 1:
            return self.start
        fraction = min(max(step / (total_steps - 1), 0.0), 1.0)
        return self.start + (self.end - self.start) * fraction

    def _total(self):
        if self.total_steps is not None:
            return self.total_steps
        steps = self.params.get("steps")
        epochs = self.params.get("epochs", 1)
        if not steps:
            raise ValueError(
                "TokenDropSchedule needs the number of steps: pass "
                "`total_steps=` or `steps_per_epoch=` to fit. "
                f"Received: params={self.params}"
            )
        return steps * epochs

    def on_train_begin(self, logs=None):
        # Continue from the optimizer's step count: a run resumed by
        # `keras.callbacks.BackupAndRestore` picks the schedule up there.
        iterations = getattr(self.model.optimizer, "iterations", None)
        self._step = 0 if iterations is None else int(iterations.numpy())
        self._apply(self.rate_at(self._step, self._total()))

    def on_train_batch_begin(self, batch, logs=None):
        self._apply(self.rate_at(self._step, self._total()))

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["token_drop_rate"] = self.rate

    def _apply(self, rate):
        self.rate = rate
        if set_token_drop_rate(self.model, rate):
            # Shapes changed: trace the train step again.
            self.model.make_train_function(force=True)
