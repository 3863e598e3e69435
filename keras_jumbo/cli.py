"""The `keras-jumbo` command line.

keras-jumbo export model.keras [--reparameterize [--force]]
    [--tflite out.tflite] [--quantize none|float16|dynamic_int8]
    [--onnx out.onnx] [--save-keras plain.keras]
"""

import argparse
import json
import sys


def _export(args):
    import keras

    import keras_jumbo

    model = keras.saving.load_model(args.model)
    if args.reparameterize:
        model = keras_jumbo.convert.reparameterize(
            model, force=args.force, pad_values=False
        )
        print(f"reparameterized: {model.count_params():,} parameters")
    if args.save_keras:
        model.save(args.save_keras)
        print(f"saved {args.save_keras}")
    if not (args.tflite or args.onnx):
        if not args.save_keras:
            raise SystemExit(
                "nothing to do: give --tflite, --onnx or --save-keras"
            )
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
    args = parser.parse_args(argv)
    if args.quantize == "int8":
        args.quantize = "dynamic_int8"
    if args.command == "export":
        return _export(args)
    return 1


if __name__ == "__main__":
    sys.exit(main())
