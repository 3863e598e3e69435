"""Every registered model, through one harness: coverage cannot drift.

Each `list_models()` name is built at a tiny size (same family and
structure, small widths) and must: be an instance of its model class,
have `get_config()` == its class's constructor arguments, round-trip
`from_config` and JSON serialisation, and pass `run_model_test` (finite
forward, a gradient for every weight, `.keras` save/load giving the class
back with identical outputs).
"""

import inspect
import json
import re
import warnings

import keras
import numpy as np
import pytest

from keras_jumbo import convert
from keras_jumbo import models
from keras_jumbo import nas
from keras_jumbo._keras_internals import sublayers
from keras_jumbo.models import base
from keras_jumbo.models.base import ConfiguredModel
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_model_test

MODEL_CLASSES = (
    models.ViT,
    models.RegistersViT,
    models.JumboViT,
    models.NonDeepViT,
    models.PatchTSTClassifier,
    models.PatchTSTForecaster,
    models.MSPatchTST,
    models.ViTRes,
    models.ViTResNAS,
    nas.ViTResSuperNet,
)

IMAGE = dict(hidden_dim=16, num_heads=2, depth=2, image_size=16, patch_size=8)
SERIES = dict(hidden_dim=16, num_heads=2, depth=1, mlp_dim=16)


# A tiny 3-stage ViT-Res architecture at 56 px (4x4, 2x2, 1x1 grids). The
# registered ViT-Res / ViT-ResNAS sizes differ only in their architecture
# tables, whose parameter counts the Table 3 tests check at full size.
TINY_ARCH = dict(
    stem_filters=4,
    embed_dims=(8, 12, 16),
    head_dims=(4, 4, 8),
    blocks=(((2, 16),), ((3, 24), (2, 12)), ((2, 32),)),
)
SIZE_SUFFIX = re.compile(r"_(pico|nano|tiny|small|base|medium)$")


def model_groups():
    """Registered names grouped by what differs at a tiny size.

    The sizes of one family are the same model once the tiny overrides
    replace their widths, so one of each group is built; every registered
    name belongs to exactly one group.
    """
    groups = {}
    for name in models.list_models():
        groups.setdefault(SIZE_SUFFIX.sub("", name), []).append(name)
    return groups


def tiny(name):
    """Overrides making `name` tiny, and an input batch for it."""
    rng = np.random.default_rng(0)
    if name.startswith(("vit_res", "vit_resnas")):
        x = rng.normal(size=(2, 56, 56, 3))
        return {"size": TINY_ARCH, "num_classes": 3, "image_size": 56}, x
    if name.startswith(("patchtst_forecaster", "ms_patchtst")):
        x = rng.normal(size=(2, 32, 2))
        return {
            "sequence_length": 32,
            "horizon": 8,
            "num_channels": 2,
            **SERIES,
        }, x
    if name.startswith("patchtst"):
        x = rng.normal(size=(2, 32, 2))
        return {
            "num_classes": 3,
            "sequence_length": 32,
            "num_channels": 2,
            **SERIES,
        }, x
    x = rng.normal(size=(2, 16, 16, 3))
    overrides = {**IMAGE, "num_classes": 3}
    if name.startswith("registers"):
        overrides["num_registers"] = 2
    if name.startswith("jumbo"):
        overrides["jumbo_multiplier"] = 2
    if name.startswith("non_deep"):
        overrides["depth"] = 1
    return overrides, x


def constructor_arguments(cls):
    """Argument names of `cls` and of the classes it forwards **kwargs to."""
    names = set()
    for klass in cls.__mro__:
        if klass is ConfiguredModel:
            break
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters
        names |= {
            n
            for n, p in parameters.items()
            if n != "self" and p.kind is not p.VAR_KEYWORD
        }
    return names


def normalised(config):
    return json.loads(json.dumps(config, default=lambda o: o.get_config()))


def test_every_registered_name_is_in_a_checked_group():
    grouped = sorted(n for names in model_groups().values() for n in names)
    assert grouped == models.list_models()


@pytest.mark.parametrize(
    "group", sorted(model_groups()), ids=lambda group: group
)
def test_every_registered_model_passes_the_model_checks(group):
    name = model_groups()[group][0]
    overrides, x = tiny(name)
    model = models.create_model(name, **overrides)
    cls = type(model)
    assert cls in MODEL_CLASSES, cls
    # Keras runs an extra eager forward pass before every predict / fit
    # step while any sublayer is unbuilt (e.g. a skipped rate-0 Dropout)
    assert [layer.name for layer in sublayers(model) if not layer.built] == []
    config = model.get_config()
    assert set(config) == constructor_arguments(cls) | {"name", "trainable"}
    assert cls.from_config(config).get_config() == config
    restored = keras.saving.deserialize_keras_object(
        json.loads(json.dumps(keras.saving.serialize_keras_object(model)))
    )
    assert type(restored) is cls
    assert normalised(restored.get_config()) == normalised(config)
    run_model_test(model, x.astype("float32"))


