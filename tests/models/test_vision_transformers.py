import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_model_test

TINY = dict(
    hidden_dim=16,
    num_heads=2,
    depth=2,
    image_size=16,
    patch_size=8,
    num_classes=3,
)


def tiny_images(batch=2, size=16, channels=3):
    rng = np.random.default_rng(0)
    return rng.normal(size=(batch, size, size, channels)).astype("float32")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"head": "official", "share_jumbo_mlp": True},
        {"share_jumbo_mlp": True, "jumbo_lora_rank": 2},
        {"head": "avg", "layer_scale_init_value": 0.1, "drop_path_rate": 0.1},
        {"data_format": "channels_first", "token_drop_rate": 0.5},
    ],
)
def test_jumbo_variants_pass_model_checks(kwargs):
    model = models.JumboViT("pico", **{**TINY, "jumbo_multiplier": 2}, **kwargs)
    images = tiny_images()
    if kwargs.get("data_format") == "channels_first":
        images = np.transpose(images, (0, 3, 1, 2))
    run_model_test(model, images)


def test_every_size_is_registered_for_every_family():
    names = models.list_models()
    for size in ("pico", "nano", "tiny", "small", "base"):
        for family in ("vit", "registers_vit", "jumbo_vit"):
            assert f"{family}_{size}" in names
    assert models.list_models("jumbo") == [n for n in names if "jumbo" in n]


def test_sizes_follow_the_paper():
    expected = {
        "pico": (96, 3, 6),
        "nano": (128, 4, 6),
        "tiny": (192, 3, 6),
        "small": (384, 6, 6),
        "base": (768, 12, 3),
    }
    for size, (width, heads, jumbo) in expected.items():
        spec = models.VIT_SIZES[size]
        assert (spec["hidden_dim"], spec["num_heads"], spec["jumbo"]) == (
            width,
            heads,
            jumbo,
        )
        assert spec["depth"] == 12


def test_jumbo_head_reads_only_the_jumbo_token():
    model = models.JumboViT("pico", **{**TINY, "jumbo_multiplier": 2})
    encoder = model.get_layer("encoder")
    assert not encoder.blocks[-1].use_patch_mlp
    assert encoder.blocks[0].use_patch_mlp
    head = model.get_layer("head")
    assert tuple(head.kernel.shape) == (2 * 16, 3)
    official = models.JumboViT(
        "pico", **{**TINY, "jumbo_multiplier": 2}, head="official"
    )
    assert official.get_layer("encoder").blocks[-1].use_patch_mlp
    assert tuple(official.get_layer("head").kernel.shape) == (3 * 16, 3)


def test_include_top_false_returns_head_features():
    kwargs = {**TINY, "jumbo_multiplier": 2}
    full = models.JumboViT("pico", **kwargs)
    features = models.JumboViT("pico", include_top=False, **kwargs)
    randomize_weights(full)
    features.set_weights(full.get_weights()[:-2])
    x = tiny_images()
    head = full.get_layer("head")
    expected = keras.ops.matmul(features(x), head.kernel) + head.bias
    assert_allclose(full(x), expected, atol=1e-5)


def test_token_head_reads_cls_and_ignores_registers():
    model = models.RegistersViT("pico", num_registers=3, **TINY)
    randomize_weights(model)
    x = tiny_images()
    features = keras.Model(model.input, model.get_layer("final_norm").output)
    tokens = keras.ops.convert_to_numpy(features(x))
    assert tokens.shape == (2, 1 + 3 + 4, 16)
    head = model.get_layer("head")
    expected = keras.ops.matmul(tokens[:, 0], head.kernel) + head.bias
    assert_allclose(model(x), expected, atol=1e-5)


def test_with_image_size_runs_at_a_new_resolution():
    model = models.JumboViT("pico", **{**TINY, "jumbo_multiplier": 2})
    randomize_weights(model)
    same = models.with_image_size(model, 16)
    x = tiny_images()
    assert_allclose(same(x), model(x), atol=0)
    large = models.with_image_size(model, 32)
    assert isinstance(large, models.JumboViT)
    assert large.get_config()["image_size"] == (32, 32)
    y = large(tiny_images(size=32))
    assert tuple(y.shape) == (2, 3)
    # The new 4x4 table is the old 2x2 table resampled; every other
    # weight is copied unchanged.
    assert large.grid_size == (4, 4)
    table = model.position_embedding.resampled((4, 4))
    assert_allclose(large.position_embedding.embeddings, table, atol=1e-6)
    for old, new in zip(model.weights, large.weights, strict=True):
        if old is not model.position_embedding.embeddings:
            assert_allclose(new, old, atol=0)
    # Numbers: the patch grid plus the resampled table.
    z = tiny_images(size=32)
    grid = large.position_embedding(large.patch_embedding(z))
    expected = large.patch_embedding(z) + table[None]
    assert_allclose(grid, expected, atol=1e-5)


def test_with_image_size_rejects_other_models():
    with pytest.raises(TypeError, match="model"):
        models.with_image_size(keras.Sequential([keras.Input((4,))]), 32)


