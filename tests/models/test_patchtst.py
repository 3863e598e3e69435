import math

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers import ViTBlock
from keras_jumbo.models import count_macs
from keras_jumbo.models import registers_matching_jumbo_flops
from keras_jumbo.models.macs import layer_macs
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_model_test
from tests.conftest import numpy

TINY = dict(hidden_dim=16, num_heads=2, depth=2, mlp_dim=32)


def series(batch=3, length=48, channels=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, length, channels)).astype("float32")


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("patchtst", {}),
        ("patchtst_registers", {}),
        ("patchtst_jumbo", {"jumbo_multiplier": 2}),
        ("patchtst", {"num_patches": None, "patch_length": 8, "stride": 4}),
        (
            "patchtst",
            {
                "normalization": "batch_norm",
                "norm_first": False,
                "residual_attention": True,
                "instance_norm": True,
            },
        ),
    ],
)
def test_classifiers_pass_model_checks(name, kwargs):
    model = models.create_model(
        name,
        num_classes=3,
        sequence_length=48,
        num_channels=2,
        **{**TINY, **kwargs},
    )
    run_model_test(model, series())
    assert model.output.shape == (None, 3)


def test_classifier_blocks_follow_the_config():
    def blocks(**kwargs):
        model = models.PatchTSTClassifier(3, 48, 2, **TINY, **kwargs)
        encoder = next(
            layer for layer in model.layers if layer.name == "encoder"
        )
        return {type(block).__name__ for block in encoder.blocks}

    assert blocks() == {"ViTBlock"}
    assert blocks(jumbo_multiplier=2) == {"JumboBlock"}
    assert blocks(normalization="batch_norm") == {"PatchTSTEncoderBlock"}
    assert blocks(residual_attention=True) == {"PatchTSTEncoderBlock"}
    with pytest.raises(ValueError, match="Jumbo token runs in ViT blocks"):
        models.PatchTSTClassifier(
            3, 48, 2, jumbo_multiplier=2, norm_first=False, **TINY
        )
    with pytest.raises(ValueError, match="normalization"):
        models.PatchTSTClassifier(3, 48, 2, normalization="group", **TINY)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("patchtst_forecaster", {}),
        ("ms_patchtst", {}),
        ("ms_patchtst", {"fusion": "flatten", "revin_affine": True}),
        ("ms_patchtst", {"fusion": "per_horizon_step"}),
        (
            "ms_patchtst",
            {"scales": ("small", "medium", "large"), "norm_first": True},
        ),
    ],
)
def test_forecasters_pass_model_checks(name, kwargs):
    model = models.create_model(
        name,
        sequence_length=48,
        horizon=12,
        num_channels=2,
        patch_length=8,
        stride=4,
        **{**TINY, **kwargs},
    )
    run_model_test(model, series())
    assert model.output.shape == (None, 12, 2)


def test_registered_time_series_names():
    names = models.list_models("patchtst")
    assert names == [
        "ms_patchtst",
        "patchtst",
        "patchtst_forecaster",
        "patchtst_jumbo",
        "patchtst_registers",
    ]


def block_macs(tokens, width, jumbo=0):
    """Per-layer MACs of the library's own block (FFN hidden 2D)."""
    if jumbo:
        block = JumboBlock(1, 2 * width, jumbo, jumbo_mlp_dim=2 * jumbo * width)
    else:
        block = ViTBlock(1, 2 * width)
    block.build((1, tokens, width))
    return layer_macs(block, [(1, tokens, width)], (1, tokens, width))