def test_the_supernet_is_a_model_class_too():
    space = nas.SearchSpace(
        embed_dims=((8, 6), (12, 8), (16, 12)),
        head_dims=(4, 4, 8),
        num_heads=((2, 1), (3, 2), (2, 1)),
        mlp_dims=((16, 8), (24, 12), (32, 16)),
        skippable=((False, True),) * 3,
        stem_filters=4,
    )
    model = nas.ViTResSuperNet(space, num_classes=3, image_size=56)
    config = model.get_config()
    assert config["space"] == space
    cls = nas.ViTResSuperNet
    assert set(config) == constructor_arguments(cls) | {"name", "trainable"}
    rng = np.random.default_rng(0)
    codes = np.stack([space.encode(space.largest())] * 2).astype("int32")
    inputs = {
        "images": rng.normal(size=(2, 56, 56, 3)).astype("float32"),
        "architecture": codes,
    }
    run_model_test(model, inputs)
    with pytest.raises(TypeError, match="space"):
        nas.ViTResSuperNet("tiny")


@pytest.mark.parametrize("cls", MODEL_CLASSES[:4])
def test_unknown_arguments_are_refused(cls):
    with pytest.raises(TypeError, match="hiden_dim"):
        cls(hiden_dim=8)


@pytest.mark.parametrize(
    "group", sorted(model_groups()), ids=lambda group: group
)
def test_every_model_refuses_a_non_positive_epsilon(group):
    """layer_norm_epsilon <= 0 built models whose outputs were all NaN."""
    name = model_groups()[group][0]
    overrides, _ = tiny(name)
    with pytest.raises(ValueError, match="layer_norm_epsilon"):
        models.create_model(name, **overrides, layer_norm_epsilon=-1.0)


def quantize(model, mode="int8"):
    with warnings.catch_warnings():
        # Keras warns for every layer without weights to quantise.
        warnings.simplefilter("ignore")
        model.quantize(mode)
    return model


# One model per distinct layer set (ViT/Jumbo blocks, branchy blocks,
# time-series blocks and fusion, multi-stage): every model quantises
# through the same two places, the attention layer's fallback to its
# sublayers' calls (tested in every Keras mode in the layer tests) and
# `ConfiguredModel`'s `quantization` config; eager quantised calls cost
# 10-30 s per model on JAX.
QUANTIZED_GROUPS = ("jumbo_vit", "non_deep_vit_6x2", "ms_patchtst", "vit_res")


@pytest.mark.parametrize("group", QUANTIZED_GROUPS)
def test_models_quantize_save_and_reload(group, tmp_path):
    """`model.quantize("int8")` (Keras' post-training quantisation) gives
    the float model's outputs to quantisation error, and the quantised
    model saves and reloads. Layers that read a Dense kernel directly
    used to take its int8 values without their scales: outputs off by
    50% to 10^4 x, silently."""
    name = model_groups()[group][0]
    overrides, x = tiny(name)
    x = x.astype("float32")
    model = models.create_model(name, **overrides)
    randomize_weights(model, scale=0.2)
    float_out = keras.ops.convert_to_numpy(model(x))
    quantize(model)
    quantized = base.quantized_layers(model)
    assert quantized and all(
        layer.quantization_mode == "int8" for layer in quantized.values()
    )
    out = keras.ops.convert_to_numpy(model(x))
    error = np.abs(out - float_out).max() / np.abs(float_out).max()
    assert error < 0.05, error
    config = model.get_config()
    assert sorted(config["quantization"]) == sorted(quantized)
    model.save(tmp_path / "model.keras")
    reloaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(reloaded) is type(model)
    assert sorted(base.quantized_layers(reloaded)) == sorted(quantized)
    assert_allclose(reloaded(x), out, atol=0, rtol=0)
    assert normalised(reloaded.get_config()) == normalised(config)


def test_quantization_argument_errors():
    overrides, _ = tiny("vit_tiny")
    with pytest.raises(TypeError, match="quantization"):
        models.ViT(**overrides, quantization=["int8"])
    with pytest.raises(ValueError, match="path='no/such/layer'"):
        models.ViT(**overrides, quantization={"no/such/layer": {}})


