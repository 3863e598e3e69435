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
    layers = _require_join_layers(model)
    sync_state(model)
    for layer in layers:
        layer.join_lambda.assign(value)


def _require_join_layers(model):
    layers = join_layers(model)
    if not layers:
        raise ValueError(
            "The model has no ProgressiveJoin layer, so there is no λ to "
            "set (a NonDeepViT with num_branches >= 2 has one per block). "
            f"Received: model {getattr(model, 'name', model)!r} of type "
            f"{type(model).__name__}"
        )
    return layers


def get_join_lambda(model):
    """The λ values of the model's join layers (a list, one per layer)."""
    layers = _require_join_layers(model)
    sync_state(model)
    return [float(layer.join_lambda.numpy()) for layer in layers]