@pytest.mark.parametrize(
    "builder,kwargs,match",
    [
        (models.JumboViT, {"size": "huge"}, "size"),
        (models.JumboViT, {"image_size": 20}, "image_size"),
        (models.JumboViT, {"num_heads": 3}, "num_heads"),
        (models.JumboViT, {"jumbo_multiplier": 0}, "jumbo_multiplier"),
        (models.JumboViT, {"jumbo_multiplier": -2}, "jumbo_multiplier"),
        (models.RegistersViT, {"num_registers": -1}, "num_registers"),
        (models.JumboViT, {"dropout_rate": 1.0}, "dropout_rate"),
        (models.JumboViT, {"drop_path_rate": -0.5}, "drop_path_rate"),
        (models.JumboViT, {"token_drop_rate": 1.2}, "token_drop_rate"),
        (models.JumboViT, {"head": "cls"}, "head"),
        (models.ViT, {"head": "jumbo"}, "jumbo_multiplier"),
        (models.JumboViT, {"num_classes": 0}, "num_classes"),
        (models.JumboViT, {"patch_size": 0}, "patch_size"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(builder, kwargs, match):
    base = {k: v for k, v in TINY.items() if k not in kwargs}
    size = kwargs.pop("size", "pico")
    with pytest.raises((ValueError, TypeError), match=match):
        builder(size, **base, **kwargs)


def test_bad_inputs_at_call_time_raise():
    model = models.JumboViT("pico", **{**TINY, "jumbo_multiplier": 2})
    with pytest.raises(ValueError):
        model(np.zeros((2, 16, 16, 1), "float32"))
    with pytest.raises(ValueError):
        model(np.zeros((2, 16, 16), "float32"))


def test_create_model_errors():
    with pytest.raises(ValueError, match="jumbo_vit_giant"):
        models.create_model("jumbo_vit_giant")


@pytest.mark.large
def test_parameter_counts_reproduce_jumbo_table_3():
    """Jumbo paper Table 3: ViT-small, 224 px, ImageNet-21K (10450 classes).

    The paper's counts include the last block's patch FFN (its PyTorch
    module exists though the Jumbo head never reads it): 1,182,336
    parameters at width 384. Our default does not build it (§3.2: "we
    discard them"), so the table is reproduced with
    `last_block_patch_mlp=True`, and the default is checked to be exactly
    that FFN smaller.
    """
    common = dict(num_classes=10450, image_size=224)
    table = [
        (models.RegistersViT, dict(num_registers=16), 25.7e6),
        (models.JumboViT, dict(last_block_patch_mlp=True), 555.6e6),
        (
            models.JumboViT,
            dict(share_jumbo_mlp=True, last_block_patch_mlp=True),
            88.3e6,
        ),
        (
            models.JumboViT,
            dict(
                share_jumbo_mlp=True,
                jumbo_lora_rank=8,
                last_block_patch_mlp=True,
            ),
            88.8e6,
        ),
        (
            models.JumboViT,
            dict(
                share_jumbo_mlp=True,
                jumbo_lora_rank=32,
                last_block_patch_mlp=True,
            ),
            90.1e6,
        ),
    ]
    counts = []
    for builder, kwargs, expected in table:
        count = builder("small", **common, **kwargs).count_params()
        counts.append(count)
        assert abs(count - expected) / expected < 0.005, (kwargs, count)
    last_patch_ffn = 2 * 384 * 1536 + 1536 + 384 + 2 * 384  # FFN + norm2
    default = models.JumboViT(
        "small", share_jumbo_mlp=True, **common
    ).count_params()
    assert default == counts[2] - last_patch_ffn
    # LoRA adds exactly 2 * J*D * r per block.
    assert counts[3] - counts[2] == 12 * 2 * 2304 * 8
    assert counts[4] - counts[2] == 12 * 2 * 2304 * 32


@pytest.mark.large
def test_nano_builds_with_defaults():
    model = models.JumboViT("nano", num_classes=1000)
    encoder = model.encoder
    assert isinstance(encoder, TransformerEncoder)
    assert all(isinstance(b, JumboBlock) for b in encoder.blocks)
    assert encoder.blocks[0].jumbo_multiplier == 6
    assert encoder.blocks[0].jumbo_mlp_dim == 4 * 6 * 128
    assert tuple(model.input.shape) == (None, 224, 224, 3)


def test_training_step_counts_the_added_losses_and_then_releases_them(rng):
    # The Non-Deep ViT's diversity loss goes through `add_loss`. A training
    # step must add it to the loss it reports, and on PyTorch release it
    # afterwards: a loss tensor kept past the step made `torch.compile`
    # (`jit_compile=True`) recompile the step every time.
    model = models.NonDeepViT(
        depth=2,
        num_branches=2,
        num_classes=5,
        hidden_dim=16,
        num_heads=2,
        image_size=16,
        patch_size=8,
        initial_lambda=0.3,
        diversity_weight=2.0,
    )
    randomize_weights(model)
    x = rng.normal(size=(4, 16, 16, 3)).astype("float32")
    y = np.array([0, 1, 2, 4])
    logits = model(x, training=True)
    added = [keras.ops.convert_to_numpy(loss) for loss in model.losses]
    assert len(added) == 4 and all(value > 0 for value in added)
    cross_entropy = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True
    )(y, logits)
    expected = float(keras.ops.convert_to_numpy(cross_entropy)) + sum(added)
    model.compile(
        optimizer=keras.optimizers.SGD(0.0),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    reported = model.train_on_batch(x, y)
    assert_allclose(reported, expected, rtol=1e-5, atol=1e-5)
    if keras.backend.backend() == "torch":
        assert model.losses == []
