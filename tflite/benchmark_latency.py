"""CPU latency of .tflite files with the LiteRT interpreter.

Two modes:

1. Files you give: `python tflite/benchmark_latency.py a.tflite b.tflite`
   prints, per file, the median single-thread batch-1 latency (after
   warm-up) and batch-32 throughput.

2. `--non-deep`: builds the Non-Deep ViT comparison of the paper (Table 1:
   reparameterised D-6-R at 41.7 ms vs DeiT-Tiny at 66.1 ms on one Intel
   i9-9900X thread, ratio 0.63), exports three float32 models with random
   weights -- the reparameterised NonDeepViT-6 (6x2), a 12-layer DeiT-Tiny
   and a plain 6-layer DeiT (width 192, 12 heads, 224 px, average pooling,
   as the paper's setup) -- and prints their latencies and ratios next to
   their MAC ratios.

Command (about 5 minutes on 2 CPU cores):
    python tflite/benchmark_latency.py --non-deep --repeats 20
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np


def interpreter_for(path, batch, threads):
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=path, num_threads=threads)
    inp = interpreter.get_input_details()[0]
    shape = [batch] + list(inp["shape_signature"][1:])
    interpreter.resize_tensor_input(inp["index"], shape)
    interpreter.allocate_tensors()
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    interpreter.set_tensor(inp["index"], x)
    return interpreter


def median_latency_ms(path, batch=1, threads=1, warmup=5, repeats=30):
    interpreter = interpreter_for(path, batch, threads)
    for _ in range(warmup):
        interpreter.invoke()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        interpreter.invoke()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def report(paths, threads, warmup, repeats):
    rows = {}
    print(f"{'file':<40} {'b=1 ms':>9} {'b=32 img/s':>11}")
    for path in paths:
        latency = median_latency_ms(path, 1, threads, warmup, repeats)
        batch_ms = median_latency_ms(path, 32, threads, 2, max(3, repeats // 5))
        rows[path] = (latency, 32000.0 / batch_ms)
        name = os.path.basename(path)
        print(f"{name:<40} {latency:>9.2f} {rows[path][1]:>11.1f}")
    return rows


def non_deep_comparison(threads, warmup, repeats):
    os.environ.setdefault("KERAS_BACKEND", "tensorflow")
    import keras_jumbo as kj
    from keras_jumbo.testing import randomize_weights

    # NonDeepViT's defaults are the paper's setup: DeiT-Tiny geometry (width
    # 192, 12 heads, 224 px, patch 16, average pooling), 1000 classes.
    branchy = kj.models.NonDeepViT(6, 2)
    randomize_weights(branchy)
    kj.convert.set_join_lambda(branchy, 1.0)

    def plain(depth):
        # One-branch NonDeepViT, reparameterised: the same stock Keras
        # layers as the collapsed model, so only depth and widths differ.
        model = kj.models.NonDeepViT(depth, 1)
        return kj.convert.reparameterize(model, pad_values=False)

    models = {
        "NonDeepViT-6x2 (reparameterised)": kj.convert.reparameterize(
            branchy, pad_values=False
        ),
        "DeiT-Tiny (12 layers)": plain(12),
        "DeiT-6 (plain)": plain(6),
    }
    # The library's one counter (keras_jumbo.models.count_macs).
    macs = {name: kj.models.count_macs(m) for name, m in models.items()}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, model in models.items():
            path = os.path.join(tmp, name.split()[0] + ".tflite")
            kj.convert.export_tflite(model, path)
            latency = median_latency_ms(path, 1, threads, warmup, repeats)
            results[name] = latency
            print(
                f"{name:<36} {model.count_params() / 1e6:6.2f}M params "
                f"{macs[name] / 1e6:8.1f}M MACs {latency:8.2f} ms",
                flush=True,
            )
    ours = results["NonDeepViT-6x2 (reparameterised)"]
    for baseline in ("DeiT-Tiny (12 layers)", "DeiT-6 (plain)"):
        print(
            f"latency ratio NonDeepViT-6x2 / {baseline}: "
            f"{ours / results[baseline]:.3f}   MAC ratio: "
            f"{macs['NonDeepViT-6x2 (reparameterised)'] / macs[baseline]:.3f}"
        )
    print("paper (Table 1, i9-9900X, 1 thread): 41.7 / 66.1 ms = 0.63")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--non-deep", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.non_deep:
        non_deep_comparison(args.threads, args.warmup, args.repeats)
    elif args.paths:
        report(args.paths, args.threads, args.warmup, args.repeats)
    else:
        parser.error("give .tflite paths or --non-deep")
    return 0


if __name__ == "__main__":
    sys.exit(main())
