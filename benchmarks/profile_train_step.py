"""Where a JAX training step's time goes, op by op and layer by layer.

Runs `model.train_on_batch` (Keras' compiled train step: forward, loss,
backward, AdamW) under `jax.profiler.trace`, reads the time of every XLA
CPU thunk from the trace, and attributes each thunk to the layer and
phase that produced it through the HLO metadata of the optimised train
step (`XLA_FLAGS=--xla_dump_to`): forward (`jvp(...)`), backward
(`transpose(jvp(...))`), optimizer, or other (thunks without metadata,
e.g. layout copies, attributed through the instruction that reads them).

Thunks run on a pool of threads (2 here), so the summed thunk time can
exceed the step's wall time; the shares are of the summed time.

    KERAS_BACKEND=jax python benchmarks/profile_train_step.py \\
        [--model official_jumbo_pico] [--batch 32] [--image-size 128] \\
        [--step train|predict]

Models: `official_jumbo_pico` (the `vs_official.py` model), `vit_pico`,
`registers_pico`, `non_deep_6x2` (224 px in the paper; any size here) and
`vit_tiny_12` (its same-MACs deep counterpart).
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

MODELS = (
    "official_jumbo_pico",
    "vit_pico",
    "registers_pico",
    "non_deep_6x2",
    "vit_tiny_12",
)


def build(name, image_size, num_classes):
    from keras_jumbo import convert
    from keras_jumbo import models

    common = dict(image_size=image_size, num_classes=num_classes)
    if name == "official_jumbo_pico":
        return convert.official_jumbo_model("pico", **common)
    if name == "vit_pico":
        return models.ViT("pico", **common)
    if name == "registers_pico":
        return models.RegistersViT("pico", **common)
    if name == "non_deep_6x2":
        return models.NonDeepViT(6, 2, **common)
    if name == "vit_tiny_12":
        return models.ViT(
            "tiny", num_heads=12, head="avg", use_class_token=False, **common
        )
    raise ValueError(f"`model` must be one of {MODELS}. Received: {name!r}")


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERAND = re.compile(r"%([\w.\-]+)")


def hlo_metadata(text):
    """`{instruction: op_name}` of an optimised HLO module, instructions
    without metadata taking the op_name of the first instruction that
    reads them."""
    names, readers = {}, collections.defaultdict(list)
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, rest = match.groups()
        op = _OP_NAME.search(rest)
        if op:
            names[name] = op.group(1)
        head = rest.split("metadata=")[0]
        for operand in _OPERAND.findall(head.split("(", 1)[-1]):
            readers[operand].append(name)
    for name in list(readers):
        if name not in names:
            for reader in readers[name]:
                if reader in names:
                    names[name] = names[reader]
                    break
    return names


def classify(op_name, step="train"):
    """`(phase, layer, op)` of an HLO op_name such as
    `jit(train_step)/transpose(jvp(jumbo_block_2))/attention/dot_general`."""
    if not op_name:
        return "other", "(no metadata)", "?"
    parts = op_name.split("/")[1:]  # drop jit(train_step)
    text = "/".join(parts)
    if step == "predict":
        phase = "forward"
    elif "transpose(" in text:
        phase = "backward"
    elif "jvp(" in text:
        phase = "forward"
    elif any(p in text for p in ("adam", "optimizer", "iterations")):
        phase = "optimizer"
    else:
        phase = "other"
    clean = [re.sub(r"^(transpose\()?(jvp\()?|\)+$", "", p) for p in parts]
    clean = [p for p in clean if p and not p.startswith("jit(")]
    op = clean[-1] if clean else "?"
    layers = clean[:-1] or ["(top)"]
    layer = "/".join(layers[:3])
    return phase, layer, op


def layer_group(layer):
    """Blocks folded together: `encoder/block_3/attention` ->
    `encoder/block_*/attention`."""
    return re.sub(r"block_\d+", "block_*", layer)


def profile(args):
    dump = tempfile.mkdtemp(prefix="xla_dump_")
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
        " --xla_dump_hlo_pass_re=NONE"
    )
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    import numpy as np

    from keras_jumbo import optimizers

    if keras.backend.backend() != "jax":
        raise SystemExit("This profile reads XLA traces: KERAS_BACKEND=jax.")
    model = build(args.model, args.image_size, args.num_classes)
    model.compile(
        optimizer=optimizers.AdamW(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    rng = np.random.default_rng(0)
    x = rng.random((args.batch, args.image_size, args.image_size, 3), "float32")
    y = rng.integers(0, args.num_classes, args.batch)
    if args.step == "train":
        step = lambda: model.train_on_batch(x, y)  # noqa: E731
    else:
        step = lambda: model.predict_on_batch(x)  # noqa: E731
    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    trace_dir = tempfile.mkdtemp(prefix="jax_trace_")
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
        for _ in range(args.steps):
            step()
    (trace,) = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
    with gzip.open(trace) as handle:
        events = json.load(handle)["traceEvents"]
    (module,) = sorted(
        glob.glob(f"{dump}/*jit_{args.step}_step.cpu_after_optimizations.txt"),
        key=os.path.getsize,
    )[-1:]
    with open(module) as handle:
        metadata = hlo_metadata(handle.read())
    thunk_us = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and (
            name in metadata or re.match(r"^[a-z][\w\-]*\.\d+$", name)
        ):
            thunk_us[name] += event["dur"]
    return dict(
        model=model,
        step_ms=step_ms,
        thunk_us=thunk_us,
        metadata=metadata,
        events=events,
        steps=args.steps,
        step=args.step,
    )


def tables(result, top):
    steps = result["steps"]
    total = sum(result["thunk_us"].values()) / steps / 1e3
    rows = []
    for name, us in result["thunk_us"].items():
        phase, layer, op = classify(
            result["metadata"].get(name), result["step"]
        )
        kind = name.rsplit(".", 1)[0]
        rows.append((us / steps / 1e3, name, phase, layer, op, kind))

    def table(title, key):
        sums = collections.Counter()
        for row in rows:
            sums[key(row)] += row[0]
        lines = [f"| {title} | ms per step | share |", "|---|---|---|"]
        for k, ms in sums.most_common():
            if ms >= 0.005 * total:
                lines.append(f"| {k} | {ms:.1f} | {ms / total:.0%} |")
        return lines

    out = [
        f"{result['step']} step wall time {result['step_ms']:.1f} ms; "
        "summed thunk "
        f"time {total:.1f} ms per step ({len(rows)} thunks)",
        "",
    ]
    out += table("phase", lambda r: r[2]) + [""]
    out += table("phase / layer", lambda r: f"{r[2]} {layer_group(r[3])}")
    out += [""] + table("phase / XLA op kind", lambda r: f"{r[2]} {r[5]}")
    out += ["", f"| top {top} thunks | ms | op_name |", "|---|---|---|"]
    for ms, name, *_ in sorted(rows, reverse=True)[:top]:
        op_name = result["metadata"].get(name, "")
        out.append(f"| {name} | {ms:.2f} | {op_name[:90]} |")
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=MODELS, default=MODELS[0])
    parser.add_argument(
        "--step",
        choices=("train", "predict"),
        default="train",
        help="profile Keras' compiled train step (forward, backward, "
        "AdamW) or its predict step (forward only)",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    result = profile(args)
    print(
        f"{args.model}, batch {args.batch}, {args.image_size} px, "
        f"{os.cpu_count()} CPU cores"
    )
    print("\n".join(tables(result, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
