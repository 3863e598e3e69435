import keras
import numpy as np
import pytest

from keras_jumbo import convert
from keras_jumbo import layers
from keras_jumbo import models
from keras_jumbo.models import count_macs
from keras_jumbo.models import mac_report
from keras_jumbo.models.macs import layer_macs


def vit_macs(
    depth,
    dim,
    tokens,
    mlp,
    patch_pixels,
    classes,
    prefix=1,
    qk_width=None,
    jumbo=0,
    jumbo_mlp=0,
    last_patch_mlp=True,
    head_width=None,
):
    """Hand count of one image through a pre-norm ViT (batch 1).

    `tokens` includes the `prefix` tokens (CLS, or the J split Jumbo
    tokens when `jumbo=J`). Plain blocks run the FFN on every token; Jumbo
    blocks run it on the patches and one J*D token through the Jumbo FFN.
    """
    qk = qk_width or dim
    patches = tokens - prefix
    ffn_tokens = patches if jumbo else tokens
    total = patches * patch_pixels * dim  # patch projection
    for index in range(depth):
        total += tokens * dim * (2 * qk + dim)  # q, k, v
        total += tokens * tokens * (qk + dim)  # QKᵀ, AV
        total += tokens * dim * dim  # output projection
        if last_patch_mlp or index < depth - 1:
            total += 2 * ffn_tokens * dim * mlp
        total += 2 * jumbo * dim * jumbo_mlp
    return total + (head_width or dim) * classes  # head


def test_plain_vit_matches_the_hand_count():
    model = models.ViT(
        "pico", image_size=32, patch_size=8, depth=3, num_classes=7
    )
    # 16 patches + CLS, width 96, FFN 384, 8x8x3 pixels per patch.
    expected = vit_macs(3, 96, 17, 384, 8 * 8 * 3, 7)
    assert count_macs(model) == expected


def test_deit_tiny_and_depth_scaled_baselines():
    """Non-Deep ViT Table 1 geometry: width 192, 12 heads, 196 tokens."""
    common = dict(
        hidden_dim=192,
        num_heads=12,
        head="avg",
        use_class_token=False,
        num_classes=1000,
    )
    for depth in (12, 6):
        model = models.ViT("tiny", depth=depth, **common)
        expected = vit_macs(depth, 192, 196, 768, 768, 1000, prefix=0)
        assert count_macs(model) == expected
    assert count_macs(models.ViT("tiny", depth=12, **common)) == 1_246_563_840


@pytest.mark.parametrize("depth,branches", [(6, 2), (4, 3), (3, 4)])
def test_branchy_model_costs_exactly_the_deep_model(depth, branches):
    """Non-Deep ViT §3: L/n blocks of n branches keep the FLOPs of L."""
    kwargs = dict(image_size=32, patch_size=8, hidden_dim=24, num_heads=4)
    branchy = models.NonDeepViT(depth, branches, num_classes=5, **kwargs)
    deep = models.NonDeepViT(depth * branches, 1, num_classes=5, **kwargs)
    assert count_macs(branchy) == count_macs(deep)


@pytest.mark.parametrize("branches", [1, 2, 3])
def test_reparameterized_model_count(branches):
    """Collapsed: one attention with query/key width n*D, FFN unchanged."""
    kwargs = dict(image_size=32, patch_size=8, hidden_dim=24, num_heads=4)
    model = models.NonDeepViT(2, branches, num_classes=5, **kwargs)
    convert.set_join_lambda(model, 1.0)
    plain = convert.reparameterize(model, pad_values=False)
    expected = vit_macs(2, 24, 16, 96, 192, 5, prefix=0, qk_width=branches * 24)
    assert count_macs(plain) == expected
    # Stock MultiHeadAttention is counted like our own attention layer.
    if branches == 1:
        assert count_macs(plain) == count_macs(
            models.ViT(
                "pico",
                depth=2,
                head="avg",
                use_class_token=False,
                num_classes=5,
                **kwargs,
            )
        )


