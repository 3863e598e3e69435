"""The written-out gradients (`keras_jumbo.layers.closed_form`) against
Keras' own layers and ops: same values, same gradients."""

import keras
import numpy as np
import pytest

from keras_jumbo.layers import LayerNormalization
from keras_jumbo.layers import closed_form_layer_norm
from keras_jumbo.layers.closed_form import softmax
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers.reference import assert_same_sgd_step
from tests.layers.reference import weights_after_one_sgd_step


def test_layer_norm_harness():
    run_layer_test(
        LayerNormalization,
        {"epsilon": 1e-6},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=2,
    )


def _pair(epsilon=1e-6, **kwargs):
    ours = LayerNormalization(epsilon=epsilon, **kwargs)
    stock = keras.layers.LayerNormalization(epsilon=epsilon, **kwargs)
    ours.build((None, 7, 12))
    randomize_weights(ours, seed=3)
    stock.build((None, 7, 12))
    stock.set_weights(ours.get_weights())
    return ours, stock


@pytest.mark.parametrize(
    "kwargs", [{}, {"center": False}, {"rms_scaling": True}]
)
def test_forward_equals_keras_layer_norm(rng, kwargs):
    ours, stock = _pair(**kwargs)
    x = rng.normal(2.0, 3.0, size=(4, 7, 12)).astype("float32")
    assert_allclose(ours(x), stock(x), atol=1e-5, rtol=1e-5)
    # The written-out function on its own, against the formula.
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    gamma, beta = (np.asarray(w) for w in _pair()[0].get_weights())
    want = (x - mean) / np.sqrt(var + 1e-6) * gamma + beta
    if keras.backend.backend() in ("jax", "tensorflow"):
        got = closed_form_layer_norm(x, gamma, beta, 1e-6)
        assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_gradients_equal_keras_layer_norm(rng):
    ours, stock = _pair()
    x = rng.normal(size=(4, 7, 12)).astype("float32")
    target = rng.normal(size=(4, 7, 12)).astype("float32")
    assert_same_sgd_step(ours, stock, x, target)


def test_library_blocks_use_it():
    from keras_jumbo.layers import ParallelBranchBlock
    from keras_jumbo.layers import ViTBlock

    for block in (ViTBlock(2, 16), ParallelBranchBlock(2, 16, num_branches=2)):
        block.build((None, 5, 8))
        assert isinstance(block.norm1, LayerNormalization)


class _Softmax(keras.layers.Layer):
    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def call(self, x):
        return self.fn(x, axis=-1)


def test_softmax_values_and_gradients_equal_keras(rng):
    x = rng.normal(0.0, 4.0, size=(3, 2, 5, 7)).astype("float32")
    got = softmax(x, axis=-1)
    assert_allclose(got, keras.ops.softmax(x, axis=-1), atol=1e-6, rtol=1e-5)
    assert_allclose(keras.ops.sum(got, axis=-1), np.ones((3, 2, 5)), 1e-6)
    target = rng.normal(size=(4, 7, 12)).astype("float32")
    x = rng.normal(size=(4, 7, 12)).astype("float32")
    ours = weights_after_one_sgd_step(_Softmax(softmax), x, target)
    stock = weights_after_one_sgd_step(_Softmax(keras.ops.softmax), x, target)
    for g, w in zip(ours, stock, strict=True):
        assert_allclose(g, w, atol=1e-6, rtol=1e-5)
    start = np.random.default_rng(5).normal(size=(12, 12))
    assert np.abs(ours[0] - start).max() > 1e-4  # the kernel moved
