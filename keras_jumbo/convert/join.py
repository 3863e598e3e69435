"""Reading and setting the joining weight λ of a branchy model."""

from keras_jumbo._keras_internals import find_layers
from keras_jumbo._keras_internals import sync_state
from keras_jumbo.layers.progressive_join import ProgressiveJoin


def join_layers(model):
    """Every `ProgressiveJoin` layer inside `model`."""
    return find_layers(model, ProgressiveJoin)


def set_join_lambda(model, value):
    """Set λ of every `ProgressiveJoin` in `model` (what `JoinSchedule` calls).

    Safe inside `fit` on every backend: on JAX the trainer's state is synced
    to the variables first, so the new λ is read by the next step.
    """
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"λ must be in [0, 1]. Received: value={value}")
    sync_state(model)
    for layer in join_layers(model):
        layer.join_lambda.assign(value)


def get_join_lambda(model):
    """The λ values of the model's join layers (a list, one per layer)."""
    sync_state(model)
    return [float(layer.join_lambda.numpy()) for layer in join_layers(model)]