@pytest.mark.parametrize(
    "kwargs,head_tokens",
    [
        ({}, 2),
        ({"head": "official"}, 3),
        ({"share_jumbo_mlp": True}, 2),
    ],
)
def test_jumbo_vit_matches_the_hand_count(kwargs, head_tokens):
    model = models.JumboViT(
        "pico",
        image_size=32,
        patch_size=8,
        depth=3,
        jumbo_multiplier=2,
        num_classes=7,
        **kwargs,
    )
    last_patch = kwargs.get("head") == "official"
    expected = vit_macs(
        3,
        96,
        18,
        384,
        192,
        7,
        prefix=2,
        jumbo=2,
        jumbo_mlp=4 * 2 * 96,
        last_patch_mlp=last_patch,
        head_width=head_tokens * 96,
    )
    assert count_macs(model) == expected


def test_lora_adds_two_rank_r_maps_per_block():
    kwargs = dict(
        image_size=32,
        patch_size=8,
        depth=3,
        jumbo_multiplier=2,
        num_classes=7,
        share_jumbo_mlp=True,
    )
    base = count_macs(models.JumboViT("pico", **kwargs))
    lora = count_macs(models.JumboViT("pico", jumbo_lora_rank=4, **kwargs))
    assert lora - base == 3 * 2 * (2 * 96) * 4


def test_einsum_dense_counts_like_dense():
    inputs = keras.Input((5, 8))
    dense = keras.layers.Dense(6)(inputs)
    einsum = keras.layers.EinsumDense("btd,de->bte", output_shape=(5, 6))(
        inputs
    )
    model = keras.Model(inputs, [dense, einsum])
    rows = mac_report(model)
    assert [macs for _, kind, macs in rows if kind != "InputLayer"] == [
        5 * 8 * 6,
        5 * 8 * 6,
    ]


def test_stock_attention_rule_matches_its_weights():
    layer = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4, value_dim=5)
    layer.build((1, 7, 10), (1, 7, 10))
    # Each projection costs (tokens x its kernel size).
    kernels = [
        int(np.prod(sub.kernel.shape))
        for sub in (
            layer.query_dense,
            layer.key_dense,
            layer.value_dense,
            layer.output_dense,
        )
    ]
    assert 7 * sum(kernels) == 7 * 10 * 3 * (4 + 4 + 5) + 7 * 3 * 5 * 10
    expected = (
        7 * 10 * 3 * (4 + 4 + 5)  # q, k, v projections
        + 3 * 7 * 7 * (4 + 5)  # QKᵀ, AV
        + 7 * 3 * 5 * 10  # output projection
    )
    assert layer_macs(layer, [(1, 7, 10), (1, 7, 10)], (1, 7, 10)) == expected
    # Our attention with queries/keys wider than values: the same count.
    ours = layers.MultiHeadSelfAttention(num_heads=3, head_dim=5, key_dim=4)
    ours.build((1, 7, 10))
    assert 7 * ours.qkv.kernel.shape[0] * ours.qkv.kernel.shape[1] == (
        7 * 10 * 3 * (4 + 4 + 5)
    )
    assert layer_macs(ours, [(1, 7, 10)], (1, 7, 10)) == expected


def test_unknown_layers_with_weights_are_not_silently_free():
    class Mystery(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1],))

        def call(self, x):
            return x * self.w

    inputs = keras.Input((4,))
    model = keras.Model(inputs, Mystery(name="mystery")(inputs))
    with pytest.raises(TypeError, match="Mystery"):
        count_macs(model)
    with pytest.raises(TypeError, match="model="):
        count_macs(keras.layers.Dense(3))


def test_command_line_count(tmp_path, capsys):
    from keras_jumbo import cli

    kwargs = dict(image_size=32, patch_size=8, hidden_dim=24, num_heads=4)
    model = models.NonDeepViT(2, 2, num_classes=5, **kwargs)
    convert.set_join_lambda(model, 1.0)
    model.save(tmp_path / "branchy.keras")
    assert cli.main(["count", str(tmp_path / "branchy.keras")]) == 0
    assert f"{count_macs(model):,} MACs" in capsys.readouterr().out
    plain = convert.reparameterize(model, pad_values=False)
    args = ["count", str(tmp_path / "branchy.keras"), "--reparameterize"]
    assert cli.main([*args, "--layers"]) == 0
    out = capsys.readouterr().out
    assert f"{count_macs(plain):,} MACs" in out
    assert "MultiHeadSelfAttention" in out
