"""`keras_jumbo.layers.Conv2D`: Keras' Conv2D, with small kernels as
matmuls of shifted slices on JAX (`SHIFTED_MATMUL_BACKENDS`) in training,
and for narrow inputs at inference too."""

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo._keras_internals import sublayers
from keras_jumbo.layers import Conv2D
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers.conv2d import IM2COL_MAX_CHANNELS
from keras_jumbo.layers.conv2d import SHIFTED_MATMUL_BACKENDS
from keras_jumbo.layers.conv2d import shifted_matmul_conv2d
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test

SHIFTED = keras.backend.backend() in SHIFTED_MATMUL_BACKENDS

# (input (batch, H, W, C), kernel size, strides, filters): both paths
# (channels below IM2COL_MAX_CHANNELS gather their taps into one matmul),
# strides that leave input rows unused, non-square kernels and strides.
CASES = [
    ((2, 11, 11, 3), (3, 3), (2, 2), 6),
    ((2, 9, 10, 12), (3, 3), (1, 1), 5),
    ((3, 8, 8, 9), (3, 3), (2, 2), 7),
    ((2, 7, 9, 4), (1, 3), (2, 1), 3),
    ((1, 6, 6, 10), (2, 2), (2, 2), 4),
    ((2, 5, 5, 16), (1, 1), (1, 1), 8),
]


def _conv_inputs(rng, shape, kernel_size, filters):
    x = rng.normal(size=shape).astype("float32")
    kernel = rng.normal(size=(*kernel_size, shape[-1], filters)) * 0.3
    return x, kernel.astype("float32")


def test_both_paths_are_exercised():
    channels = {case[0][-1] for case in CASES}
    assert min(channels) < IM2COL_MAX_CHANNELS <= max(channels)


@pytest.mark.parametrize("shape,kernel_size,strides,filters", CASES)
def test_shifted_matmul_conv2d_is_the_convolution(
    rng, shape, kernel_size, strides, filters
):
    """On every backend (the function is keras.ops): equal to
    `ops.conv(..., padding="valid")` and to the convolution sum written
    out in numpy."""
    x, kernel = _conv_inputs(rng, shape, kernel_size, filters)
    y = keras.ops.convert_to_numpy(shifted_matmul_conv2d(x, kernel, strides))
    expected = keras.ops.convert_to_numpy(
        keras.ops.conv(x, kernel, strides=strides, padding="valid")
    )
    kh, kw = kernel_size
    rows = (shape[1] - kh) // strides[0] + 1
    cols = (shape[2] - kw) // strides[1] + 1
    by_hand = np.zeros((shape[0], rows, cols, filters), "float64")
    for r in range(rows):
        for c in range(cols):
            window = x[
                :,
                r * strides[0] : r * strides[0] + kh,
                c * strides[1] : c * strides[1] + kw,
            ]
            by_hand[:, r, c] = np.einsum("bijc,ijco->bo", window, kernel)
    assert y.shape == expected.shape == by_hand.shape
    assert_allclose(y, expected, atol=1e-5, rtol=1e-5)
    assert_allclose(y, by_hand, atol=1e-5, rtol=1e-5)


def _pair(rng, shape, **kwargs):
    """A keras_jumbo Conv2D and a Keras Conv2D with the same random
    weights (bias included), built for `shape`."""
    ours, theirs = Conv2D(**kwargs), keras.layers.Conv2D(**kwargs)
    ours.build(shape)
    theirs.build(shape)
    weights = [rng.normal(size=w.shape).astype("float32") for w in ours.weights]
    ours.set_weights(weights)
    theirs.set_weights(weights)
    return ours, theirs


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(filters=6, kernel_size=3, strides=2, activation="relu"),
        dict(filters=5, kernel_size=3, use_bias=False),
        # Keras' convolution: padding, dilation, kernels above 3x3.
        dict(filters=4, kernel_size=3, padding="same"),
        dict(filters=4, kernel_size=3, dilation_rate=2),
        dict(filters=4, kernel_size=4, strides=4),
    ],
)
@pytest.mark.parametrize("channels", [3, 12])
@pytest.mark.parametrize("training", [None, False, True])
def test_layer_equals_keras_conv2d(rng, kwargs, channels, training):
    """In training (the shifted matmuls on JAX) and at inference (Keras'
    convolution, or the gathered matmul of a narrow input) alike."""
    shape = (2, 12, 12, channels)
    ours, theirs = _pair(rng, shape, **kwargs)
    x = rng.normal(size=shape).astype("float32")
    expected = theirs(x)
    assert_allclose(ours(x, training=training), expected, atol=1e-5, rtol=1e-5)
    config = {**ours.get_config(), "name": theirs.name}
    assert config == theirs.get_config()


