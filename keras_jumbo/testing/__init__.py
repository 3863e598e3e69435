"""Test harness shared by every layer and model (keras.src is private).

`run_layer_test` and `run_model_test` are what keras_jumbo's own tests use;
they need only `keras` and `numpy`, so users can check their own layers
and models the same way.
"""

from keras_jumbo.testing.harness import assert_allclose
from keras_jumbo.testing.harness import randomize_weights
from keras_jumbo.testing.harness import run_layer_test
from keras_jumbo.testing.harness import run_model_test
from keras_jumbo.testing.harness import trainable_weight_changes

__all__ = [
    "assert_allclose",
    "randomize_weights",
    "run_layer_test",
    "run_model_test",
    "trainable_weight_changes",
]
