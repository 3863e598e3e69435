"""`keras_jumbo.layers.BatchNormalization` against Keras' layer: the same
outputs, gradients and moving statistics (on PyTorch through
`F.batch_norm`, elsewhere Keras' own code)."""

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo._keras_internals import sublayers
from keras_jumbo._torch_kernels import batch_norm_applies
from keras_jumbo.layers import BatchNormalization
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers.reference import assert_same_sgd_step

TORCH = keras.backend.backend() == "torch"


@pytest.mark.parametrize(
    "kwargs, input_shape",
    [({}, (2, 5, 8)), ({"axis": 1, "momentum": 0.9}, (2, 3, 4, 4))],
)
def test_batch_norm_harness(kwargs, input_shape):
    run_layer_test(
        BatchNormalization,
        kwargs,
        input_shape=input_shape,
        expected_output_shape=input_shape,
        expected_num_trainable_weights=2,
        expected_num_non_trainable_weights=2,
    )


def _pair(shape, **kwargs):
    """Ours and Keras' layer, built for `shape`, with the same randomised
    gamma, beta and moving statistics (moving variance positive)."""
    ours = BatchNormalization(momentum=0.9, epsilon=1e-5, **kwargs)
    stock = keras.layers.BatchNormalization(
        momentum=0.9, epsilon=1e-5, **kwargs
    )
    ours.build(shape)
    randomize_weights(ours, seed=3)
    ours.moving_variance.assign(np.abs(ours.moving_variance.numpy()) + 0.5)
    stock.build(shape)
    stock.set_weights(ours.get_weights())
    return ours, stock


CASES = [
    ({}, (6, 7, 12)),  # PatchTST's norms: (batch, tokens, width)
    ({"axis": 1}, (4, 12, 5, 3)),  # channels first
    ({}, (9, 12)),
    ({"axis": 2}, (4, 3, 12, 2)),  # a middle axis: Keras' code
    ({"center": False}, (6, 7, 12)),
    ({"scale": False}, (6, 7, 12)),
]


@pytest.mark.parametrize("kwargs, shape", CASES)
def test_training_step_equals_keras(rng, kwargs, shape):
    """Training: the same weights after one step (input gradient, gamma,
    beta, moving statistics); then inference with the moving statistics:
    the same outputs."""
    ours, stock = _pair(shape, **kwargs)
    x = rng.normal(1.5, 2.0, size=shape).astype("float32")
    target = rng.normal(size=shape).astype("float32")
    got = assert_same_sgd_step(ours, stock, x, target)
    # Inference uses the moving statistics.
    assert_allclose(ours(x), stock(x), atol=1e-5, rtol=1e-5)
    axis = kwargs.get("axis", -1)
    channels = [1] * len(shape)
    channels[axis] = -1
    mean, variance = (w.reshape(channels) for w in got[-2:])
    gamma = got[2].reshape(channels) if ours.scale else 1.0
    beta = got[2 + ours.scale].reshape(channels) if ours.center else 0.0
    want = (x - mean) / np.sqrt(variance + 1e-5) * gamma + beta
    assert_allclose(ours(x), want, atol=1e-5, rtol=1e-5)


def test_training_call_uses_the_batch_statistics(rng):
    """The formula: training output `(x - mean) / sqrt(var + eps) * gamma
    + beta` with the batch's mean and biased variance over every axis but
    the last; moving statistics `m * momentum + batch * (1 - momentum)`."""
    ours, _ = _pair((6, 7, 12))
    moving = [np.asarray(w) for w in ours.get_weights()[2:]]
    gamma, beta = (np.asarray(w) for w in ours.get_weights()[:2])
    x = rng.normal(-1.0, 3.0, size=(6, 7, 12)).astype("float32")
    mean, variance = x.mean((0, 1)), x.var((0, 1))
    want = (x - mean) / np.sqrt(variance + 1e-5) * gamma + beta
    assert_allclose(ours(x, training=True), want, atol=1e-5, rtol=1e-5)
    for got, old, batch in zip(
        ours.get_weights()[2:], moving, (mean, variance), strict=True
    ):
        assert_allclose(got, old * 0.9 + batch * 0.1, atol=1e-5, rtol=1e-5)


def test_which_inputs_take_the_torch_kernel(rng):
    """`batch_norm_applies`: float32 PyTorch tensors normalised over axis 1
    or the last axis with more than one value per channel; never on JAX
    or TensorFlow, where the layer is Keras' code."""
    x = keras.ops.convert_to_tensor(rng.normal(size=(4, 3, 5)), "float32")
    assert batch_norm_applies(x, -1) is TORCH
    assert batch_norm_applies(x, 1) is TORCH
    assert batch_norm_applies(x, 2) is TORCH
    assert not batch_norm_applies(x, 0)
    assert not batch_norm_applies(x[:1, :1], -1)  # one value per channel
    assert not batch_norm_applies(keras.ops.cast(x, "float16"), -1)
    assert not batch_norm_applies(np.zeros((4, 5), "float32"), -1)


def test_one_value_per_channel_falls_back_to_keras(rng):
    """A batch of one row: torch's kernel refuses training statistics;
    the layer runs Keras' code (variance 0: the output is beta)."""
    ours, stock = _pair((1, 12))
    x = rng.normal(size=(1, 12)).astype("float32")
    assert_allclose(ours(x, training=True), stock(x, training=True), atol=1e-5)


def test_library_models_use_it():
    block = PatchTSTEncoderBlock(num_heads=2, mlp_dim=16)
    block.build((None, 5, 8))
    assert type(block.norm1) is BatchNormalization
    arch = dict(
        stem_filters=4,
        embed_dims=(8, 8, 8),
        head_dims=(4, 4, 4),
        blocks=(((1, 8),), ((1, 8),), ((1, 8),)),
    )
    model = models.ViTRes(arch, num_classes=3, image_size=56)
    norms = [
        layer
        for layer in sublayers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
    ]
    assert norms and all(type(n) is BatchNormalization for n in norms)