@pytest.mark.parametrize("channels", [4, 12])
@pytest.mark.parametrize("training", [None, False, True])
def test_small_kernels_skip_keras_convolution_on_jax(
    rng, monkeypatch, channels, training
):
    """On JAX a 3x3 valid convolution never reaches `ops.conv` in training,
    nor at inference on a narrow input (fewer than IM2COL_MAX_CHANNELS
    channels: one gathered matmul); a wide one does at inference, and so
    does a `"same"` one (and every convolution on the other backends)."""
    import keras.src.ops as keras_ops

    calls = []
    conv = keras_ops.conv

    def counting_conv(*args, **kwargs):
        calls.append(kwargs.get("padding"))
        return conv(*args, **kwargs)

    monkeypatch.setattr(keras_ops, "conv", counting_conv)
    x = rng.normal(size=(2, 9, 9, channels)).astype("float32")
    Conv2D(3, 3, strides=2)(x, training=training)
    shifted = SHIFTED and (training or channels < IM2COL_MAX_CHANNELS)
    assert calls == ([] if shifted else ["valid"])
    Conv2D(3, 3, padding="same")(x, training=training)
    assert calls[-1] == "same"


def test_fit_trains_through_the_shifted_matmuls(rng, monkeypatch):
    """In a model, Keras hands `training` to the layer: on JAX `fit` runs
    the shifted matmuls of a wide input, `predict` and a plain call do
    not."""
    import keras_jumbo.layers.conv2d as conv2d_module

    calls = []
    shifted = conv2d_module.shifted_matmul_conv2d

    def counting(*args):
        calls.append(1)
        return shifted(*args)

    monkeypatch.setattr(conv2d_module, "shifted_matmul_conv2d", counting)
    channels = IM2COL_MAX_CHANNELS + 4
    inputs = keras.Input((9, 9, channels))
    outputs = keras.layers.Flatten()(Conv2D(3, 3, strides=2)(inputs))
    model = keras.Model(inputs, outputs)
    x = rng.normal(size=(4, 9, 9, channels)).astype("float32")
    model.predict(x, verbose=0)
    model(x)
    assert calls == []
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, np.zeros((4, 48), "float32"), epochs=1, verbose=0)
    assert bool(calls) == SHIFTED


@pytest.mark.parametrize("channels", [3, 12])
def test_one_sgd_step_equals_keras_conv2d(rng, channels):
    """Dense (per pixel) -> Conv2D 3x3 stride 2 -> Flatten, one SGD step
    under MSE: every weight after the step equals the same model with
    Keras' Conv2D, so the kernel, bias and input gradients are Keras'."""
    x = rng.normal(size=(4, 9, 9, 2)).astype("float32")
    target = rng.normal(size=(4, 4 * 4 * 5)).astype("float32")

    def model(conv_cls):
        inputs = keras.Input((9, 9, 2))
        h = keras.layers.Dense(channels, name="dense")(inputs)
        h = conv_cls(5, 3, strides=2, name="conv")(h)
        return keras.Model(inputs, keras.layers.Flatten()(h))

    ours, theirs = model(Conv2D), model(keras.layers.Conv2D)
    weights = [rng.normal(size=w.shape).astype("float32") for w in ours.weights]
    for m in (ours, theirs):
        m.set_weights(weights)
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        m.train_on_batch(x, target)
    for a, b in zip(ours.get_weights(), theirs.get_weights(), strict=True):
        assert_allclose(a, b, atol=1e-5, rtol=1e-5)
    moved = [
        not np.allclose(a, w)
        for a, w in zip(ours.get_weights(), weights, strict=True)
    ]
    assert all(moved)


def test_conv2d_layer():
    run_layer_test(
        Conv2D,
        {"filters": 4, "kernel_size": 3, "strides": 2},
        input_shape=(2, 9, 9, 3),
        expected_output_shape=(2, 4, 4, 4),
        expected_num_trainable_weights=2,
    )


def test_library_layers_use_it():
    architecture = dict(
        stem_filters=4,
        embed_dims=(8, 12),
        head_dims=(4, 4),
        blocks=(((2, 16),), ((3, 24),)),
    )
    model = models.ViTRes(architecture, num_classes=3, image_size=28)
    convs = [
        layer
        for layer in sublayers(model)
        if isinstance(layer, keras.layers.Conv2D)
    ]
    stem = [c for c in convs if "stem" in c.name]
    assert len(stem) == 3 and all(type(c) is Conv2D for c in stem)
    reductions = [
        layer
        for layer in sublayers(model)
        if isinstance(layer, ResidualSpatialReduction)
    ]
    assert reductions and all(type(r.conv) is Conv2D for r in reductions)
