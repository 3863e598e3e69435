import keras
import numpy as np
import pytest

from keras_jumbo.layers import FoldChannels
from keras_jumbo.layers import MultiScalePatchFusion
from keras_jumbo.layers import PatchEmbedding1D
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import RevIN
from keras_jumbo.layers import num_patches
from keras_jumbo.layers import patching_for_num_patches
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.conftest import numpy


def test_patch_embedding_1d_layer_checks():
    run_layer_test(
        PatchEmbedding1D,
        {"hidden_dim": 8, "patch_length": 4, "stride": 2},
        input_shape=(2, 12, 3),
        # N = (12 - 4) // 2 + 2 = 6
        expected_output_shape=(2, 3, 6, 8),
        expected_num_trainable_weights=2,
    )


def official_patches(series, patch_length, stride):
    """Official PatchTST: ReplicationPad1d((0, S)) then unfold(P, S)."""
    padded = np.concatenate(
        [series, np.repeat(series[:, -1:], stride, axis=1)], axis=1
    )
    count = (padded.shape[1] - patch_length) // stride + 1
    return np.stack(
        [
            padded[:, i * stride : i * stride + patch_length]
            for i in range(count)
        ],
        axis=1,
    )  # (batch, N, P, C)


@pytest.mark.parametrize(
    "length,patch,stride", [(12, 4, 2), (336, 16, 8), (30, 7, 3)]
)
def test_patch_embedding_1d_matches_official_padding_and_unfold(
    length, patch, stride, rng
):
    layer = PatchEmbedding1D(5, patch, stride)
    x = rng.normal(size=(2, length, 3)).astype("float32")
    y = numpy(layer(x))
    assert y.shape[2] == (length - patch) // stride + 2
    kernel, bias = (numpy(w) for w in layer.projection.weights)
    patches = official_patches(x, patch, stride)  # (B, N, P, C)
    expected = np.einsum("bnpc,pd->bcnd", patches, kernel) + bias
    assert_allclose(y, expected, atol=1e-5)


def test_patching_for_num_patches_gives_exactly_n_patches():
    for length in (24, 96, 100, 150, 152, 427, 1460):
        for count in (8, 42):
            if count > length:
                continue
            config = patching_for_num_patches(length, count)
            assert config["patch_length"] == 2 * config["stride"]
            assert num_patches(length, **config) == count
            # The patches cover the series: the padding is never negative.
            assert config["padding"] >= 0
            layer = PatchEmbedding1D(4, **config)
            assert layer(np.zeros((1, length, 1))).shape == (1, 1, count, 4)
    # GunPoint: 150 steps, 8 patches of 36 with stride 18, 12 padded values.
    assert patching_for_num_patches(150, 8) == {
        "patch_length": 36,
        "stride": 18,
        "padding": 12,
    }


@pytest.mark.parametrize(
    "kwargs,shape,match",
    [
        ({"patch_length": 0}, (1, 8, 1), "patch_length"),
        ({"patch_length": 4, "stride": -1}, (1, 8, 1), "stride"),
        ({"patch_length": 4, "padding": "start"}, (1, 8, 1), "padding"),
        ({"patch_length": 16, "padding": "none"}, (1, 8, 1), "shorter"),
    ],
)
def test_patch_embedding_1d_errors(kwargs, shape, match):
    with pytest.raises(ValueError, match=match):
        PatchEmbedding1D(4, **kwargs).build(shape)
    with pytest.raises(ValueError, match="num_patches"):
        patching_for_num_patches(10, 42)


def test_patch_embedding_1d_rejects_other_channel_counts():
    layer = PatchEmbedding1D(4, 4)
    layer(np.zeros((1, 8, 3)))
    with pytest.raises(ValueError, match="3 channels"):
        layer(np.zeros((1, 8, 2)))


def test_position_embedding_1d(rng):
    run_layer_test(
        PositionEmbedding,
        {"grid_size": (6,)},
        input_shape=(2, 6, 8),
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=1,
    )
    layer = PositionEmbedding((6,))
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    y = layer(x)
    assert_allclose(
        numpy(y) - x, np.broadcast_to(numpy(layer.embeddings), (2, 6, 8))
    )
    # Another length: the table is resampled along the one axis.
    assert layer.resampled((9,)).shape == (9, 8)
    with pytest.raises(ValueError, match="rank 3"):
        PositionEmbedding((6,))(np.zeros((2, 6, 1, 8)))


def test_revin_layer_checks():
    run_layer_test(
        RevIN,
        {"affine": True},
        input_shape=(2, 16, 3),
        expected_output_shape=(2, 16, 3),
        expected_num_trainable_weights=2,
    )


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("subtract_last", [False, True])
def test_revin_inverse_of_revin_is_identity(affine, subtract_last, rng):
    layer = RevIN(affine=affine, subtract_last=subtract_last)
    x = (rng.normal(size=(4, 32, 3)) * 5 + 3).astype("float32")
    normalised = layer(x)
    randomize_weights(layer)
    normalised = numpy(layer(x))
    assert_allclose(layer(normalised, reference=x), x, atol=1e-4)
    # Forward formula: per-series, per-channel statistics over time.
    center = x[:, -1:] if subtract_last else x.mean(1, keepdims=True)
    std = np.sqrt(x.var(1, keepdims=True) + 1e-5)
    expected = (x - center) / std
    if affine:
        expected = expected * numpy(layer.weight) + numpy(layer.bias)
    assert_allclose(normalised, expected, atol=1e-4)


