"""TFLite / ONNX export: files run in LiteRT and onnxruntime, match Keras."""

import json
import subprocess
import sys

import numpy as np
import pytest

from keras_jumbo.convert import export_onnx
from keras_jumbo.convert import export_tflite
from keras_jumbo.convert import reparameterize
from keras_jumbo.convert import set_join_lambda
from keras_jumbo.models import JumboViT
from keras_jumbo.models import MSPatchTST
from keras_jumbo.models import NonDeepViT
from keras_jumbo.models import PatchTSTClassifier
from keras_jumbo.models import ViTRes
from keras_jumbo.testing import randomize_weights

TINY = dict(
    hidden_dim=16, num_heads=2, image_size=16, patch_size=8, num_classes=5
)


@pytest.fixture(scope="module")
def plain_model():
    model = NonDeepViT(2, 2, **TINY)
    randomize_weights(model)
    set_join_lambda(model, 1.0)
    return reparameterize(model)


@pytest.fixture(scope="module")
def jumbo_model():
    model = JumboViT("pico", depth=2, jumbo_multiplier=2, **TINY)
    randomize_weights(model)
    return model


@pytest.fixture(scope="module")
def jumbo_tflite(jumbo_model, tmp_path_factory):
    """The float32 TFLite export of `jumbo_model`, converted once."""
    path = tmp_path_factory.mktemp("jumbo") / "j.tflite"
    return export_tflite(jumbo_model, path)


def test_reparameterized_non_deep_vit_exports_exactly(plain_model, tmp_path):
    report = export_tflite(plain_model, tmp_path / "plain.tflite")
    assert report["max_abs_diff"] <= 1e-4
    assert report["argmax_agreement"] == 1.0
    report = export_onnx(plain_model, tmp_path / "plain.onnx")
    assert report["max_abs_diff"] <= 1e-4


def test_jumbo_vit_exports_exactly(jumbo_model, jumbo_tflite, tmp_path):
    assert jumbo_tflite["max_abs_diff"] <= 1e-4
    assert export_onnx(jumbo_model, tmp_path / "j.onnx")["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize(
    "builder,kwargs",
    [
        # PatchTST+Jumbo classifier, ViT blocks.
        (PatchTSTClassifier, dict(num_classes=3, jumbo_multiplier=2)),
        # MS-PatchTST: RevIN, BatchNorm, post-norm, residual attention.
        (MSPatchTST, dict(horizon=8, patch_length=8, stride=4)),
    ],
)
def test_time_series_models_export_exactly(builder, kwargs, tmp_path):
    model = builder(
        sequence_length=32,
        num_channels=2,
        hidden_dim=16,
        num_heads=2,
        depth=2,
        mlp_dim=32,
        **kwargs,
    )
    randomize_weights(model)
    assert export_tflite(model, tmp_path / "t.tflite")["max_abs_diff"] <= 1e-4
    assert export_onnx(model, tmp_path / "t.onnx")["max_abs_diff"] <= 1e-4


def test_vit_res_and_extracted_subnet_export_exactly(tmp_path):
    # Conv stem (BatchNorm), residual spatial reductions, masked layer
    # norms, attention with head_dim != width / heads.
    model = ViTRes(
        dict(
            stem_filters=4,
            embed_dims=(8, 12, 16),
            head_dims=(4, 4, 8),
            blocks=(((2, 16),), ((3, 24),), ((2, 32),)),
        ),
        num_classes=5,
        image_size=56,
    )
    randomize_weights(model)
    assert export_tflite(model, tmp_path / "r.tflite")["max_abs_diff"] <= 1e-4
    assert export_onnx(model, tmp_path / "r.onnx")["max_abs_diff"] <= 1e-4


@pytest.mark.parametrize("quantize", ["float16", "dynamic_int8"])
def test_quantized_exports_stay_close_and_shrink(
    jumbo_model, jumbo_tflite, tmp_path, quantize
):
    small = export_tflite(
        jumbo_model, tmp_path / f"{quantize}.tflite", quantize=quantize
    )
    assert small["size_bytes"] < jumbo_tflite["size_bytes"]
    # Measured drift is reported; bounded well below the logit scale.
    assert small["max_abs_diff"] < 0.05 * small["max_abs_output"]


def test_export_errors(jumbo_model, tmp_path):
    with pytest.raises(ValueError, match="quantize"):
        export_tflite(jumbo_model, tmp_path / "x.tflite", quantize="int4")
    with pytest.raises(ValueError, match="tflite"):
        export_tflite(jumbo_model, tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="onnx"):
        export_onnx(jumbo_model, tmp_path / "x.tflite")


def test_command_line_reparameterizes_and_exports(tmp_path):
    model = NonDeepViT(1, 2, **TINY)
    randomize_weights(model)
    set_join_lambda(model, 1.0)
    model.save(tmp_path / "branchy.keras")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keras_jumbo.cli",
            "export",
            str(tmp_path / "branchy.keras"),
            "--reparameterize",
            "--tflite",
            str(tmp_path / "plain.tflite"),
            "--quantize",
            "int8",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["quantize"] == "dynamic_int8"
    assert np.isfinite(report["max_abs_diff"])
