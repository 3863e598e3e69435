"""TFLite / ONNX export: files run in LiteRT and onnxruntime, match Keras."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from keras_jumbo.convert import export_onnx
from keras_jumbo.convert import export_tflite
from keras_jumbo.convert import reparameterize
from keras_jumbo.convert import run_tflite
from keras_jumbo.convert import set_join_lambda
from keras_jumbo.models import JumboViT
from keras_jumbo.models import MSPatchTST
from keras_jumbo.models import NonDeepViT
from keras_jumbo.models import PatchTSTClassifier
from keras_jumbo.models import ViTRes
from keras_jumbo.models import with_image_size
from keras_jumbo.testing import assert_allclose
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


def test_resized_model_exports_and_runs_in_litert(jumbo_model, tmp_path):
    """Train at one size, deploy at another: the resized model carries its
    resampled position table as a plain weight, so the graph has no
    resampling op and exports with TFLite builtins."""
    resized = with_image_size(jumbo_model, 24)
    path = tmp_path / "resized.tflite"
    report = export_tflite(resized, path)
    assert report["max_abs_diff"] <= 1e-4
    x = np.random.default_rng(3).normal(size=(3, 24, 24, 3))  # float64
    got = run_tflite(path, x)  # cast to the model's float32 input
    assert_allclose(got, resized(x.astype("float32")), atol=1e-4)
    assert export_onnx(resized, tmp_path / "r.onnx")["max_abs_diff"] <= 1e-4
    with pytest.raises(TypeError, match="float32 input.*int64"):
        run_tflite(path, np.zeros((1, 24, 24, 3), "int64"))


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


def test_keras_quantized_model_exports_to_onnx_not_tflite(
    jumbo_model, tmp_path
):
    """`model.quantize("int8")`: ONNX takes its integer matmuls; the TFLite
    converter has no kernel for them, so export_tflite refuses the model
    before converting, in the caller and from a saved `.keras` file."""
    import warnings

    model = JumboViT.from_config(jumbo_model.get_config())
    model.set_weights(jumbo_model.get_weights())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    report = export_onnx(model, tmp_path / "q.onnx")
    assert report["max_abs_diff"] <= 1e-4
    with pytest.raises(ValueError, match="quantised layers.*dynamic_int8"):
        export_tflite(model, tmp_path / "q.tflite")
    model.save(tmp_path / "q.keras")
    with pytest.raises(RuntimeError, match="quantised layers"):
        export_tflite(str(tmp_path / "q.keras"), tmp_path / "q.tflite")
    assert not (tmp_path / "q.tflite").exists()


def test_export_errors(jumbo_model, tmp_path):
    with pytest.raises(ValueError, match="quantize"):
        export_tflite(jumbo_model, tmp_path / "x.tflite", quantize="int4")
    with pytest.raises(ValueError, match="tflite"):
        export_tflite(jumbo_model, tmp_path / "x.onnx")
    with pytest.raises(ValueError, match="onnx"):
        export_onnx(jumbo_model, tmp_path / "x.tflite")
    # Refused before the (seconds long) conversion starts.
    with pytest.raises(TypeError, match="model=42"):
        export_tflite(42, tmp_path / "x.tflite")
    with pytest.raises(FileNotFoundError, match="missing.keras"):
        export_tflite(str(tmp_path / "missing.keras"), tmp_path / "x.tflite")
    with pytest.raises(TypeError, match="path=None"):
        export_tflite(jumbo_model, None)
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OSError, match="output directory"):
        export_tflite(jumbo_model, blocker / "x.tflite")
    with pytest.raises(ValueError, match="batch_size=0"):
        export_onnx(jumbo_model, tmp_path / "x.onnx", batch_size=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_failed_export_says_why_first_and_keeps_the_old_file(tmp_path):
    import keras

    # Antialiased resizing lowers to ScaleAndTranslate: no TFLite builtin.
    inputs = keras.Input((16, 16, 3))
    x = keras.layers.Resizing(8, 8, antialias=True)(inputs)
    model = keras.Model(inputs, keras.layers.Flatten()(x))
    out = tmp_path / "m.tflite"
    out.write_bytes(b"an earlier export")
    with pytest.raises(RuntimeError) as caught:
        export_tflite(model, out)
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"tflite export of {out} failed: ")
    assert "ScaleAndTranslate" in first, first
    assert out.read_bytes() == b"an earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tflite"]


def _worker_pids(marker):
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().decode(errors="ignore")
        except OSError:
            continue
        if "_export_worker" in command and marker in command:
            pids.append(int(entry))
    return pids


@pytest.mark.once
def test_killed_parent_leaves_no_worker_and_no_temporary_files(
    jumbo_model, tmp_path
):
    # Linux, as the project's machines and CI: the worker dies with its
    # parent by the parent-death signal; processes are read from /proc.
    saved = tmp_path / "model.keras"
    jumbo_model.save(saved)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = tmp_path / "out" / "killed.tflite"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from keras_jumbo.convert import export_tflite; "
            "export_tflite(sys.argv[1], sys.argv[2])",
            str(saved),
            str(out),
        ],
        env=dict(os.environ, TMPDIR=str(scratch)),
    )
    try:
        deadline = time.time() + 120
        while not _worker_pids(str(out.parent)) and time.time() < deadline:
            assert parent.poll() is None, "the export ended before the test"
            time.sleep(0.2)
        assert _worker_pids(str(out.parent)), "no export worker started"
        time.sleep(2.0)  # the worker is importing TensorFlow / converting
        parent.kill()
        parent.wait()
        deadline = time.time() + 120
        while _worker_pids(str(out.parent)) and time.time() < deadline:
            time.sleep(0.5)
        assert not _worker_pids(str(out.parent)), "worker still running"
        assert list(scratch.iterdir()) == []
        assert not out.parent.exists() or list(out.parent.iterdir()) == []
    finally:
        if parent.poll() is None:
            parent.kill()


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