def test_proposition_1_against_a_direct_count():
    """R from Proposition 1 equalises per-layer FLOPs (A.2.3)."""
    exact_cases = []
    for width in range(4, 40):
        for patches in range(1, 50):
            for jumbo in range(1, 7):
                value = (
                    (2 * width + patches) ** 2
                    + (1 + 2 * width) * jumbo**2
                    + 2 * (width + patches) * jumbo
                )
                root = math.isqrt(value)
                if root * root == value:
                    exact_cases.append((width, patches, jumbo))
    assert len(exact_cases) >= 3
    for width, patches, jumbo in exact_cases[:6]:
        registers = registers_matching_jumbo_flops(width, patches, jumbo)
        assert block_macs(patches + registers, width) == block_macs(
            patches + jumbo, width, jumbo
        )
    # The paper's setting (D=128, J=4): the rounded R is the integer whose
    # register layer is closest in cost to the Jumbo layer.
    for patches in (8, 42):
        registers = registers_matching_jumbo_flops(128, patches, 4)
        target = block_macs(patches + 4, 128, 4)
        costs = {
            r: abs(block_macs(patches + r, 128) - target) for r in range(1, 30)
        }
        assert registers == min(costs, key=costs.get)
    assert registers_matching_jumbo_flops(128, 8, 4) == 10
    assert registers_matching_jumbo_flops(128, 42, 4) == 9


def test_auto_registers_use_proposition_1():
    model = models.create_model(
        "patchtst_registers", sequence_length=48, num_patches=8, **TINY
    )
    expected = registers_matching_jumbo_flops(16, 8, 4)
    assert model.get_layer("registers").num_registers == expected


def copy_weights(source, target, skip=()):
    for layer in target.layers:
        if layer.weights and layer.name not in skip:
            layer.set_weights(source.get_layer(layer.name).get_weights())


@pytest.mark.parametrize("jumbo", [0, 2])
def test_channels_are_independent_and_concatenated(jumbo):
    """A.2.2: each channel runs alone through the shared backbone; the
    per-channel vectors are concatenated before the classifier."""
    kwargs = dict(sequence_length=48, jumbo_multiplier=jumbo, **TINY)
    multi = models.PatchTSTClassifier(4, num_channels=3, **kwargs)
    single = models.PatchTSTClassifier(4, num_channels=1, **kwargs)
    randomize_weights(multi)
    copy_weights(multi, single, skip=("head",))
    x = series(channels=3)
    features = keras.Model(single.input, single.get_layer("pooling").output)
    per_channel = [numpy(features(x[..., c : c + 1])) for c in range(3)]
    head = multi.get_layer("head")
    expected = np.concatenate(per_channel, axis=-1) @ numpy(
        head.kernel
    ) + numpy(head.bias)
    assert_allclose(multi(x), expected, atol=1e-4)


def official_encoder_reference(x, encoder):
    """numpy: official PatchTST TSTEncoder, inference (BatchNorm stats),
    post-norm, residual attention scores."""

    def batch_norm(h, norm):
        gamma, beta, mean, var = (numpy(w) for w in norm.weights)
        return (h - mean) / np.sqrt(var + norm.epsilon) * gamma + beta

    def gelu(h):
        from scipy.special import erf

        return 0.5 * h * (1 + erf(h / np.sqrt(2)))

    prev = None
    for block in encoder.blocks:
        att = block.attention
        heads, width = att.num_heads, x.shape[-1]
        head_dim = width // heads
        qkv = x @ numpy(att.qkv.kernel) + numpy(att.qkv.bias)
        qkv = qkv.reshape(*x.shape[:2], 3, heads, head_dim)
        q, k, v = (np.moveaxis(qkv[:, :, i], 1, 2) for i in range(3))
        scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(head_dim)
        if prev is not None:
            scores = scores + prev
        prev = scores
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.moveaxis(probs @ v, 1, 2).reshape(x.shape)
        out = out @ numpy(att.proj.kernel) + numpy(att.proj.bias)
        x = batch_norm(x + out, block.norm1)
        fc1, fc2 = block.mlp.fc1, block.mlp.fc2
        hidden = gelu(x @ numpy(fc1.kernel) + numpy(fc1.bias))
        x = batch_norm(
            x + hidden @ numpy(fc2.kernel) + numpy(fc2.bias), block.norm2
        )
    return x


def test_official_patchtst_encoder_is_reproduced(rng):
    encoder = TransformerEncoder(
        [PatchTSTEncoderBlock(2, 24, name=f"block_{i}") for i in range(3)]
    )
    x = rng.normal(size=(4, 7, 8)).astype("float32")
    encoder(x)
    randomize_weights(encoder)
    expected = official_encoder_reference(x.astype("float64"), encoder)
    assert_allclose(encoder(x, training=False), expected, atol=1e-4)


