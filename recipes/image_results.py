"""The image claims, measured on offline data: `docs/image_results.md`
from run records (issue #16, part 3).

Section done so far — Jumbo vs Registers vs plain ViT (Jumbo paper Fig. 1
and 4: Jumbo beats Registers most at narrow widths, e.g. +13.5 points at
nano on ImageNet-1K): pico and nano widths, J=6 vs R=16 vs a CLS token, on
two image sets that install without a download at run time:

- Fashion-MNIST (Debian `dataset-fashion-mnist`; 60k/10k, 28x28, patch 7,
  16 patch tokens);
- scikit-learn's handwritten digits (inside the scikit-learn wheel; 1,797
  8x8 images, patch 2, 16 patch tokens; a fixed stratified 70/30 split).

Every model: the paper's width, heads and FFN ratios, depth 6 (not 12, to
fit 2 CPU cores), no augmentation, AdamW (lr 2e-3, weight decay 0.05),
warm-up over 10% of the steps then cosine decay, batch 128, the same
epochs for all (equal training budget); test accuracy on the whole test
split; parameters, MACs and inference images/s (the whole test split,
`predict`, measured during the run, so noisy when the machine is shared)
beside it; >= 3 seeds, mean ± sample std.

Every finished run is appended to the records file; rerunning resumes.

Commands (2 CPU cores):
    KERAS_BACKEND=jax python -m recipes.image_results \\
        --records docs/image_runs.jsonl --results docs/image_results.md
    # the document from the records alone (missing runs are listed)
    python -m recipes.image_results --records docs/image_runs.jsonl \\
        --from-records --results docs/image_results.md
"""

import argparse
import os
import platform
import time

import keras
import numpy as np

from keras_jumbo import data
from keras_jumbo import models
from keras_jumbo.schedules import warmup_cosine
from recipes.time_series import appender
from recipes.time_series import load_records
from recipes.time_series import mean_std
from recipes.time_series import reuse_or_run

# name -> (loader, patch size, epochs)
DATASETS = ("fashion_mnist", "digits")
PATCH_SIZES = {"fashion_mnist": 7, "digits": 2}
EPOCHS = {"fashion_mnist": 3, "digits": 30}
COMPARED = ("vit", "registers", "jumbo")
SIZES = ("pico", "nano")
DEPTH = 6
NUM_REGISTERS = 16
NUM_JUMBO = 6


def load_dataset(name, seed=0):
    """`((x_train, y_train), (x_test, y_test))`, images `(n, H, W, 1)` uint8
    or float, labels int; offline."""
    if name == "fashion_mnist":
        (x, y), (x_test, y_test) = data.load_fashion_mnist(allow_download=False)
        return (x[..., None], y), (x_test[..., None], y_test)
    if name == "digits":
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = digits.images[..., None].astype("float32")  # 0..16
        labels = digits.target.astype("int64")
        rng = np.random.default_rng(seed)
        test = np.zeros(len(labels), bool)
        for label in np.unique(labels):  # stratified 30% test
            where = rng.permutation(np.flatnonzero(labels == label))
            test[where[: round(0.3 * len(where))]] = True
        return (images[~test], labels[~test]), (images[test], labels[test])
    raise ValueError(
        f"`dataset` must be one of {DATASETS}. Received: dataset={name!r}"
    )


def build(model, size, dataset, num_classes, image_size):
    common = dict(
        depth=DEPTH,
        num_classes=num_classes,
        image_size=image_size,
        patch_size=PATCH_SIZES[dataset],
        num_channels=1,
    )
    if model == "vit":
        return models.ViT(size, **common)
    if model == "registers":
        return models.RegistersViT(size, num_registers=NUM_REGISTERS, **common)
    if model == "jumbo":
        return models.JumboViT(size, jumbo_multiplier=NUM_JUMBO, **common)
    raise ValueError(
        f"`model` must be one of {COMPARED}. Received: model={model!r}"
    )


