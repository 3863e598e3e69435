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
import shutil
import subprocess
import sys
import tempfile

QUANTIZE = (None, "float16", "dynamic_int8")


def _check_model(model):
    import keras

    if isinstance(model, (str, os.PathLike)):
        model = os.fspath(model)
        if not model.endswith(".keras"):
            raise ValueError(
                "`model` must be a keras.Model or the path of a `.keras` "
                f"file. Received: model={model!r}"
            )
        if not os.path.isfile(model):
            raise FileNotFoundError(
                f"No such model file. Received: model={model!r}"
            )
        return model
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras.Model or the path of a `.keras` file. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    return model


def check_tflite_convertible(model):
    """Refuse a model with Keras-quantised layers (`model.quantize(...)`):
    the TFLite converter has no kernel for their integer matmuls (it fails
    deep inside conversion). ONNX export takes them."""
    from keras_jumbo.models.base import check_not_quantized

    check_not_quantized(
        model,
        "export_tflite",
        reason="the TFLite converter has no kernels for Keras' quantised "
        "layers",
        remedy='Export the float model with `quantize="dynamic_int8"` '
        "(int8 weights) instead.",
    )


def _check_output(path, suffix):
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"`path` must be a file path ending in '{suffix}'. "
            f"Received: path={path!r}"
        )
    path = os.path.abspath(os.fspath(path))
    if not path.endswith(suffix):
        raise ValueError(f"`path` must end with '{suffix}'. Received: {path}")
    if os.path.isdir(path):
        raise ValueError(f"`path` is a directory. Received: {path}")
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        raise OSError(
            f"Cannot create the output directory {directory!r} ({error})."
        ) from error
    if not os.access(directory, os.W_OK):
        raise PermissionError(
            f"The output directory is not writable. Received: path={path}"
        )
    return path


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(
            f"`{name}` must be an int >= {low}. Received: {name}={value!r}"
        )


def _die_with_parent():
    """Runs in the worker before exec: on Linux, SIGTERM the worker when
    the parent dies (even by SIGKILL), so no export keeps running alone."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the worker ends with its own run
        pass


def _run_worker(model, path, fmt, quantize, batch_size, seed):
    """Export in a TensorFlow subprocess into a temporary file next to
    `path`, verify, then move it into place: an existing `path` is replaced
    only by a complete, verified export."""
    _check_int("batch_size", batch_size, 1)
    _check_int("seed", seed, 0)
    tmp = tempfile.mkdtemp(prefix="keras_jumbo_export_")
    root, suffix = os.path.splitext(path)
    partial = f"{root}.partial-{os.getpid()}{suffix}"
    try:
        saved = os.path.join(tmp, "model.keras")
        if isinstance(model, str):
            saved = model
        else:
            model.save(saved)
        report_path = os.path.join(tmp, "report.json")
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        command = [
            sys.executable,
            os.path.join(os.path.dirname(__file__), "_export_worker.py"),
            "--model",
            saved,
            "--output",
            partial,
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
            "--cleanup",
            tmp,
        ]
        result = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            preexec_fn=_die_with_parent if os.name == "posix" else None,
        )
        report = {}
        if os.path.isfile(report_path):
            with open(report_path) as handle:
                report = json.load(handle)
        if result.returncode != 0 or "error" in report:
            cause = report.get("error") or _first_error_line(
                result.stderr or result.stdout
            )
            tail = (result.stderr or result.stdout)[-3000:]
            raise RuntimeError(
                f"{fmt} export of {path} failed: {cause}\n"
                f"(nothing was written to {path}; worker log tail follows)\n"
                f"{tail}"
            )
        os.replace(partial, path)
        report["path"] = path
        return report
    finally:
        if os.path.exists(partial):
            os.remove(partial)
        shutil.rmtree(tmp, ignore_errors=True)


def _first_error_line(log):
    lines = [line.strip() for line in (log or "").splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "error:" in line:
            return line[:500]
    return lines[-1][:500] if lines else "the worker ended without a report"


def run_tflite(path, x, num_threads=None):
    """Run a `.tflite` file on the batch `x` with the LiteRT interpreter.

    The batch axis is resized to `x`'s; returns the first output (numpy).
    A float `x` of another precision (e.g. float64) is cast to the model's
    input dtype (float32).
    """
    import numpy as np

    x = np.asarray(x)
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
    wanted = np.dtype(inp["dtype"])
    if x.dtype != wanted:
        both_float = np.issubdtype(x.dtype, np.floating) and np.issubdtype(
            wanted, np.floating
        )
        if not both_float:
            raise TypeError(
                f"The model takes {wanted} input. Received: x of dtype "
                f"{x.dtype}"
            )
        x = x.astype(wanted)
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
    model = _check_model(model)
    if not isinstance(model, str):
        check_tflite_convertible(model)
    path = _check_output(path, ".tflite")
    return _run_worker(model, path, "tflite", quantize, batch_size, seed)


def export_onnx(model, path, batch_size=2, seed=0):
    """Export to ONNX (tf2onnx) and verify with onnxruntime.

    Returns the same report as `export_tflite`.
    """
    model = _check_model(model)
    path = _check_output(path, ".onnx")
    return _run_worker(model, path, "onnx", None, batch_size, seed)
