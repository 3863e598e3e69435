"""`keras_jumbo.layers.Conv2D`: Keras' Conv2D, with small kernels on JAX
(`MATMUL_CONV_BACKENDS`) as one gathered matmul for narrow inputs and, in
training, with their kernel gradient written out as matmuls."""

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo._keras_internals import sublayers
from keras_jumbo.layers import Conv2D
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers.conv2d import IM2COL_MAX_CHANNELS
from keras_jumbo.layers.conv2d import MATMUL_CONV_BACKENDS
from keras_jumbo.layers.conv2d import conv2d_with_matmul_kernel_gradient
from keras_jumbo.layers.conv2d import im2col_conv2d
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test

MATMUL = keras.backend.backend() in MATMUL_CONV_BACKENDS

# (input (batch, H, W, C), kernel size, strides, filters): narrow and wide
# inputs (channels below IM2COL_MAX_CHANNELS take the gathered matmul),
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
@pytest.mark.parametrize(
    "function", [im2col_conv2d, conv2d_with_matmul_kernel_gradient]
)
def test_matmul_convolutions_are_the_convolution(
    rng, shape, kernel_size, strides, filters, function
):
    """On every backend (the functions are keras.ops): equal to
    `ops.conv(..., padding="valid")` and to the convolution sum written
    out in numpy."""
    x, kernel = _conv_inputs(rng, shape, kernel_size, filters)
    y = keras.ops.convert_to_numpy(function(x, kernel, strides))
    expected = keras.ops.convert_to_numpy(
        keras.ops.conv(x, kernel, strides=strides, padding="valid")
    )
    by_hand = _by_hand(x, kernel, strides)
    assert y.shape == expected.shape == by_hand.shape
    assert_allclose(y, expected, atol=1e-5, rtol=1e-5)
    assert_allclose(y, by_hand, atol=1e-5, rtol=1e-5)


def _windows(x, kernel_size, strides):
    """`(batch, rows, cols, kh, kw, in)`: the input window of each output
    position of a valid convolution."""
    kh, kw = kernel_size
    rows = (x.shape[1] - kh) // strides[0] + 1
    cols = (x.shape[2] - kw) // strides[1] + 1
    out = np.zeros((x.shape[0], rows, cols, kh, kw, x.shape[-1]), "float64")
    for r in range(rows):
        for c in range(cols):
            out[:, r, c] = x[
                :,
                r * strides[0] : r * strides[0] + kh,
                c * strides[1] : c * strides[1] + kw,
            ]
    return out


def _by_hand(x, kernel, strides):
    windows = _windows(x, kernel.shape[:2], strides)
    return np.einsum("brcijk,ijko->brco", windows, kernel)


# The layer trains through the written-out gradient on MATMUL_CONV_BACKENDS
# (JAX) only; elsewhere `keras.ops.custom_gradient` is not reliable in a
# Keras train step (PyTorch: "element 0 of tensors does not require grad";
# TensorFlow 2.21 gave wrong gradients to some models built later in the
# same process, reproduced with a custom gradient of `x * k` alone), and
# the layer is Keras' convolution there: the test below holds on every
# backend, through whichever path the layer takes.
@pytest.mark.parametrize(
    "shape,strides",
    [((5, 9, 9, 8), (1, 1)), ((5, 10, 11, 9), (2, 2)), ((3, 9, 8, 10), (2, 1))],
)
@pytest.mark.parametrize("chunked", [False, True])
def test_training_gradient_equals_the_formula(
    rng, monkeypatch, shape, strides, chunked
):
    """One SGD step (lr 1, sum of `y * target`) of a wide `Conv2D` (no
    bias) alone: the kernel moves by minus the summed outer products of
    each output's input window and `target` (the formula, in numpy), and,
    behind a per-pixel Dense, every weight equals the same model with
    Keras' `Conv2D` (so the input gradient too). On JAX the step runs
    `conv2d_with_matmul_kernel_gradient`. Input rows the strides leave
    unused (10 rows at stride 2) get a zero input gradient through the
    transposed convolution's output padding. `chunked`: the kernel
    gradient in chunks of two samples and a remainder of one."""
    import keras_jumbo.layers.conv2d as conv2d_module

    if chunked:
        sample_bytes = 4 * int(np.prod(shape[1:]))
        monkeypatch.setattr(
            conv2d_module, "KERNEL_GRADIENT_CHUNK_BYTES", 2 * sample_bytes
        )
    calls = _spy(monkeypatch)
    x = rng.normal(size=shape).astype("float32")
    kernel = (rng.normal(size=(3, 3, shape[-1], 4)) * 0.3).astype("float32")
    target = rng.normal(size=_by_hand(x, kernel, strides).shape)
    rng_dense = rng.normal(size=(shape[-1], shape[-1])) * 0.1

    def weights_after_step(conv_cls, dense_first):
        inputs = keras.Input(shape[1:])
        h = inputs
        if dense_first:
            h = keras.layers.Dense(
                shape[-1],
                kernel_initializer=keras.initializers.Constant(
                    np.eye(shape[-1]) + rng_dense
                ),
            )(h)
        outputs = conv_cls(
            4,
            3,
            strides=strides,
            use_bias=False,
            kernel_initializer=keras.initializers.Constant(kernel),
        )(h)
        model = keras.Model(inputs, outputs)
        model.compile(
            optimizer=keras.optimizers.SGD(1.0),
            loss=lambda t, y: keras.ops.sum(t * y),
        )
        model.train_on_batch(x, target.astype("float32"))
        return [np.asarray(w) for w in model.get_weights()]

    (after,) = weights_after_step(Conv2D, False)
    windows = _windows(x, (3, 3), strides)
    gradient = np.einsum("brcijk,brco->ijko", windows, target)
    assert_allclose(after, kernel - gradient, atol=1e-4, rtol=1e-5)
    got = weights_after_step(Conv2D, True)
    want = weights_after_step(keras.layers.Conv2D, True)
    for a, b in zip(got, want, strict=True):
        assert_allclose(a, b, atol=1e-4, rtol=1e-5)
    written = "conv2d_with_matmul_kernel_gradient" in calls
    assert written == MATMUL


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
    """In training (on JAX: the gathered matmul of a narrow input, the
    written-out gradient's forward pass) and at inference alike."""
    shape = (2, 12, 12, channels)
    ours, theirs = _pair(rng, shape, **kwargs)
    x = rng.normal(size=shape).astype("float32")
    expected = theirs(x)
    assert_allclose(ours(x, training=training), expected, atol=1e-5, rtol=1e-5)
    config = {**ours.get_config(), "name": theirs.name}
    assert config == theirs.get_config()