def train_one(
    dataset,
    model_name,
    size,
    seed,
    epochs=None,
    train_examples=None,
    batch_size=128,
    learning_rate=2e-3,
):
    """One run; its record (test accuracy on the whole test split)."""
    keras.utils.set_random_seed(seed)
    (x, y), (x_test, y_test) = load_dataset(dataset)
    if train_examples is not None:
        x, y = x[:train_examples], y[:train_examples]
    scale = 255.0 if x.dtype == np.uint8 else float(x.max())
    mean = float(x.mean() / scale)
    std = float(x.std() / scale)
    num_classes = int(max(y.max(), y_test.max()) + 1)
    epochs = EPOCHS[dataset] if epochs is None else epochs
    common = dict(mean=(mean,), std=(std,), scale=scale)
    train = data.ImageBatches(x, y, batch_size, seed=seed, **common)
    test = data.ImageBatches(x_test, y_test, 256, shuffle=False, **common)
    model = build(model_name, size, dataset, num_classes, x.shape[1])
    model.compile(
        optimizer=keras.optimizers.AdamW(
            warmup_cosine(learning_rate, epochs * len(train)),
            weight_decay=0.05,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(train, epochs=epochs, verbose=0)
    seconds = time.perf_counter() - start
    model.predict(test[0][0], verbose=0)  # compile before timing
    start = time.perf_counter()
    logits = model.predict(test, verbose=0)
    inference = len(x_test) / (time.perf_counter() - start)
    accuracy = float(np.mean(np.argmax(logits, -1) == y_test))
    return {
        "kind": "compare",
        "dataset": dataset,
        "model": model_name,
        "size": size,
        "seed": seed,
        "epochs": epochs,
        "train_examples": len(x),
        "test_examples": len(x_test),
        "test_accuracy": accuracy,
        "params": model.count_params(),
        "macs": models.count_macs(model),
        "train_seconds": seconds,
        "inference_images_per_second": inference,
    }


def _key(record):
    return tuple(
        record[k] for k in ("dataset", "model", "size", "seed", "epochs")
    )


def summarize(records):
    """`{(dataset, size, model): row}`: accuracy mean ± std over seeds,
    params, MACs, median inference images/s, seeds."""
    groups = {}
    for r in records:
        groups.setdefault((r["dataset"], r["size"], r["model"]), []).append(r)
    return {
        key: {
            "accuracy": mean_std([r["test_accuracy"] for r in runs]),
            "params": runs[0]["params"],
            "macs": runs[0]["macs"],
            "inference": float(
                np.median([r["inference_images_per_second"] for r in runs])
            ),
            "seeds": len(runs),
        }
        for key, runs in groups.items()
    }


def comparison_markdown(summary, datasets, sizes):
    lines = []
    for dataset in datasets:
        lines += [
            f"### {dataset}",
            "",
            "| width | model | params | MACs | test accuracy (%) | "
            "inference img/s | seeds |",
            "|---|---|---|---|---|---|---|",
        ]
        for size in sizes:
            for model in COMPARED:
                row = summary.get((dataset, size, model))
                if row is None:
                    lines.append(f"| {size} | {model} | | | | | 0 |")
                    continue
                mean, std = row["accuracy"]
                lines.append(
                    f"| {size} | {model} | {row['params']:,} | "
                    f"{row['macs'] / 1e6:.1f}M | {100 * mean:.2f} ± "
                    f"{100 * std:.2f} | {row['inference']:.0f} | "
                    f"{row['seeds']} |"
                )
        lines.append("")
        for size in sizes:
            jumbo = summary.get((dataset, size, "jumbo"))
            registers = summary.get((dataset, size, "registers"))
            if jumbo and registers:
                gap = 100 * (jumbo["accuracy"][0] - registers["accuracy"][0])
                spread = 100 * max(
                    jumbo["accuracy"][1], registers["accuracy"][1]
                )
                verdict = (
                    "within the seed spread"
                    if abs(gap) <= spread
                    else ("Jumbo ahead" if gap > 0 else "Registers ahead")
                )
                lines.append(
                    f"- {size}: Jumbo − Registers = {gap:+.2f} points "
                    f"(largest std {spread:.2f}): {verdict}."
                )
        lines.append("")
    return lines


def write_results(path, args):
    done = {_key(r): r for r in load_records(args.records)}
    append = appender(args.records)
    kept, missing = [], []
    for dataset in args.datasets:
        for size in args.sizes:
            for seed in args.seeds:
                for model in COMPARED:
                    epochs = EPOCHS[dataset]
                    key = (dataset, model, size, seed, epochs)
                    label = f"{dataset}/{size}/{model}/seed {seed}"
                    record = reuse_or_run(
                        [done[key]] if key in done else [],
                        lambda: train_one(dataset, model, size, seed),  # noqa: B023
                        args.from_records,
                        append,
                        lambda r, label=label: (
                            f"{label}: "
                            f"{100 * r['test_accuracy']:.2f}% "
                            f"({r['train_seconds'] / 60:.1f} min)"
                        ),
                    )
                    (missing if record is None else kept).append(
                        record or label
                    )
    lines = [
        "# Image results",
        "",
        f"Produced by `python -m recipes.image_results --records "
        f"{args.records} --results {path}` on {platform.machine()} with "
        f"{os.cpu_count()} CPU cores, no GPU, Keras {keras.__version__} / "
        f"{keras.backend.backend()}, {time.strftime('%Y-%m-%d')}. Settings "
        "and data: `recipes/image_results.py`.",
        "",
        "## Jumbo vs Registers vs plain ViT",
        "",
        "Paper (Jumbo, Fig. 1/4): Jumbo (J=6) beats ViT+Registers (R=16) "
        "most at narrow widths (+13.5 points at nano on ImageNet-1K). Here: "
        f"depth {DEPTH}, equal epochs per set "
        f"({', '.join(f'{d}: {EPOCHS[d]}' for d in args.datasets)}), test "
        "accuracy on the whole test split, mean ± sample std over seeds.",
        "",
    ]
    lines += comparison_markdown(summarize(kept), args.datasets, args.sizes)
    if missing:
        lines += [f"Not yet run ({len(missing)}): " + ", ".join(missing), ""]
    lines += [
        "## Still to measure",
        "",
        "Jumbo per-layer vs layer-shared vs LoRA FFNs (Table 3), the "
        "token-dropping schedule (§4.2), Non-Deep ViT (Tables 1, 5, 6) and "
        "ViT-ResNAS search vs random sub-networks (§3): issue #16.",
        "",
    ]
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as handle:
        handle.write("\n".join(lines))
    return kept


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--results", required=True)
    parser.add_argument("--records")
    parser.add_argument("--from-records", action="store_true")
    parser.add_argument(
        "--datasets", nargs="+", choices=DATASETS, default=list(DATASETS)
    )
    parser.add_argument(
        "--sizes", nargs="+", choices=SIZES, default=list(SIZES)
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    args = parser.parse_args(argv)
    write_results(args.results, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
