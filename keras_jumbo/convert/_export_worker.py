"""Subprocess side of `keras_jumbo.convert.export` (TensorFlow backend).

Run as a script (not `-m keras_jumbo...`), so that the parent-death handler
is installed before the package (Keras, TensorFlow) is imported.
"""

import argparse
import json
import os
import sys

if (
    __name__ == "__main__"
    and sys.path
    and sys.path[0] == os.path.dirname(os.path.abspath(__file__))
):
    del sys.path[0]  # this directory's modules are not top-level modules


def _missing(package, extra="export"):
    return ImportError(
        f"Exporting needs `{package}`: pip install 'keras-jumbo[{extra}]'"
    )


def _tflite(model, path, quantize):
    try:
        import tensorflow as tf
    except ImportError as error:
        raise _missing("tensorflow-cpu") from error
    from keras_jumbo.convert.export import check_tflite_convertible

    check_tflite_convertible(model)
    target_spec = {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]}
    kwargs = {}
    if quantize == "float16":
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
        target_spec["supported_types"] = [tf.float16]
    elif quantize == "dynamic_int8":
        kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
    model.export(
        path, format="litert", verbose=False, target_spec=target_spec, **kwargs
    )


def _onnx(model, path):
    try:
        import tf2onnx  # noqa: F401
    except ImportError as error:
        raise _missing("tf2onnx") from error
    model.export(path, format="onnx", verbose=False)


def _run_onnx(path, x):
    try:
        import onnxruntime
    except ImportError as error:
        raise _missing("onnxruntime") from error
    session = onnxruntime.InferenceSession(
        path, providers=["CPUExecutionProvider"]
    )
    name = session.get_inputs()[0].name
    return session.run(None, {name: x})[0]


def _cause(error):
    """One line saying why: the MLIR/converter `error:` line if there is
    one (e.g. an op without a TFLite builtin), else the exception."""
    text = str(error)
    for line in text.splitlines():
        if "error:" in line:
            return f"{type(error).__name__}: {line.strip()[:500]}"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"{type(error).__name__}: {first[:500]}"


def _on_parent_death(cleanup, output):
    """SIGTERM (sent when the parent dies): remove the temporary files."""
    import shutil
    import signal

    def handler(signum, frame):
        shutil.rmtree(cleanup, ignore_errors=True)
        if os.path.exists(output):
            os.remove(output)
        os._exit(143)

    signal.signal(signal.SIGTERM, handler)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--format", choices=["tflite", "onnx"], required=True)
    parser.add_argument("--quantize", default="none")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", required=True)
    parser.add_argument("--cleanup", default=None)
    args = parser.parse_args()
    if args.cleanup:
        _on_parent_death(args.cleanup, args.output)
    try:
        _export(args)
    except Exception as error:
        with open(args.report, "w") as handle:
            json.dump({"error": _cause(error)}, handle)
        raise


def _export(args):
    import keras
    import numpy as np

    import keras_jumbo  # noqa: F401  (registers the custom layers)

    model = keras.saving.load_model(args.model)
    quantize = None if args.quantize == "none" else args.quantize
    shape = (args.batch_size,) + tuple(model.inputs[0].shape[1:])
    x = np.random.default_rng(args.seed).normal(size=shape).astype("float32")
    # Calling the model first also marks it as called for the ONNX exporter.
    expected = keras.ops.convert_to_numpy(model(x, training=False))
    if args.format == "tflite":
        _tflite(model, args.output, quantize)
    else:
        _onnx(model, args.output)
    from keras_jumbo.convert.export import run_tflite

    runner = run_tflite if args.format == "tflite" else _run_onnx
    got = np.asarray(runner(args.output, x))
    report = {
        "path": args.output,
        "format": args.format,
        "quantize": quantize,
        "size_bytes": os.path.getsize(args.output),
        "max_abs_diff": float(np.max(np.abs(got - expected))),
        "max_abs_output": float(np.max(np.abs(expected))),
    }
    if expected.ndim == 2:
        report["argmax_agreement"] = float(
            np.mean(got.argmax(-1) == expected.argmax(-1))
        )
    with open(args.report, "w") as handle:
        json.dump(report, handle)


if __name__ == "__main__":
    main()
