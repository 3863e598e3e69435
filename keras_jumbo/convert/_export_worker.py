"""Subprocess side of `keras_jumbo.convert.export` (TensorFlow backend)."""

import argparse
import json
import os


def _missing(package, extra="export"):
    return ImportError(
        f"Exporting needs `{package}`: pip install 'keras-jumbo[{extra}]'"
    )


def _tflite(model, path, quantize):
    try:
        import tensorflow as tf
    except ImportError as error:
        raise _missing("tensorflow-cpu") from error
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


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--format", choices=["tflite", "onnx"], required=True)
    parser.add_argument("--quantize", default="none")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()

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