def test_forecaster_is_equivariant_to_scale_and_shift():
    """RevIN (no affine): forecasts follow an affine change of the input."""
    model = models.PatchTSTForecaster(
        48, 12, 2, patch_length=8, stride=4, **TINY
    )
    randomize_weights(model)
    x = series()
    y = numpy(model(x))
    assert_allclose(model(3.0 * x + 5.0), 3.0 * y + 5.0, atol=1e-3)


@pytest.mark.parametrize("fusion", ["per_step", "flatten"])
def test_ms_patchtst_fuses_single_scale_forecasters(fusion):
    common = dict(
        sequence_length=48, horizon=12, num_channels=2, dropout_rate=0.0
    )
    common.update(TINY)
    multi = models.MSPatchTST(
        patch_length=8,
        stride=4,
        scales=("small", "large"),
        fusion=fusion,
        **common,
    )
    randomize_weights(multi)
    x = series()
    forecasts = []
    for index, (patch, stride) in enumerate([(4, 2), (16, 8)]):
        single = models.PatchTSTForecaster(
            patch_length=patch, stride=stride, **common
        )
        for layer in single.layers:
            if layer.weights:
                source = multi.get_layer(f"scale_{index}_{layer.name}")
                layer.set_weights(source.get_weights())
        forecasts.append(numpy(single(x)))
    fusion_layer = multi.get_layer("fusion")
    assert_allclose(multi(x), fusion_layer(forecasts), atol=1e-4)
    assert fusion_layer.num_scales == 2


def test_scales_resolve_like_table_1():
    assert models.resolve_scales(("small", "medium", "large"), 16, 8) == [
        (8, 4),
        (16, 8),
        (32, 16),
    ]
    assert models.resolve_scales([(12, 6), "large"], 16, 8) == [
        (12, 6),
        (32, 16),
    ]


@pytest.mark.parametrize(
    "builder,kwargs,match",
    [
        (models.PatchTSTForecaster, {"sequence_length": 3}, "shorter"),
        (models.PatchTSTForecaster, {"patch_length": 0}, "patch_length"),
        (models.PatchTSTForecaster, {"stride": -2}, "stride"),
        (models.PatchTSTForecaster, {"horizon": 0}, "horizon"),
        (models.MSPatchTST, {"scales": ("tiny",)}, "scale"),
        (models.MSPatchTST, {"scales": ("small", "small")}, "scales"),
        (models.MSPatchTST, {"fusion": "mean"}, "fusion"),
        (models.MSPatchTST, {"num_layers": 3}, "num_layers"),
        (models.PatchTSTClassifier, {"num_patches": 99}, "num_patches"),
        (models.PatchTSTClassifier, {"num_registers": -1}, "num_registers"),
        (models.PatchTSTClassifier, {"num_classes": 0}, "num_classes"),
        (
            models.PatchTSTClassifier,
            {"num_patches": None, "sequence_length": 4, "padding": "none"},
            "shorter",
        ),
    ],
)
def test_bad_arguments_raise_naming_the_argument(builder, kwargs, match):
    base = dict(sequence_length=48, **TINY)
    if builder is not models.PatchTSTClassifier:
        base.update(patch_length=8, stride=4, horizon=12)
    base.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        builder(**base)


def test_channel_count_mismatch_at_call_time():
    model = models.PatchTSTForecaster(48, 12, 2, patch_length=8, stride=4)
    with pytest.raises(ValueError, match=r"\(None, 48, 2\).*\(1, 48, 3\)"):
        model(np.zeros((1, 48, 3), "float32"))
    classifier = models.PatchTSTClassifier(3, 48, 2, **TINY)
    with pytest.raises(ValueError, match=r"\(None, 48, 2\).*\(1, 48, 1\)"):
        classifier(np.zeros((1, 48, 1), "float32"))


def test_count_macs_follows_channel_independence():
    one = models.PatchTSTClassifier(3, 48, 1, **TINY)
    three = models.PatchTSTClassifier(3, 48, 3, **TINY)
    head_one, head_three = 16 * 3, 3 * 16 * 3
    assert count_macs(three) - head_three == 3 * (count_macs(one) - head_one)
