"""MaskedLayerNorm, ResidualSpatialReduction, and channel-masked attention,
FFN and blocks (ViT-ResNAS)."""

import keras
import numpy as np
import pytest

from keras_jumbo.layers import MLP
from keras_jumbo.layers import MaskedLayerNorm
from keras_jumbo.layers import MaskedViTBlock
from keras_jumbo.layers import MultiHeadSelfAttention
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers import ViTBlock
from keras_jumbo.nas import slice_layer_weights
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.conftest import numpy
from tests.layers import reference


def prefix_masks(widths, total):
    """(batch, 1, total) masks keeping the first widths[b] channels."""
    return (
        np.arange(total)[None, None, :] < np.array(widths)[:, None, None]
    ).astype("float32")


def test_masked_layer_norm_layer_checks():
    run_layer_test(
        MaskedLayerNorm,
        {"epsilon": 1e-5},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=2,
    )


def test_masked_layer_norm_without_mask_is_layer_normalization(rng):
    x = rng.normal(size=(3, 4, 10)).astype("float32") * 3 + 1
    ours = MaskedLayerNorm(epsilon=1e-6)
    ours.build(x.shape)
    randomize_weights(ours)
    core = keras.layers.LayerNormalization(epsilon=1e-6)
    core.build(x.shape)
    core.set_weights(ours.get_weights())
    assert_allclose(ours(x), core(x), atol=1e-5)


def test_masked_layer_norm_equals_layer_norm_on_the_slice(rng):
    widths = [10, 7, 3]
    x = rng.normal(size=(3, 4, 10)).astype("float32") * 2 + 0.5
    x = x * prefix_masks(
        widths, 10
    )  # masked channels are zero, as in a super-net
    layer = MaskedLayerNorm(epsilon=1e-6)
    layer.build(x.shape)
    randomize_weights(layer)
    gamma, beta = (numpy(w).astype("float64") for w in layer.weights)
    y = numpy(layer(x, channel_mask=prefix_masks(widths, 10)))
    for b, k in enumerate(widths):
        expected = reference.layer_norm(
            x[b, :, :k].astype("float64"), gamma[:k], beta[:k], 1e-6
        )
        assert_allclose(y[b, :, :k], expected, atol=1e-5)
        assert np.all(y[b, :, k:] == 0)


def test_attention_with_head_dim_matches_reference_and_keras(rng):
    d, heads, head_dim = 10, 3, 4  # inner width 12 != model width 10
    layer = MultiHeadSelfAttention(heads, head_dim=head_dim)
    x = rng.normal(size=(2, 6, d)).astype("float32")
    layer(x)
    randomize_weights(layer)
    assert tuple(layer.qkv.kernel.shape) == (d, 3 * heads * head_dim)
    assert_allclose(layer(x), reference.attention(x, layer), atol=1e-5)
    core = keras.layers.MultiHeadAttention(heads, key_dim=head_dim)
    core(x, x)
    kernel = numpy(layer.qkv.kernel).reshape(d, 3, heads, head_dim)
    bias = numpy(layer.qkv.bias).reshape(3, heads, head_dim)
    denses = (core._query_dense, core._key_dense, core._value_dense)
    for index, dense in enumerate(denses):
        dense.kernel.assign(kernel[:, index])
        dense.bias.assign(bias[index])
    core._output_dense.kernel.assign(
        numpy(layer.proj.kernel).reshape(heads, head_dim, d)
    )
    core._output_dense.bias.assign(numpy(layer.proj.bias))
    assert_allclose(layer(x), core(x, x), atol=1e-5)


def test_attention_head_mask_equals_fewer_heads(rng):
    big = MultiHeadSelfAttention(4, head_dim=3)
    small = MultiHeadSelfAttention(2, head_dim=3)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    big(x)
    small(x)
    randomize_weights(big)
    slice_layer_weights(big, small)
    mask = prefix_masks([6, 6], 12)
    assert_allclose(big(x, head_mask=mask), small(x), atol=1e-5)


def test_mlp_hidden_mask_equals_narrower_mlp(rng):
    big, small = MLP(12), MLP(5)
    x = rng.normal(size=(2, 3, 6)).astype("float32")
    big(x)
    small(x)
    randomize_weights(big)
    slice_layer_weights(big, small)
    assert_allclose(
        big(x, hidden_mask=prefix_masks([5, 5], 12)), small(x), atol=1e-5
    )


@pytest.mark.parametrize(
    "width,heads,hidden", [(12, 3, 24), (8, 2, 10), (6, 1, 7)]
)
def test_masked_block_equals_sliced_standalone_block(width, heads, hidden, rng):
    big = MaskedViTBlock(3, 24, head_dim=4)
    small = ViTBlock(heads, hidden, head_dim=4)
    x = rng.normal(size=(2, 5, 12)).astype("float32")
    big.build(x.shape)
    small.build((2, 5, width))
    randomize_weights(big)
    slice_layer_weights(big, small)
    embed = prefix_masks([width] * 2, 12)
    x = x * embed
    y = numpy(
        big(
            x,
            embed_mask=embed,
            head_mask=prefix_masks([heads * 4] * 2, 12),
            hidden_mask=prefix_masks([hidden] * 2, 24),
        )
    )
    assert_allclose(y[..., :width], small(x[..., :width]), atol=1e-5)
    assert np.all(y[..., width:] == 0)