def test_revin_inverse_inside_a_model(rng):
    series = keras.Input((16, 2))
    revin = RevIN(affine=True)
    forecast = keras.layers.Dense(2)(revin(series))
    model = keras.Model(series, revin(forecast, reference=series))
    randomize_weights(model)
    x = rng.normal(size=(3, 16, 2)).astype("float32")
    dense = model.layers[2]
    inner = numpy(dense(revin(x)))
    weight, bias = numpy(revin.weight), numpy(revin.bias)
    std = np.sqrt(x.var(1, keepdims=True) + 1e-5)
    expected = (inner - bias) / (weight + 1e-10) * std + x.mean(
        1, keepdims=True
    )
    assert_allclose(model(x), expected, atol=1e-4)


def test_fold_channels_layer_checks(rng):
    # Folding changes the batch size, so there is no fit step to run.
    run_layer_test(
        FoldChannels,
        {"num_channels": 3},
        input_shape=(2, 3, 5, 4),
        expected_output_shape=(6, 5, 4),
        run_training_check=False,
        run_save_check=False,
    )
    x = rng.normal(size=(2, 3, 5, 4)).astype("float32")
    folded = FoldChannels(3)(x)
    assert_allclose(folded, x.reshape(6, 5, 4), atol=0)
    assert_allclose(FoldChannels(3, inverse=True)(folded), x, atol=0)
    with pytest.raises(ValueError, match="3 channels"):
        FoldChannels(3)(np.zeros((2, 4, 5)))


def test_fusion_layer_checks():
    for mode in ("per_step", "per_horizon_step", "flatten"):
        weights = 2
        run_layer_test(
            MultiScalePatchFusion,
            {"mode": mode},
            input_shape=[(2, 6, 3)] * 3,
            expected_output_shape=(2, 6, 3),
            expected_num_trainable_weights=weights,
        )


def test_per_step_fusion_is_a_k_to_1_dense_at_every_step(rng):
    fusion = MultiScalePatchFusion("per_step")
    xs = [rng.normal(size=(2, 6, 3)).astype("float32") for _ in range(3)]
    fusion(xs)
    # Starts as the average of the scales.
    assert_allclose(fusion(xs), np.mean(xs, axis=0), atol=1e-6)
    randomize_weights(fusion)
    dense = keras.layers.Dense(1)
    dense.build((None, 3))
    dense.set_weights(
        [numpy(fusion.kernel)[:, None], numpy(fusion.bias).reshape(1)]
    )
    expected = numpy(dense(np.stack(xs, axis=-1)))[..., 0]
    assert_allclose(fusion(xs), expected, atol=1e-5)


def test_per_horizon_step_fusion_weights_each_step_by_its_own_row(rng):
    fusion = MultiScalePatchFusion("per_horizon_step")
    xs = [rng.normal(size=(2, 6, 3)).astype("float32") for _ in range(3)]
    fusion(xs)
    assert_allclose(fusion(xs), np.mean(xs, axis=0), atol=1e-6)
    randomize_weights(fusion)
    kernel, bias = numpy(fusion.kernel), numpy(fusion.bias)  # (T, k), (T,)
    expected = np.zeros((2, 6, 3))
    for t in range(6):  # the paragraph after eq. 3, written out
        for j in range(3):
            expected[:, t] += kernel[t, j] * xs[j][:, t]
        expected[:, t] += bias[t]
    assert_allclose(fusion(xs), expected, atol=1e-5)
    # With every row equal it is the per_step fusion.
    shared = MultiScalePatchFusion("per_step")
    shared(xs)
    shared.set_weights([kernel[0], np.float32(bias[0])])
    fusion.set_weights([np.tile(kernel[:1], (6, 1)), np.full(6, bias[0])])
    assert_allclose(fusion(xs), shared(xs), atol=1e-6)


def test_flatten_fusion_is_one_kT_to_T_dense_per_channel(rng):
    fusion = MultiScalePatchFusion("flatten")
    xs = [rng.normal(size=(2, 6, 3)).astype("float32") for _ in range(2)]
    fusion(xs)
    randomize_weights(fusion)
    dense = keras.layers.Dense(6)
    dense.build((None, 12))
    dense.set_weights([numpy(fusion.kernel), numpy(fusion.bias)])
    # Author's code: per channel, concat the k forecasts (length k·T).
    per_channel = np.concatenate(
        [np.transpose(x, (0, 2, 1)) for x in xs], axis=-1
    )  # (batch, C, k*T)
    expected = np.transpose(numpy(dense(per_channel)), (0, 2, 1))
    assert_allclose(fusion(xs), expected, atol=1e-5)


def test_fusion_errors():
    with pytest.raises(ValueError, match="mode"):
        MultiScalePatchFusion("mean")
    with pytest.raises(ValueError, match="k >= 2"):
        MultiScalePatchFusion()([np.zeros((1, 4, 2))])
    with pytest.raises(ValueError, match="same static shape"):
        MultiScalePatchFusion()([np.zeros((1, 4, 2)), np.zeros((1, 5, 2))])
