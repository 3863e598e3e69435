import keras
import numpy as np
import pytest

from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import patch_embedding
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers.reference import assert_same_sgd_step
from tests.layers.reference import value


def test_patch_embedding_layer_checks():
    run_layer_test(
        PatchEmbedding,
        {"hidden_dim": 8, "patch_size": 4},
        input_shape=(2, 8, 12, 3),
        expected_output_shape=(2, 2, 3, 8),
        expected_num_trainable_weights=2,
    )


def test_patch_embedding_is_flatten_then_dense(rng):
    layer = PatchEmbedding(hidden_dim=5, patch_size=(2, 3))
    x = rng.normal(size=(2, 4, 6, 3)).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    kernel = value(layer.projection.kernel).reshape(2 * 3 * 3, 5)
    bias = value(layer.projection.bias)
    for i in range(2):
        for j in range(2):
            patch = x[:, 2 * i : 2 * i + 2, 3 * j : 3 * j + 3, :]
            expected = patch.reshape(2, -1) @ kernel + bias
            np.testing.assert_allclose(y[:, i, j], expected, atol=1e-5)


@pytest.mark.parametrize(
    "data_format, shape, patch_size",
    [
        ("channels_last", (3, 8, 12, 3), (2, 3)),
        ("channels_first", (2, 5, 8, 8), 4),
        ("channels_last", (2, 6, 6, 1), 3),
    ],
)
def test_patch_embedding_matmul_is_the_convolution(
    rng, data_format, shape, patch_size
):
    # Every backend: the inference matmul (JAX's and PyTorch's path) against the
    # convolution, with a random kernel and bias.
    layer = PatchEmbedding(5, patch_size, data_format=data_format)
    x = rng.normal(size=shape).astype("float32")
    layer(x)
    randomize_weights(layer)
    nhwc = (
        x if data_format == "channels_last" else np.transpose(x, (0, 2, 3, 1))
    )
    convolution = layer.projection(nhwc)
    assert_allclose(layer._matmul_projection(nhwc), convolution, atol=1e-5)
    assert_allclose(layer(x, training=False), convolution, atol=1e-5)
    assert_allclose(layer(x, training=True), convolution, atol=1e-5)


def test_patch_embedding_matmul_where_its_backend_uses_it():
    layer = PatchEmbedding(4, 2)
    layer.build((1, 4, 4, 3))
    backend = keras.backend.backend()
    on = backend in patch_embedding.MATMUL_INFERENCE_BACKENDS
    in_training = backend in patch_embedding.MATMUL_TRAINING_BACKENDS
    assert in_training == (backend == "torch")
    assert layer._uses_matmul((1, 4, 4, 3), training=False) == on
    assert layer._uses_matmul((1, 4, 4, 3), training=None) == on
    assert layer._uses_matmul((1, 4, 4, 3), training=True) == in_training
    assert not layer._uses_matmul((1, None, None, 3), training=False)
    assert not layer._uses_matmul((1, None, None, 3), training=True)
    layer.projection.enable_lora(2)
    assert not layer._uses_matmul((1, 4, 4, 3), training=False)
    assert not layer._uses_matmul((1, 4, 4, 3), training=True)


class _ConvolutionOnly(PatchEmbedding):
    def _uses_matmul(self, nhwc_shape, training):
        return False


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
def test_patch_embedding_training_step_equals_the_convolution(rng, data_format):
    # One SGD step (a Dense before the embedding, so the input gradient
    # counts too) through the layer as each backend trains it (PyTorch:
    # the matmul) against the convolution alone: the same weights after.
    shape = (2, 6, 9, 3) if data_format == "channels_last" else (2, 3, 6, 9)
    x = rng.normal(size=shape).astype("float32")
    target = rng.normal(size=(2, 2, 3, 5)).astype("float32")
    ours = PatchEmbedding(5, 3, data_format=data_format)
    stock = _ConvolutionOnly(5, 3, data_format=data_format)
    ours.build(shape)
    randomize_weights(ours)
    stock.build(shape)
    stock.set_weights(ours.get_weights())
    assert_same_sgd_step(ours, stock, x, target)


def test_patch_embedding_channels_first_matches_channels_last(rng):
    last = PatchEmbedding(6, 2, data_format="channels_last")
    first = PatchEmbedding(6, 2, data_format="channels_first")
    x = rng.normal(size=(2, 4, 4, 3)).astype("float32")
    last(x)
    first(np.transpose(x, (0, 3, 1, 2)))
    first.set_weights(last.get_weights())
    assert_allclose(first(np.transpose(x, (0, 3, 1, 2))), last(x), atol=1e-6)


def test_patch_embedding_errors():
    with pytest.raises(ValueError, match="patch_size"):
        PatchEmbedding(4, 3).build((1, 16, 16, 3))
    with pytest.raises(ValueError, match="hidden_dim"):
        PatchEmbedding(0, 4)
    with pytest.raises(ValueError, match="rank 4"):
        PatchEmbedding(4, 4).build((1, 16, 3))
    layer = PatchEmbedding(4, 4)
    layer.build((1, 8, 8, 3))
    with pytest.raises(ValueError, match="channels"):
        layer(np.zeros((1, 8, 8, 1), "float32"))
    with pytest.raises(ValueError, match="data_format"):
        PatchEmbedding(4, 4, data_format="nchw")


def test_position_embedding_layer_checks():
    run_layer_test(
        PositionEmbedding,
        {"grid_size": (2, 3)},
        input_shape=(2, 2, 3, 8),
        expected_output_shape=(2, 2, 3, 8),
        expected_num_trainable_weights=1,
    )


def test_position_embedding_adds_table(rng):
    layer = PositionEmbedding(grid_size=3)
    x = rng.normal(size=(2, 3, 3, 4)).astype("float32")
    y = layer(x)
    assert_allclose(y, x + value(layer.embeddings)[None], atol=1e-6)


@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear", "nearest"])
def test_position_embedding_resamples_to_other_grids(interpolation):
    layer = PositionEmbedding(grid_size=4, interpolation=interpolation)
    layer.build((1, 4, 4, 3))
    # A constant table must stay constant whatever the resampling kernel.
    layer.embeddings.assign(np.full((4, 4, 3), 0.7, "float32"))
    y = layer(np.zeros((1, 7, 5, 3), "float32"))
    assert tuple(y.shape) == (1, 7, 5, 3)
    assert_allclose(y, np.full((1, 7, 5, 3), 0.7), atol=1e-5)
    randomize_weights(layer)
    table = value(layer.embeddings)
    assert_allclose(layer.resampled((4, 4)), table, atol=0)
    # Nearest 2x upsampling repeats each entry.
    if interpolation == "nearest":
        big = keras.ops.convert_to_numpy(layer.resampled((8, 8)))
        np.testing.assert_allclose(big[::2, ::2], table, atol=1e-6)


def test_position_embedding_errors():
    with pytest.raises(ValueError, match="grid_size"):
        PositionEmbedding(0)
    with pytest.raises(ValueError, match="interpolation"):
        PositionEmbedding(4, interpolation="area51")
    layer = PositionEmbedding(2)
    layer.build((1, 2, 2, 4))
    with pytest.raises(ValueError, match="4 features"):
        layer(np.zeros((1, 2, 2, 5), "float32"))