def test_masked_block_per_example_masks_and_skipping(rng):
    block = MaskedViTBlock(3, 24, head_dim=4)
    x = rng.normal(size=(3, 5, 12)).astype("float32")
    block.build(x.shape)
    randomize_weights(block)
    embed = prefix_masks([12, 8, 8], 12)
    x = x * embed
    keep = np.array([1, 1, 0], "float32")[:, None, None]
    y = numpy(
        block(
            x,
            embed_mask=embed,
            head_mask=prefix_masks([12, 8, 12], 12),
            hidden_mask=prefix_masks([24, 10, 24], 24),
            layer_mask=keep,
        )
    )
    assert_allclose(y[2], x[2], atol=0)  # skipped block: identity
    for b, (width, heads, hidden) in enumerate([(12, 3, 24), (8, 2, 10)]):
        small = ViTBlock(heads, hidden, head_dim=4)
        small.build((1, 5, width))
        slice_layer_weights(block, small)
        assert_allclose(
            y[b, :, :width], small(x[b : b + 1, :, :width])[0], atol=1e-5
        )


def test_masked_block_layer_checks():
    run_layer_test(
        MaskedViTBlock,
        {"num_heads": 2, "mlp_dim": 16, "head_dim": 3, "drop_path_rate": 0.1},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=12,
    )


def test_masked_block_without_masks_is_the_vit_block(rng):
    masked = MaskedViTBlock(2, 16, layer_scale_init_value=0.5)
    plain = ViTBlock(2, 16, layer_scale_init_value=0.5)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    masked(x)
    plain(x)
    randomize_weights(masked)
    plain.set_weights(masked.get_weights())
    assert_allclose(masked(x), plain(x), atol=1e-5)
    # A skipped block (layer mask 0) is the identity.
    skip = np.zeros((2, 1, 1), "float32")
    assert_allclose(masked(x, layer_mask=skip), x, atol=0)


def test_block_head_dim_decouples_width():
    block = ViTBlock(3, 8, head_dim=5)
    assert block(np.zeros((1, 4, 7))).shape == (1, 4, 7)
    with pytest.raises(ValueError, match="num_heads"):
        ViTBlock(3, 8).build((1, 4, 7))


def test_residual_spatial_reduction_layer_checks():
    run_layer_test(
        ResidualSpatialReduction,
        {"output_dim": 12},
        input_shape=(2, 1 + 16, 8),
        expected_output_shape=(2, 1 + 4, 12),
        expected_num_trainable_weights=7,
    )


def reduction_reference(x, layer):
    """Numpy: LN, symmetric-pad-1 3x3 stride-2 conv + positions, token
    Linear; main branch 2x2 average pool and zero padding."""
    x = x.astype("float64")
    batch, _, dim = x.shape
    h, w = layer.grid
    out_dim = layer.output_dim
    normed = reference.norm(x, layer.norm)
    grid = normed[:, 1:].reshape(batch, h, w, dim)
    padded = np.pad(grid, ((0, 0), (1, 1), (1, 1), (0, 0)))
    kernel = reference.value(layer.conv.kernel)
    conv = np.zeros((batch, h // 2, w // 2, out_dim))
    for i in range(h // 2):
        for j in range(w // 2):
            patch = padded[:, 2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
            conv[:, i, j] = np.einsum("bxyc,xyco->bo", patch, kernel)
    conv += reference.value(layer.conv.bias)
    conv += reference.value(layer.position_embedding)
    token = reference.dense(normed[:, :1], layer.token_dense)
    main = x[:, 1:].reshape(batch, h // 2, 2, w // 2, 2, dim).mean((2, 4))
    main = np.concatenate([x[:, :1], main.reshape(batch, -1, dim)], axis=1)
    main = np.pad(main, ((0, 0), (0, 0), (0, out_dim - dim)))
    residual = np.concatenate([token, conv.reshape(batch, -1, out_dim)], axis=1)
    return residual + main


def test_residual_spatial_reduction_numbers(rng):
    layer = ResidualSpatialReduction(10, grid_size=(4, 6))
    x = rng.normal(size=(2, 1 + 24, 6)).astype("float32")
    layer.build(x.shape)
    randomize_weights(layer)
    y = layer(x)
    assert y.shape == (2, 1 + 6, 10)
    assert_allclose(y, reduction_reference(x, layer), atol=1e-5)


def test_residual_spatial_reduction_masked_equals_sliced(rng):
    big = ResidualSpatialReduction(12)
    small = ResidualSpatialReduction(9)
    x = rng.normal(size=(2, 17, 8)).astype("float32")
    big.build(x.shape)
    small.build((2, 17, 5))
    randomize_weights(big)
    slice_layer_weights(big, small)
    in_mask, out_mask = prefix_masks([5, 5], 8), prefix_masks([9, 9], 12)
    y = numpy(
        big(x * in_mask, channel_mask=in_mask, output_channel_mask=out_mask)
    )
    assert_allclose(y[..., :9], small(x[..., :5]), atol=1e-5)
    assert np.all(y[..., 9:] == 0)


def test_residual_spatial_reduction_errors():
    with pytest.raises(ValueError, match="output_dim"):
        ResidualSpatialReduction(4).build((1, 17, 8))
    with pytest.raises(ValueError, match="divisible by 2"):
        ResidualSpatialReduction(8).build((1, 1 + 9, 8))
    with pytest.raises(ValueError, match="square"):
        ResidualSpatialReduction(8).build((1, 1 + 8, 8))
    with pytest.raises(ValueError, match="grid_size"):
        ResidualSpatialReduction(8, grid_size=(2, 2)).build((1, 1 + 8, 8))
    with pytest.raises(ValueError, match="output_dim"):
        ResidualSpatialReduction(0)