def test_transforms_refuse_a_quantized_model():
    """Code that reads float weights names the quantised layers instead of
    reading integers as floats."""
    overrides, _ = tiny("non_deep_vit_6x2")
    non_deep = quantize(models.create_model("non_deep_vit_6x2", **overrides))
    with pytest.raises(ValueError, match="reparameterize.*quantised layers"):
        convert.reparameterize(non_deep)
    official = quantize(
        convert.official_jumbo_model(
            "pico", image_size=16, patch_size=8, num_classes=3
        )
    )
    with pytest.raises(ValueError, match="with_config.*quantised layers"):
        models.with_image_size(official, 32)
    with pytest.raises(ValueError, match="load_official_jumbo.*quantised"):
        convert.load_official_jumbo(official, {})


@pytest.mark.parametrize(
    "group", sorted(model_groups()), ids=lambda group: group
)
def test_dtype_argument_reaches_every_layer(group):
    """`dtype="mixed_bfloat16"` builds every layer with that policy (it
    used to leave them all float32, silently) and is part of the config."""
    name = model_groups()[group][0]
    overrides, _ = tiny(name)
    model = models.create_model(name, **overrides, dtype="mixed_bfloat16")
    policies = {layer.dtype_policy.name for layer in sublayers(model)}
    assert policies == {"mixed_bfloat16"}
    assert model.get_config()["dtype"] == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == "float32"  # restored
    assert "dtype" not in models.create_model(name, **overrides).get_config()


def assert_bfloat16_model_computes(model, x, expected, path):
    """`model(x)` is bfloat16, `expected` (the float function) to
    bfloat16 error, and the same bits after a `.keras` save and reload;
    returns the reloaded model."""
    out = model(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    out = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32"))
    error = np.abs(out - expected).max() / np.abs(expected).max()
    assert error < 0.05, error
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert_allclose(keras.ops.cast(reloaded(x), "float32"), out, atol=0, rtol=0)
    return reloaded


@pytest.mark.parametrize("group", QUANTIZED_GROUPS)
def test_mixed_precision_model_computes_the_float_function(group, tmp_path):
    name = model_groups()[group][0]
    overrides, x = tiny(name)
    x = x.astype("float32")
    model = models.create_model(name, **overrides)
    randomize_weights(model, scale=0.2)
    mixed = models.create_model(name, **overrides, dtype="mixed_bfloat16")
    mixed.set_weights(model.get_weights())
    assert all(w.dtype == "float32" for w in mixed.weights)
    expected = keras.ops.convert_to_numpy(model(x))
    reloaded = assert_bfloat16_model_computes(
        mixed, x, expected, tmp_path / "mixed.keras"
    )
    assert reloaded.get_config()["dtype"] == "mixed_bfloat16"


@pytest.mark.parametrize("group", ("jumbo_vit", "non_deep_vit_6x2"))
def test_with_config_makes_a_bfloat16_copy_for_inference(group, tmp_path):
    """`with_config(model, dtype="bfloat16")` stores every weight of a
    trained (here `mixed_bfloat16`) model in bfloat16: each is the float32
    weight rounded to bfloat16, the head kept, and the copy computes the
    float function to bfloat16 error (the recommended inference copy on
    JAX's CPU: no per-step cast of the float32 kernels)."""
    name = model_groups()[group][0]
    overrides, x = tiny(name)
    x = x.astype("float32")
    mixed = models.create_model(name, **overrides, dtype="mixed_bfloat16")
    randomize_weights(mixed, scale=0.2)
    copy, head_kept = models.with_config(mixed, dtype="bfloat16")
    assert head_kept
    assert copy.get_config()["dtype"] == "bfloat16"
    assert len(copy.weights) == len(mixed.weights)
    for old, new in zip(mixed.weights, copy.weights, strict=True):
        # ProgressiveJoin keeps its λ (the schedule's value) in float32.
        kept = "float32" if new.path.endswith("join_lambda") else "bfloat16"
        assert new.dtype == kept, new.path
        rounded = keras.ops.cast(keras.ops.cast(old, kept), "float32")
        assert_allclose(keras.ops.cast(new, "float32"), rounded, atol=0, rtol=0)
    float_model, _ = models.with_config(mixed, dtype="float32")
    expected = keras.ops.convert_to_numpy(float_model(x))
    reloaded = assert_bfloat16_model_computes(
        copy, x, expected, tmp_path / "bf16.keras"
    )
    dtypes = [w.dtype for w in copy.weights]
    assert [w.dtype for w in reloaded.weights] == dtypes


def test_dtype_argument_errors():
    overrides, _ = tiny("vit_tiny")
    with pytest.raises(ValueError, match="dtype='bogus'"):
        models.ViT(**overrides, dtype="bogus")
    with pytest.raises(ValueError, match="model.quantize"):
        models.ViT(**overrides, dtype="int8_from_float32")
    assert keras.config.dtype_policy().name == "float32"
