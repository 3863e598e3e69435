"""The `keras-jumbo` command line.

keras-jumbo export model.keras [--reparameterize [--force]]
    [--tflite out.tflite] [--quantize none|float16|dynamic_int8]
    [--onnx out.onnx] [--save-keras plain.keras]
keras-jumbo count MODEL [--reparameterize] [--layers]
    MODEL is a .keras file or a registered name (`jumbo_vit_nano`).
"""

import argparse
import json
import os
import sys


class UsageError(Exception):
    """A wrong command line: one line on stderr, exit status 2."""


def _export(args):
    import keras

    import keras_jumbo

    model = keras.saving.load_model(args.model)
    if args.reparameterize:
        try:
            model = keras_jumbo.convert.reparameterize(
                model, force=args.force, pad_values=False
            )
        except ValueError as error:
            # Speak the command line's language, not the Python API's.
            raise ValueError(
                str(error).replace("pass force=True", "pass --force")
            ) from None
        print(f"reparameterized: {model.count_params():,} parameters")
    if args.save_keras:
        model.save(args.save_keras)
        print(f"saved {args.save_keras}")
    reports = []
    if args.tflite:
        quantize = None if args.quantize == "none" else args.quantize
        reports.append(
            keras_jumbo.convert.export_tflite(
                model, args.tflite, quantize=quantize
            )
        )
    if args.onnx:
        reports.append(keras_jumbo.convert.export_onnx(model, args.onnx))
    for report in reports:
        print(json.dumps(report))
    return 0


def _load(name_or_path):
    import keras

    import keras_jumbo

    if name_or_path.endswith(".keras"):
        return keras.saving.load_model(name_or_path)
    if os.path.exists(name_or_path):
        raise UsageError(
            f"{name_or_path} is a file but not a .keras model (give a "
            ".keras file or a registered name such as jumbo_vit_nano)"
        )
    return keras_jumbo.models.create_model(name_or_path)


def _check_export_args(args):
    if not (args.tflite or args.onnx or args.save_keras):
        raise UsageError("nothing to do: give --tflite, --onnx or --save-keras")
    if args.force and not args.reparameterize:
        raise UsageError("--force only applies with --reparameterize")
    if args.quantize != "none" and not args.tflite:
        raise UsageError(
            f"--quantize {args.quantize} only applies to --tflite "
            "(ONNX exports are float32)"
        )
    if not args.model.endswith(".keras"):
        raise UsageError(f"{args.model} is not a .keras model file")


def _count(args):
    import keras_jumbo

    model = _load(args.model)
    if args.reparameterize:
        model = keras_jumbo.convert.reparameterize(
            model, force=True, pad_values=False
        )
    if args.layers:
        for name, kind, macs in keras_jumbo.models.mac_report(model):
            print(f"{name:<32} {kind:<28} {macs:>16,}")
    macs = keras_jumbo.models.count_macs(model)
    print(
        f"{model.name}: {model.count_params():,} parameters, "
        f"{macs:,} MACs per example ({macs / 1e9:.3f} G)"
    )
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="keras-jumbo")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser(
        "export", help="export a .keras model to TFLite and/or ONNX"
    )
    export.add_argument("model", help="path of a .keras model")
    export.add_argument(
        "--reparameterize",
        action="store_true",
        help="collapse a branchy NonDeepViT into a plain ViT first",
    )
    export.add_argument(
        "--force",
        action="store_true",
        help="reparameterize even if λ < 1 (gives the λ=1 function)",
    )
    export.add_argument("--tflite", help="output .tflite path")
    export.add_argument(
        "--quantize",
        default="none",
        choices=["none", "float16", "dynamic_int8", "int8"],
        help="TFLite weight quantisation ('int8' means dynamic_int8)",
    )
    export.add_argument("--onnx", help="output .onnx path")
    export.add_argument(
        "--save-keras", help="also save the (reparameterized) model"
    )
    count = commands.add_parser(
        "count", help="parameters and multiply-accumulates of a model"
    )
    count.add_argument("model", help="a .keras path or a registered name")
    count.add_argument(
        "--reparameterize",
        action="store_true",
        help="count the collapsed (λ=1) form of a branchy NonDeepViT",
    )
    count.add_argument(
        "--layers", action="store_true", help="also print per-layer MACs"
    )
    args = parser.parse_args(argv)
    try:
        if args.model.endswith(".keras") and not os.path.exists(args.model):
            raise UsageError(f"no such file: {args.model}")
        if args.command == "count":
            return _count(args)
        if args.quantize == "int8":
            args.quantize = "dynamic_int8"
        _check_export_args(args)
        return _export(args)
    except UsageError as error:
        print(f"keras-jumbo: error: {error}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError, RuntimeError) as error:
        print(f"keras-jumbo: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
