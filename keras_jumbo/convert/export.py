"""Export keras_jumbo models to TFLite (LiteRT) and ONNX, and verify them.

Whatever backend a model was trained on, it is saved as `.keras` and
reloaded in a subprocess with `KERAS_BACKEND=tensorflow` (JAX cannot export
LiteRT directly), exported there, and the exported file is run (LiteRT
interpreter / onnxruntime) on random inputs and compared with the reloaded
Keras model. TFLite export is restricted to TFLite builtin ops: an op
without a builtin fails the export instead of silently becoming a Flex op
that no plain interpreter can run.
"""

import json
import os
import subprocess
import sys
import tempfile

QUANTIZE = (None, "float16", "dynamic_int8")


def _run_worker(model, path, fmt, quantize, batch_size, seed):
    path = os.path.abspath(os.fspath(path))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "model.keras")
        if isinstance(model, (str, os.PathLike)):
            saved = os.fspath(model)
        else:
            model.save(saved)
        report_path = os.path.join(tmp, "report.json")
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        command = [
            sys.executable,
            "-m",
            "keras_jumbo.convert._export_worker",
            "--model",
            saved,
            "--output",
            path,
            "--format",
            fmt,
            "--quantize",
            quantize or "none",
            "--batch-size",
            str(batch_size),
            "--seed",
            str(seed),
            "--report",
            report_path,
        ]
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            tail = (result.stderr or result.stdout)[-3000:]
            raise RuntimeError(f"{fmt} export failed:\n{tail}")
        with open(report_path) as handle:
            return json.load(handle)


def run_tflite(path, x, num_threads=None):
    """Run a `.tflite` file on the batch `x` with the LiteRT interpreter.

    The batch axis is resized to `x`'s; returns the first output (numpy).
    """
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError as error:
        raise ImportError(
            "Running .tflite files needs `ai-edge-litert`: "
            "pip install 'keras-jumbo[export]'"
        ) from error
    interpreter = Interpreter(
        model_path=os.fspath(path), num_threads=num_threads
    )
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    interpreter.resize_tensor_input(inp["index"], x.shape)
    interpreter.allocate_tensors()
    interpreter.set_tensor(inp["index"], x)
    interpreter.invoke()
    return interpreter.get_tensor(out["index"])


def export_tflite(model, path, quantize=None, batch_size=2, seed=0):
    """Export to a `.tflite` file (LiteRT builtins only) and verify it.

    Args:
        model: a `keras.Model` (any backend) or the path of a `.keras` file.
        path: output path ending in `.tflite`.
        quantize: None (float32), `"float16"` (float16 weights), or
            `"dynamic_int8"` (dynamic-range int8 weights). Full-integer int8
            is not offered: it degrades transformers badly (LayerNorm,
            softmax).
        batch_size: batch of the random verification input; the exported
            model has a dynamic batch axis.
        seed: seed of the verification input.

    Returns:
        A report dict: `path`, `size_bytes`, `max_abs_diff` (TFLite vs Keras
        on the verification batch), `argmax_agreement`, `quantize`.
    """
    if quantize not in QUANTIZE:
        raise ValueError(
            f"`quantize` must be one of {QUANTIZE}. Received: "
            f"quantize={quantize!r}"
        )
    if not os.fspath(path).endswith(".tflite"):
        raise ValueError(f"`path` must end with '.tflite'. Received: {path}")
    return _run_worker(model, path, "tflite", quantize, batch_size, seed)


def export_onnx(model, path, batch_size=2, seed=0):
    """Export to ONNX (tf2onnx) and verify with onnxruntime.

    Returns the same report as `export_tflite`.
    """
    if not os.fspath(path).endswith(".onnx"):
        raise ValueError(f"`path` must end with '.onnx'. Received: {path}")
    return _run_worker(model, path, "onnx", None, batch_size, seed)
