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
        [--step train|predict] [--dtype float32|mixed_bfloat16]

Models: `official_jumbo_pico` (the `vs_official.py` model), `vit_pico`,
`registers_pico`, `non_deep_6x2` (224 px in the paper; any size here) and
`vit_tiny_12` (its same-MACs deep counterpart), or any name of
`keras_jumbo.models.list_models()` (e.g. `vit_res_tiny`,
`patchtst_forecaster`, `ms_patchtst`), built with its registered defaults
(`--image-size` / `--num-classes` override them when given). Inputs are
random; classifiers get integer labels, other models (forecasters) a
random target under mean squared error.

Summed thunk time overstates a phase whose thunks run beside others (each
gets one core), so the first table is wall time: per profiled step, the
forward phase runs until the loss's last thunk ends (XLA may run forward
ops that only the backward pass reads after it: those count as backward),
the backward phase until its last thunk ends, and the rest is the
optimizer's tail (its updates mostly run beside the backward pass);
medians over the profiled steps. Judge a change by wall time: a variant
can move summed thunk time a lot and wall time not at all.
"""

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

LEGACY_DEFAULTS = dict(image_size=128, num_classes=1000)
MODELS = (
    "official_jumbo_pico",
    "vit_pico",
    "registers_pico",
    "non_deep_6x2",
    "vit_tiny_12",
)


def build(name, image_size=None, num_classes=None):
    """The model `name`: one of `MODELS` (image size and classes default to
    `LEGACY_DEFAULTS`) or a registered name (its registered defaults)."""
    from keras_jumbo import convert
    from keras_jumbo import models

    given = dict(image_size=image_size, num_classes=num_classes)
    given = {k: v for k, v in given.items() if v is not None}
    if name not in MODELS:
        if name not in models.list_models():
            raise ValueError(
                f"`model` must be one of {MODELS} or a registered name "
                f"{models.list_models()}. Received: {name!r}"
            )
        return models.create_model(name, **given)
    common = {**LEGACY_DEFAULTS, **given}
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
    raise AssertionError(name)  # every name of MODELS is handled above


def batch_for(model, batch, seed=0):
    """Random `(x, y, loss)` for one step of `model`: integer labels for a
    classifier (2-D output), a random target under MSE otherwise."""
    import keras
    import numpy as np

    rng = np.random.default_rng(seed)
    x = rng.random((batch, *model.input_shape[1:]), "float32")
    out = model.output_shape
    if len(out) == 2 and out[-1] > 1:
        y = rng.integers(0, out[-1], batch)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        y = rng.standard_normal((batch, *out[1:])).astype("float32")
        loss = "mse"
    return x, y, loss


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERAND = re.compile(r"%([\w.\-]+)")


def hlo_metadata(text):
    """`{instruction: op_name}` of an optimised HLO module.

    An instruction without metadata (made by an XLA pass) takes the op_name
    of the first instruction that reads it, unless that reader is optimizer
    work: then of a backward operand, if it has one. (A convolution's kernel
    gradient is made by XLA and read only by the weight update; it belongs
    to the backward pass, not to the optimizer.)"""
    names, order = {}, []
    readers = collections.defaultdict(list)
    operands = collections.defaultdict(list)
    for line in text.splitlines():
        match = _INSTRUCTION.match(line)
        if not match:
            continue
        name, rest = match.groups()
        order.append(name)
        op = _OP_NAME.search(rest)
        if op:
            names[name] = op.group(1)
        head = rest.split("metadata=")[0]
        for operand in _OPERAND.findall(head.split("(", 1)[-1]):
            readers[operand].append(name)
            operands[name].append(operand)

    def phase(name):
        return classify(names.get(name))[0] if name in names else None

    def inherit(name, fallback):
        read = [r for r in readers[name] if r in names]
        backward = [o for o in operands[name] if phase(o) == "backward"]
        if read and phase(read[0]) != "optimizer":
            return names[read[0]]
        if backward:
            return names[backward[0]]
        return names[read[0]] if read and fallback else None

    # Chains of instructions without metadata resolve over rounds, until a
    # round names nothing new; then the rest falls back to any reader.
    for fallback in (False, True):
        changed = True
        while changed:
            changed = False
            for name in order:
                if name not in names:
                    op_name = inherit(name, fallback)
                    if op_name is not None:
                        names[name] = op_name
                        changed = True
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

    from keras_jumbo import optimizers

    if keras.backend.backend() != "jax":
        raise SystemExit("This profile reads XLA traces: KERAS_BACKEND=jax.")
    # The model's layers take the global policy (`mixed_bfloat16`: float32
    # variables, bfloat16 compute).
    keras.mixed_precision.set_dtype_policy(args.dtype)
    model = build(args.model, args.image_size, args.num_classes)
    x, y, loss = batch_for(model, args.batch)
    model.compile(optimizer=optimizers.AdamW(1e-3), loss=loss)
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


def phase_wall(result):
    """Per profiled step, wall us of each phase from the thunks' start and
    end times: `forward` until the loss's last thunk ends (the whole step
    for a predict step), `backward` from there until the last backward
    thunk ends, `optimizer tail` the rest; also the step's span (first
    thunk start to last thunk end) and the thunk concurrency (summed thunk
    time / span). Medians over steps."""
    steps, metadata = result["steps"], result["metadata"]
    runs = collections.defaultdict(list)
    for event in result["events"]:
        if event.get("ph") == "X" and event.get("name") in result["thunk_us"]:
            runs[event["name"]].append(event)
    per_step = [[] for _ in range(steps)]
    for events in runs.values():
        # The k-th run of a thunk belongs to step k (runs per step > 1 for
        # thunks inside loops).
        if len(events) % steps:
            continue
        events.sort(key=lambda e: e["ts"])
        per = len(events) // steps
        for index, event in enumerate(events):
            per_step[index // per].append(event)
    spans = collections.defaultdict(list)
    for events in per_step:
        if not events:
            continue
        start = min(e["ts"] for e in events)
        end = max(e["ts"] + e["dur"] for e in events)
        last = {}
        for e in events:
            op_name = metadata.get(e["name"]) or ""
            phase = classify(op_name, result["step"])[0]
            if "compile_loss" in op_name:
                phase = "loss"
            last[phase] = max(last.get(phase, start), e["ts"] + e["dur"])
        forward_end = last.get(
            "loss", end if result["step"] == "predict" else start
        )
        backward_end = max(last.get("backward", start), forward_end)
        spans["forward"].append(forward_end - start)
        spans["backward"].append(backward_end - forward_end)
        spans["optimizer tail"].append(end - backward_end)
        spans["span"].append(end - start)
        busy = sum(e["dur"] for e in events)
        spans["concurrency"].append(busy / max(end - start, 1))

    return {k: statistics.median(v) for k, v in spans.items()}


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
    wall = phase_wall(result)
    span = wall["span"]
    out += [
        "| wall time per profiled step (median) | ms | share of span |",
        "|---|---|---|",
    ]
    phases = (
        ("forward",)
        if result["step"] == "predict"
        else (
            "forward",
            "backward",
            "optimizer tail",
        )
    )
    for phase in phases:
        ms = wall[phase] / 1e3
        out.append(f"| {phase} | {ms:.1f} | {wall[phase] / span:.0%} |")
    out += [
        f"| first thunk to last | {span / 1e3:.1f} | |",
        f"| thunk concurrency (summed / span) | {wall['concurrency']:.2f} | |",
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
    parser.add_argument(
        "--model",
        default=MODELS[0],
        help=f"one of {', '.join(MODELS)} or a registered model name "
        "(keras_jumbo.models.list_models())",
    )
    parser.add_argument(
        "--step",
        choices=("train", "predict"),
        default="train",
        help="profile Keras' compiled train step (forward, backward, "
        "AdamW) or its predict step (forward only)",
    )
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="image models: defaults to 128 for the named models above, "
        "else the registered default",
    )
    parser.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="classifiers: defaults to 1000 for the named models above, "
        "else the registered default",
    )
    parser.add_argument(
        "--dtype",
        choices=("float32", "mixed_bfloat16", "mixed_float16"),
        default="float32",
        help="the Keras dtype policy the model is built under",
    )
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    result = profile(args)
    model = result["model"]
    print(
        f"{args.model}, batch {args.batch}, input "
        f"{tuple(model.input_shape[1:])}, {model.count_params():,} "
        f"parameters, {args.dtype}, {os.cpu_count()} CPU cores"
    )
    print("\n".join(tables(result, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