def _spy(monkeypatch):
    """Record which of the module's convolutions each call runs: the name
    of a matmul form, or `ops.conv`'s padding (Keras' convolution)."""
    import keras.src.ops as keras_ops

    import keras_jumbo.layers.conv2d as conv2d_module

    calls = []
    conv = keras_ops.conv

    def counting_conv(*args, **kwargs):
        calls.append(kwargs.get("padding"))
        return conv(*args, **kwargs)

    def counting(function):
        def wrapper(*args):
            calls.append(function.__name__)
            return function(*args)

        return wrapper

    monkeypatch.setattr(keras_ops, "conv", counting_conv)
    for name in ("im2col_conv2d", "conv2d_with_matmul_kernel_gradient"):
        function = getattr(conv2d_module, name)
        monkeypatch.setattr(conv2d_module, name, counting(function))
    return calls


@pytest.mark.parametrize("channels", [4, 12])
@pytest.mark.parametrize("training", [None, False, True])
def test_which_convolution_runs(rng, monkeypatch, channels, training):
    """On JAX a narrow 3x3 valid convolution (fewer than
    IM2COL_MAX_CHANNELS channels) is one gathered matmul, a wide one in
    training XLA's convolution with the written-out gradient, at
    inference Keras' convolution; a `"same"` one (and every convolution
    on the other backends) is Keras' convolution."""
    calls = _spy(monkeypatch)
    x = rng.normal(size=(2, 9, 9, channels)).astype("float32")
    Conv2D(3, 3, strides=2)(x, training=training)
    if not MATMUL:
        expected = ["valid"]
    elif channels < IM2COL_MAX_CHANNELS:
        expected = ["im2col_conv2d"]
    elif training:
        expected = ["conv2d_with_matmul_kernel_gradient"]
    else:
        expected = ["valid"]
    assert calls == expected
    Conv2D(3, 3, padding="same")(x, training=training)
    assert calls[len(expected) :] == ["same"]


def test_fit_trains_with_the_written_out_gradient(rng, monkeypatch):
    """In a model, Keras hands `training` to the layer: on JAX `fit` runs
    the written-out gradient for a wide input, `predict` and a plain call
    do not."""
    calls = _spy(monkeypatch)
    channels = IM2COL_MAX_CHANNELS + 4
    inputs = keras.Input((9, 9, channels))
    outputs = keras.layers.Flatten()(Conv2D(3, 3, strides=2)(inputs))
    model = keras.Model(inputs, outputs)
    x = rng.normal(size=(4, 9, 9, channels)).astype("float32")
    model.predict(x, verbose=0)
    model(x)
    assert "conv2d_with_matmul_kernel_gradient" not in calls
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, np.zeros((4, 48), "float32"), epochs=1, verbose=0)
    assert ("conv2d_with_matmul_kernel_gradient" in calls) == MATMUL


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
