"""The image claims, measured on offline data: `docs/image_results.md`
from run records (issue #16, part 3).

Sections (`--sections`, all by default):

- `compare` — Jumbo vs Registers vs plain ViT (Jumbo paper Fig. 1 and 4:
  Jumbo beats Registers most at narrow widths, e.g. +13.5 points at nano
  on ImageNet-1K): pico and nano widths, J=6 vs R=16 vs a CLS token, on two
  image sets that install without a download at run time:
  Fashion-MNIST (Debian `dataset-fashion-mnist`; 60k/10k, 28x28, patch 7,
  16 patch tokens) and scikit-learn's handwritten digits (inside the
  scikit-learn wheel; 1,797 8x8 images, patch 2, 16 patch tokens; a fixed
  stratified 70/30 split).
- `jumbo_ffn` — Jumbo per-layer vs layer-shared vs LoRA (rank 8, 32) FFNs
  (Jumbo Table 3), pico, J=6.
- `token_drop` — the token-dropping schedule (Jumbo §4.2: drop 90% of the
  patch tokens at the first step, linearly down to 10% at the last;
  `keras_jumbo.callbacks.TokenDropSchedule`) vs none, for Jumbo and
  Registers at pico: accuracy and training throughput.
- `non_deep` — Non-Deep ViT (Tables 1, 5, 6): the branchy 6x2 model
  (DeiT-Tiny geometry: width 192, 12 heads, average pooling) pre-trained
  at λ=0 for 2/3 of the epochs, then joined over the last 1/3 (a fresh
  optimiser, as the paper's separate stage; λ warm-up over 60% of the join
  steps, `recipes.non_deep_vit.join_warmup_steps`) with the linear, cosine
  or instant λ schedule, reparameterised into a plain 6-layer ViT and
  scored as that; vs plain 6- and 12-layer ViTs trained for all the
  epochs in one run. Equal epochs for all.
- `resnas` — ViT-ResNAS (§3): the recipe's small space
  (`recipes.vit_resnas_supernet.smoke_space`) trained as a weight-sharing
  super-network with multi-architectural sampling (N_a = 8) for 20 epochs
  on 20,000 Fashion-MNIST images upsampled to 56 px (the smallest size
  its stem and reductions take); then the evolutionary search (population
  50, 15 parents, 30 children, 5 iterations; the paper: 500/75/150/20) vs
  a random search scoring as many candidates in the same MAC window
  [0.975 C, C] (C: the Tiny space's 1.8G budget placed in this space by
  `search_budget`), both choosing on 100 images per class held out of the
  training split (the paper: 25K of ImageNet's 1.28M, 2%; here 5%, so
  that the held-out accuracy separates candidates at all), never on the
  reported test split; 10 random sub-networks of the window and the
  largest sub-network scored beside them. Sub-networks keep the
  super-network's weights (the paper retrains its searched networks).

The ablations (`jumbo_ffn`, `token_drop`, `non_deep`) run on the digits
set (`ABLATION_DATASET`), which trains in minutes; their reference rows
(per-layer Jumbo, no token dropping) are the `compare` runs, not run twice.

Every model: the paper's width, heads and FFN ratios, depth 6 (not 12, to
fit 2 CPU cores; the Non-Deep section keeps its 6 and 12 layers), no
augmentation, AdamW (lr 2e-3, weight decay 0.05), warm-up over 10% of the
steps then cosine decay, batch 128, the same epochs for all (equal training
budget); test accuracy on the whole test split; parameters, MACs and
inference images/s (the whole test split, `predict`, measured during the
run, so noisy when the machine is shared) beside it; >= 3 seeds, mean ±
sample std.

Every finished run is appended to the records file; rerunning resumes.

Commands (2 CPU cores):
    KERAS_BACKEND=jax python -m recipes.image_results \\
        --records docs/image_runs.jsonl --results docs/image_results.md
    # one section, one data set
    KERAS_BACKEND=jax python -m recipes.image_results --sections non_deep \\
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

from keras_jumbo import callbacks as kj_callbacks
from keras_jumbo import convert
from keras_jumbo import data
from keras_jumbo import models
from keras_jumbo import nas
from keras_jumbo import optimizers
from keras_jumbo.schedules import warmup_cosine
from recipes import common
from recipes import vit_resnas_supernet as resnas_recipe
from recipes.non_deep_vit import join_warmup_steps
from recipes.time_series import appender
from recipes.time_series import load_records
from recipes.time_series import mean_std
from recipes.time_series import reuse_or_run

DATASETS = ("fashion_mnist", "digits")
PATCH_SIZES = {"fashion_mnist": 7, "digits": 2}
EPOCHS = {"fashion_mnist": 3, "digits": 30}
COMPARED = ("vit", "registers", "jumbo")
SIZES = ("pico", "nano")
DEPTH = 6
NUM_REGISTERS = 16
NUM_JUMBO = 6

SECTIONS = ("compare", "jumbo_ffn", "token_drop", "non_deep", "resnas")
ABLATION_DATASET = "digits"
ABLATION_SIZE = "pico"
# Jumbo Table 3; "per_layer" is the `compare` run of JumboViT.
JUMBO_FFN_VARIANTS = {
    "per_layer": {},
    "shared": dict(share_jumbo_mlp=True),
    "lora8": dict(share_jumbo_mlp=True, jumbo_lora_rank=8),
    "lora32": dict(share_jumbo_mlp=True, jumbo_lora_rank=32),
}
# Jumbo §4.2 / A.2.1: 90% of the patch tokens dropped at first, 10% last.
TOKEN_DROP = (0.9, 0.1)
TOKEN_DROP_MODELS = ("registers", "jumbo")
# Non-Deep ViT: (blocks, branches, λ schedule); branches 1 = a plain ViT.
NON_DEEP_VARIANTS = {
    "6x2_linear": (6, 2, "linear"),
    "6x2_cosine": (6, 2, "cosine"),
    "6x2_instant": (6, 2, "instant"),
    "plain6": (6, 1, None),
    "plain12": (12, 1, None),
}
NON_DEEP_PRETRAIN_FRACTION = 2 / 3
# ViT-ResNAS §3 at this scale: the recipe's small space at 56 px (the
# smallest size its stem and reductions take), Fashion-MNIST upsampled 2x.
RESNAS = dict(
    dataset="fashion_mnist",
    image_size=56,
    train_examples=20_000,
    search_per_class=100,
    epochs=20,
    batch_size=64,
    num_architectures=8,
    random_subnets=10,
    test_examples=None,  # None: the whole test split (tests take fewer)
    search=dict(
        population_size=50, num_parents=15, num_children=30, iterations=5
    ),
)


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


def _geometry(dataset, num_classes, image_size):
    return dict(
        num_classes=num_classes,
        image_size=image_size,
        patch_size=PATCH_SIZES[dataset],
        num_channels=1,
    )


def build(model, size, dataset, num_classes, image_size, **kwargs):
    """A `compare` model (`kwargs`, e.g. `token_drop_rate`, passed on)."""
    common = dict(
        depth=DEPTH, **_geometry(dataset, num_classes, image_size), **kwargs
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


def build_non_deep(variant, dataset, num_classes, image_size):
    """The Non-Deep section's model: a `NonDeepViT` for the branchy
    variants, else a plain ViT with the same geometry (DeiT-Tiny width and
    12 heads, average pooling, no class token)."""
    if variant not in NON_DEEP_VARIANTS:
        raise ValueError(
            f"`variant` must be one of {tuple(NON_DEEP_VARIANTS)}. "
            f"Received: variant={variant!r}"
        )
    depth, branches, _ = NON_DEEP_VARIANTS[variant]
    geometry = _geometry(dataset, num_classes, image_size)
    if branches > 1:
        return models.NonDeepViT(depth, branches, **geometry)
    return models.ViT(
        "tiny",
        depth=depth,
        num_heads=12,
        head="avg",
        use_class_token=False,
        **geometry,
    )


def prepare(dataset, seed, train_examples=None, batch_size=128):
    """Normalised batches of `dataset` (statistics of its training split)
    and what a run needs to know about it."""
    (x, y), (x_test, y_test) = load_dataset(dataset)
    if train_examples is not None:
        x, y = x[:train_examples], y[:train_examples]
    scale = 255.0 if x.dtype == np.uint8 else float(x.max())
    common = dict(
        mean=(float(x.mean() / scale),),
        std=(float(x.std() / scale),),
        scale=scale,
    )
    return dict(
        train=data.ImageBatches(x, y, batch_size, seed=seed, **common),
        test=data.ImageBatches(x_test, y_test, 256, shuffle=False, **common),
        y_test=y_test,
        num_classes=int(max(y.max(), y_test.max()) + 1),
        image_size=x.shape[1],
        train_examples=len(x),
    )


def fit(model, train, epochs, learning_rate=2e-3, callbacks=()):
    """Compile with a fresh AdamW (warm-up + cosine over this fit) and
    train; the seconds it took."""
    model.compile(
        optimizer=optimizers.AdamW(
            warmup_cosine(learning_rate, epochs * len(train)),
            weight_decay=0.05,
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(train, epochs=epochs, verbose=0, callbacks=list(callbacks))
    return time.perf_counter() - start


def score(model, test, labels):
    """`(accuracy, inference images/s)` on the whole test split."""
    model.predict(test[0][0], verbose=0)  # compile before timing
    start = time.perf_counter()
    logits = model.predict(test, verbose=0)
    inference = len(labels) / (time.perf_counter() - start)
    return float(np.mean(np.argmax(logits, -1) == labels)), inference


def _record(spec, prepared, model, accuracy, inference, seconds, **extra):
    return dict(
        spec,
        train_examples=prepared["train_examples"],
        test_examples=len(prepared["y_test"]),
        test_accuracy=accuracy,
        params=model.count_params(),
        macs=models.count_macs(model),
        train_seconds=seconds,
        inference_images_per_second=inference,
        backend=keras.backend.backend(),
        **extra,
    )


def _upsampled(images, factor):
    return images.repeat(factor, axis=1).repeat(factor, axis=2)


def run_resnas(spec, settings=None):
    """Train the small ViT-ResNAS super-network (multi-architectural
    sampling), then compare on the whole test split: the evolutionary
    search's pick, a random search's pick with as many candidates (both
    chosen on data held out of the training split), random sub-networks
    in the same MAC window, and the largest sub-network."""
    settings = dict(RESNAS, **(settings or {}))
    seed = spec["seed"]
    keras.utils.set_random_seed(seed)
    space = resnas_recipe.smoke_space()
    (x, y), (x_test, y_test) = load_dataset(settings["dataset"])
    rows = np.random.default_rng(seed).permutation(len(x))
    x, y = (
        x[rows[: settings["train_examples"]]],
        y[rows[: settings["train_examples"]]],
    )
    factor = settings["image_size"] // x.shape[1]
    mean, std = float(x.mean() / 255.0), float(x.std() / 255.0)

    def normalised(images):
        images = images.astype("float32") / 255.0
        return _upsampled((images - mean) / std, factor)

    train_rows, search_rows = resnas_recipe.hold_out_per_class(
        y, settings["search_per_class"], seed=seed
    )
    x_search, y_search = normalised(x[search_rows]), y[search_rows]
    x, y = normalised(x[train_rows]), y[train_rows]
    x_test, y_test = (
        normalised(x_test[: settings["test_examples"]]),
        y_test[: settings["test_examples"]],
    )
    num_classes = int(y.max() + 1)
    size = settings["image_size"]
    epochs = spec["epochs"]
    batches = nas.MultiArchitectureBatches(
        x,
        y,
        space,
        batch_size=settings["batch_size"],
        num_architectures=settings["num_architectures"],
        warmup_steps=epochs * (len(x) // settings["batch_size"]) // 4,
        seed=seed,
    )
    supernet = nas.build_supernet(
        space, num_classes=num_classes, image_size=size, num_channels=1
    )
    seconds = fit(supernet, batches, epochs)
    budget = resnas_recipe.search_budget("tiny", space, size, num_classes)

    def held_out(arch):
        return nas.evaluate_subnet(supernet, space, arch, x_search, y_search)

    def tested(arch):
        return nas.evaluate_subnet(supernet, space, arch, x_test, y_test)

    start = time.perf_counter()
    common = dict(image_size=size, num_classes=num_classes)
    searched = nas.evolutionary_search(
        space, held_out, budget, seed=seed, **common, **settings["search"]
    )
    candidates = []

    def held_out_random(arch):
        candidates.append(arch)
        return held_out(arch)

    random_search = nas.evolutionary_search(
        space,
        held_out_random,
        budget,
        seed=seed + 1000,
        population_size=searched["evaluated"],
        num_parents=1,
        num_children=0,
        iterations=0,
        **common,
    )
    search_seconds = time.perf_counter() - start
    return dict(
        spec,
        train_examples=len(x),
        search_examples=len(x_search),
        test_examples=len(x_test),
        mac_budget=budget,
        evaluated=searched["evaluated"],
        test_accuracy=tested(searched["architecture"]),
        search_accuracy=searched["score"],
        searched_macs=searched["macs"],
        searched_architecture=str(searched["architecture"]),
        random_search_test_accuracy=tested(random_search["architecture"]),
        random_search_search_accuracy=random_search["score"],
        random_test_accuracies=[
            tested(arch) for arch in candidates[: settings["random_subnets"]]
        ],
        largest_test_accuracy=tested(space.largest()),
        params=supernet.count_params(),
        train_seconds=seconds,
        search_seconds=search_seconds,
        backend=keras.backend.backend(),
    )


def run_spec(spec, train_examples=None):
    """Train and score one run described by `spec` (a `specs()` entry);
    its record."""
    if spec["kind"] == "resnas":
        return run_resnas(spec)
    keras.utils.set_random_seed(spec["seed"])
    prepared = prepare(spec["dataset"], spec["seed"], train_examples)
    geometry = (
        spec["dataset"],
        prepared["num_classes"],
        prepared["image_size"],
    )
    train, epochs = prepared["train"], spec["epochs"]
    kind, variant = spec["kind"], spec.get("variant")
    extra = {}
    if kind == "non_deep":
        model = build_non_deep(variant, *geometry)
        schedule = NON_DEEP_VARIANTS[variant][2]
        if schedule is None:
            seconds = fit(model, train, epochs)
        else:
            pretrain = round(NON_DEEP_PRETRAIN_FRACTION * epochs)
            seconds = fit(model, train, pretrain)  # λ = 0
            joining = kj_callbacks.JoinSchedule(
                schedule, join_warmup_steps((epochs - pretrain) * len(train))
            )
            seconds += fit(model, train, epochs - pretrain, callbacks=[joining])
            extra["branchy_test_accuracy"] = score(
                model, prepared["test"], prepared["y_test"]
            )[0]
            extra["branchy_params"] = model.count_params()
            model = convert.reparameterize(model)
    else:
        kwargs, callbacks = {}, []
        if kind == "jumbo_ffn":
            kwargs = JUMBO_FFN_VARIANTS[variant]
        elif kind == "token_drop":
            kwargs = dict(token_drop_rate=TOKEN_DROP[0])
            callbacks = [kj_callbacks.TokenDropSchedule(*TOKEN_DROP)]
        elif kind != "compare":
            raise ValueError(
                f"`kind` must be one of {SECTIONS}. Received: kind={kind!r}"
            )
        model = build(spec["model"], spec["size"], *geometry, **kwargs)
        seconds = fit(model, train, epochs, callbacks=callbacks)
    accuracy, inference = score(model, prepared["test"], prepared["y_test"])
    return _record(spec, prepared, model, accuracy, inference, seconds, **extra)


def train_one(
    dataset, model_name, size, seed, epochs=None, train_examples=None
):
    """One `compare` run; its record (accuracy on the whole test split)."""
    epochs = EPOCHS[dataset] if epochs is None else epochs
    return run_spec(
        _spec("compare", dataset, model_name, size, seed, epochs),
        train_examples,
    )


def _spec(kind, dataset, model, size, seed, epochs=None, variant=None):
    spec = dict(
        kind=kind,
        dataset=dataset,
        model=model,
        size=size,
        seed=seed,
        epochs=EPOCHS[dataset] if epochs is None else epochs,
    )
    if variant is not None:
        spec["variant"] = variant
    return spec


_KEY_FIELDS = ("kind", "dataset", "model", "size", "seed", "epochs", "variant")


def _key(record):
    return tuple(record.get(k) for k in _KEY_FIELDS)


def specs(section, datasets, sizes, seeds):
    """The runs `section` reports, in running order. References shared
    with `compare` (per-layer Jumbo, no token dropping) are `compare`
    specs."""
    ablation = ABLATION_DATASET
    if section == "compare":
        return [
            _spec("compare", dataset, model, size, seed)
            for dataset in datasets
            for size in sizes
            for seed in seeds
            for model in COMPARED
        ]
    if section == "jumbo_ffn":
        return [
            _spec("compare", ablation, "jumbo", ABLATION_SIZE, seed)
            if variant == "per_layer"
            else _spec(
                "jumbo_ffn",
                ablation,
                "jumbo",
                ABLATION_SIZE,
                seed,
                variant=variant,
            )
            for seed in seeds
            for variant in JUMBO_FFN_VARIANTS
        ]
    if section == "token_drop":
        drop = f"{TOKEN_DROP[0]}->{TOKEN_DROP[1]}"
        return [
            _spec(kind, ablation, model, ABLATION_SIZE, seed, variant=variant)
            for seed in seeds
            for model in TOKEN_DROP_MODELS
            for kind, variant in (("compare", None), ("token_drop", drop))
        ]
    if section == "non_deep":
        return [
            _spec(
                "non_deep", ablation, "non_deep", "tiny", seed, variant=variant
            )
            for seed in seeds
            for variant in NON_DEEP_VARIANTS
        ]
    if section == "resnas":
        return [
            _spec(
                "resnas",
                RESNAS["dataset"],
                "vit_resnas",
                "smoke",
                seed,
                epochs=RESNAS["epochs"],
            )
            for seed in seeds
        ]
    raise ValueError(
        f"`section` must be one of {SECTIONS}. Received: section={section!r}"
    )


def _label(spec):
    parts = [spec["dataset"], spec["size"], spec["model"]]
    if spec.get("variant"):
        parts.append(spec["variant"])
    return f"{spec['kind']}:{'/'.join(parts)}/seed {spec['seed']}"


def group(records, *fields):
    """Records grouped by `fields`: `{values: [records]}`."""
    groups = {}
    for r in records:
        groups.setdefault(tuple(r.get(f) for f in fields), []).append(r)
    return groups


def _row(runs):
    return {
        "accuracy": mean_std([r["test_accuracy"] for r in runs]),
        "params": runs[0]["params"],
        "macs": runs[0]["macs"],
        "inference": float(
            np.median([r["inference_images_per_second"] for r in runs])
        ),
        "training": float(
            np.median(
                [
                    r["train_examples"] * r["epochs"] / r["train_seconds"]
                    for r in runs
                    if "train_examples" in r
                ]
                or [float("nan")]
            )
        ),
        "seeds": len(runs),
    }


def summarize(records):
    """`{(dataset, size, model): row}` of the `compare` runs: accuracy mean
    ± std over seeds, params, MACs, median inference and training images/s,
    seeds."""
    compare = [r for r in records if r.get("kind", "compare") == "compare"]
    return {
        key: _row(runs)
        for key, runs in group(compare, "dataset", "size", "model").items()
    }


MIN_SEEDS_FOR_VERDICT = 2


def _verdict(first, second, names):
    """`(gap in points, largest std, words)` of row `first` minus
    `second`; no verdict while a row has fewer than
    `MIN_SEEDS_FOR_VERDICT` seeds (one seed has no spread to compare
    with)."""
    gap = 100 * (first["accuracy"][0] - second["accuracy"][0])
    spread = 100 * max(first["accuracy"][1], second["accuracy"][1])
    seeds = min(first.get("seeds", 0), second.get("seeds", 0))
    if seeds < MIN_SEEDS_FOR_VERDICT:
        words = f"no verdict yet ({seeds} seed{'s' * (seeds != 1)})"
    elif abs(gap) <= spread:
        words = "within the seed spread"
    else:
        words = f"{names[0] if gap > 0 else names[1]} ahead"
    return gap, spread, words


def _accuracy_cell(row):
    mean, std = row["accuracy"]
    return f"{100 * mean:.2f} ± {100 * std:.2f}"


def _answer(hits, total):
    """yes / partly / no for `hits` of `total` cases ("not yet" for 0)."""
    if not total:
        return "not yet (too few runs)"
    return "yes" if hits == total else ("partly" if hits else "no")


def _which(hits, cases):
    """`"k of n: a, b"`, the cases where a claim held."""
    return f"{len(hits)} of {len(cases)}" + (
        f": {', '.join(hits)}" if hits else ""
    )


def comparison_markdown(summary, datasets, sizes):
    lines = []
    verdicts = {}
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
                lines.append(
                    f"| {size} | {model} | {row['params']:,} | "
                    f"{row['macs'] / 1e6:.1f}M | {_accuracy_cell(row)} | "
                    f"{row['inference']:.0f} | {row['seeds']} |"
                )
        lines.append("")
        for size in sizes:
            jumbo = summary.get((dataset, size, "jumbo"))
            registers = summary.get((dataset, size, "registers"))
            if jumbo and registers:
                gap, spread, verdict = _verdict(
                    jumbo, registers, ("Jumbo", "Registers")
                )
                if not verdict.startswith("no verdict"):
                    verdicts[(dataset, size)] = (gap, verdict)
                lines.append(
                    f"- {size}: Jumbo − Registers = {gap:+.2f} points "
                    f"(largest std {spread:.2f}): {verdict}."
                )
        lines.append("")
    ahead = [k for k, (_, words) in verdicts.items() if words == "Jumbo ahead"]
    narrow = [
        d
        for d in datasets
        if (d, "pico") in verdicts and (d, "nano") in verdicts
    ]
    wider_gap = [
        d for d in narrow if verdicts[(d, "pico")][0] > verdicts[(d, "nano")][0]
    ]
    lines += [
        f"**Does the claim hold here?** Jumbo beats Registers: "
        f"{_answer(len(ahead), len(verdicts))} (beyond the seed spread in "
        f"{len(ahead)} of {len(verdicts)} (set, width) pairs with >= "
        f"{MIN_SEEDS_FOR_VERDICT} seeds). Most at the narrower width: "
        f"{_answer(len(wider_gap), len(narrow))} (pico gap larger than nano "
        f"gap on {len(wider_gap)} of {len(narrow)} sets).",
        "",
    ]
    return lines


def jumbo_ffn_markdown(records):
    """Table 3 at this scale: per-layer vs shared vs LoRA Jumbo FFNs."""
    rows = {}
    for variant in JUMBO_FFN_VARIANTS:
        kind = "compare" if variant == "per_layer" else "jumbo_ffn"
        runs = [
            r
            for r in records
            if r.get("kind", "compare") == kind
            and r["dataset"] == ABLATION_DATASET
            and r["size"] == ABLATION_SIZE
            and r["model"] == "jumbo"
            and (kind == "compare" or r.get("variant") == variant)
        ]
        if runs:
            rows[variant] = _row(runs)
    lines = [
        f"| Jumbo FFN ({ABLATION_DATASET}, {ABLATION_SIZE}, J={NUM_JUMBO}) "
        "| params | test accuracy (%) | inference img/s | seeds |",
        "|---|---|---|---|---|",
    ]
    for variant in JUMBO_FFN_VARIANTS:
        row = rows.get(variant)
        if row is None:
            lines.append(f"| {variant} | | | | 0 |")
            continue
        lines.append(
            f"| {variant} | {row['params']:,} | {_accuracy_cell(row)} | "
            f"{row['inference']:.0f} | {row['seeds']} |"
        )
    lines.append("")
    reference = rows.get("per_layer")
    costs = {}
    for variant, row in rows.items():
        if variant == "per_layer" or reference is None:
            continue
        gap, spread, verdict = _verdict(row, reference, (variant, "per_layer"))
        lines.append(
            f"- {variant} − per_layer = {gap:+.2f} points (largest std "
            f"{spread:.2f}): {verdict}; parameters "
            f"{row['params'] / reference['params']:.2f}x."
        )
        if not verdict.startswith("no verdict"):
            costs[variant] = verdict != "per_layer ahead"
    if costs:
        cheap = [v for v, ok in costs.items() if ok]
        lines += [
            "",
            "**Does the claim hold here?** Sharing the Jumbo FFN (with or "
            "without LoRA) costs no more than the seed spread: "
            f"{_answer(len(cheap), len(costs))} ({_which(cheap, costs)}).",
        ]
    return lines + [""]


def token_drop_markdown(records):
    """§4.2 at this scale: accuracy and training throughput with the
    token-dropping schedule vs without."""
    lines = [
        f"| model ({ABLATION_DATASET}, {ABLATION_SIZE}) | token dropping | "
        "test accuracy (%) | training img/s | seeds |",
        "|---|---|---|---|---|",
    ]
    notes, faster = [], {}
    for model in TOKEN_DROP_MODELS:
        rows = {}
        for kind in ("compare", "token_drop"):
            runs = [
                r
                for r in records
                if r.get("kind", "compare") == kind
                and r["dataset"] == ABLATION_DATASET
                and r["size"] == ABLATION_SIZE
                and r["model"] == model
            ]
            label = (
                "none"
                if kind == "compare"
                else (f"{TOKEN_DROP[0]:.0%} -> {TOKEN_DROP[1]:.0%}")
            )
            if not runs:
                lines.append(f"| {model} | {label} | | | 0 |")
                continue
            rows[kind] = row = _row(runs)
            lines.append(
                f"| {model} | {label} | {_accuracy_cell(row)} | "
                f"{row['training']:.0f} | {row['seeds']} |"
            )
        if len(rows) == 2:
            gap, spread, verdict = _verdict(
                rows["token_drop"], rows["compare"], ("dropping", "none")
            )
            speedup = (
                rows["token_drop"]["training"] / rows["compare"]["training"]
            )
            notes.append(
                f"- {model}: dropping − none = {gap:+.2f} points (largest "
                f"std {spread:.2f}): {verdict}; training throughput "
                f"{speedup:.2f}x."
            )
            if not verdict.startswith("no verdict"):
                faster[model] = (speedup > 1.0, verdict)
    if faster:
        quicker = [m for m, (fast, _) in faster.items() if fast]
        free = [m for m, (_, v) in faster.items() if v != "none ahead"]
        notes += [
            "",
            "**Does the claim hold here?** Token dropping cuts the "
            "training time (whole-fit timing): "
            f"{_answer(len(quicker), len(faster))} "
            f"({_which(quicker, faster)}). Without costing accuracy beyond "
            f"the seed spread: {_answer(len(free), len(faster))} "
            f"({_which(free, faster)}).",
        ]
    return lines + [""] + notes + [""]


def non_deep_markdown(records):
    """Tables 1, 5 and 6 at this scale."""
    groups = group(
        [r for r in records if r.get("kind") == "non_deep"], "variant"
    )
    rows = {variant: _row(runs) for (variant,), runs in groups.items()}
    lines = [
        f"| model ({ABLATION_DATASET}) | layers at inference | params at "
        "inference | MACs | test accuracy (%) | branchy accuracy before "
        "reparameterising (%) | inference img/s | seeds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, (depth, branches, schedule) in NON_DEEP_VARIANTS.items():
        row = rows.get(variant)
        name = (
            f"NonDeepViT-{depth}x{branches}, {schedule} λ → reparameterised"
            if branches > 1
            else f"plain ViT-{depth}"
        )
        if row is None:
            lines.append(f"| {name} | {depth} | | | | | | 0 |")
            continue
        branchy = [
            r["branchy_test_accuracy"]
            for r in groups[(variant,)]
            if "branchy_test_accuracy" in r
        ]
        before = (
            "{:.2f} ± {:.2f}".format(*(100 * v for v in mean_std(branchy)))
            if branchy
            else "—"
        )
        lines.append(
            f"| {name} | {depth} | {row['params']:,} | "
            f"{row['macs'] / 1e6:.1f}M | {_accuracy_cell(row)} | {before} | "
            f"{row['inference']:.0f} | {row['seeds']} |"
        )
    lines.append("")
    pairs = (
        ("6x2_linear", "plain6", "Table 6: joined 6x2 vs plain 6-layer"),
        ("6x2_linear", "plain12", "Table 1: joined 6x2 vs plain 12-layer"),
        ("6x2_linear", "6x2_cosine", "Table 5: linear vs cosine λ"),
        ("6x2_linear", "6x2_instant", "Table 5: linear vs instant λ"),
    )
    answers = {}
    for first, second, label in pairs:
        if first in rows and second in rows:
            gap, spread, verdict = _verdict(
                rows[first], rows[second], (first, second)
            )
            lines.append(
                f"- {label}: {gap:+.2f} points (largest std {spread:.2f}): "
                f"{verdict}."
            )
            if not verdict.startswith("no verdict"):
                answers[second] = verdict
    claims = []
    if "plain6" in answers:
        claims.append(
            "joined 6x2 beats the plain 6-layer ViT (Table 6): "
            + _answer(answers["plain6"] == "6x2_linear ahead", 1)
        )
    if "plain12" in answers:
        claims.append(
            "it comes close to the 12-layer ViT (Table 1; within the seed "
            "spread or ahead): "
            + _answer(answers["plain12"] != "plain12 ahead", 1)
        )
    schedules = [v for v in ("6x2_linear", "6x2_cosine", "6x2_instant")]
    if all(v in rows for v in schedules) and len(answers) == len(pairs):
        order = sorted(schedules, key=lambda v: -rows[v]["accuracy"][0])
        claims.append(
            "linear λ best and instant worst (Table 5): "
            + _answer(order[0] == "6x2_linear", 1)
            + " (by mean: "
            + " > ".join(NON_DEEP_VARIANTS[v][2] for v in order)
            + ", "
            + (
                "differences within the seed spread"
                if all(
                    answers[v] == "within the seed spread"
                    for v in ("6x2_cosine", "6x2_instant")
                )
                else "some beyond the seed spread"
            )
            + ")"
        )
    if claims:
        lines += [
            "",
            "**Does the claim hold here?** " + "; ".join(claims) + ".",
        ]
    return lines + [""]


def resnas_markdown(records):
    """ViT-ResNAS §3 at this scale: search vs random, per seed and mean."""
    runs = [r for r in records if r.get("kind") == "resnas"]
    if not runs:
        return ["No runs yet.", ""]
    columns = (
        ("evolutionary search's pick", lambda r: [r["test_accuracy"]]),
        (
            "random search's pick (as many candidates)",
            lambda r: [r["random_search_test_accuracy"]],
        ),
        (
            "random sub-networks in the MAC window",
            lambda r: r["random_test_accuracies"],
        ),
        ("largest sub-network", lambda r: [r["largest_test_accuracy"]]),
    )
    lines = [
        "| sub-network (test accuracy, %) | mean ± std over seeds | per seed |",
        "|---|---|---|",
    ]
    for name, values in columns:
        per_seed = [float(np.mean(values(r))) for r in runs]
        mean, std = mean_std(per_seed)
        lines.append(
            f"| {name} | {100 * mean:.2f} ± {100 * std:.2f} | "
            + ", ".join(f"{100 * v:.2f}" for v in per_seed)
            + " |"
        )
    gaps = [
        100 * (r["test_accuracy"] - r["random_search_test_accuracy"])
        for r in runs
    ]
    beats = [
        100 * (r["test_accuracy"] - float(np.mean(r["random_test_accuracies"])))
        for r in runs
    ]
    wins = sum(g > 0 for g in gaps)
    held = [
        100 * (r["search_accuracy"] - r["random_search_search_accuracy"])
        for r in runs
    ]
    spreads = [100 * np.ptp(r["random_test_accuracies"]) for r in runs]
    gap, spread, words = _verdict(
        *(
            {"accuracy": mean_std([r[n] for r in runs]), "seeds": len(runs)}
            for n in ("test_accuracy", "random_search_test_accuracy")
        ),
        ("the evolutionary search", "the random search"),
    )
    lines += [
        "",
        f"- **Does the claim hold here?** Evolutionary vs random search on "
        f"the test split: {gap:+.2f} points (largest std {spread:.2f}): "
        f"{words}. On the held-out images both searches optimise, the "
        f"evolutionary pick scored {np.mean(held):+.2f} points vs the random "
        f"search's; random sub-networks of the same MACs span "
        f"{np.mean(spreads):.2f} points of test accuracy per seed (the room "
        "a search has in this space at this scale).",
        f"- Evolutionary − random search: {np.mean(gaps):+.2f} points "
        f"(per seed {', '.join(f'{g:+.2f}' for g in gaps)}; search ahead "
        f"in {wins} of {len(gaps)} seeds).",
        f"- Evolutionary − mean random sub-network: {np.mean(beats):+.2f} "
        f"points (per seed {', '.join(f'{g:+.2f}' for g in beats)}).",
        f"- {len(runs)} seeds; {runs[0]['evaluated']} candidates per search, "
        f"MAC budget {runs[0]['mac_budget'] / 1e6:.2f}M, "
        f"{runs[0]['search_examples']} held-out training images, "
        f"{runs[0]['test_examples']} test images; super-network training "
        f"{np.median([r['train_seconds'] for r in runs]) / 60:.1f} min.",
        "",
    ]
    return lines


def _section_text(section, args, records, summary):
    if section == "compare":
        return [
            "## Jumbo vs Registers vs plain ViT",
            "",
            "Paper (Jumbo, Fig. 1/4): Jumbo (J=6) beats ViT+Registers (R=16) "
            "most at narrow widths (+13.5 points at nano on ImageNet-1K). "
            f"Here: depth {DEPTH}, equal epochs per set "
            f"({', '.join(f'{d}: {EPOCHS[d]}' for d in args.datasets)}), "
            "test accuracy on the whole test split, mean ± sample std over "
            "seeds.",
            "",
        ] + comparison_markdown(summary, args.datasets, args.sizes)
    if section == "jumbo_ffn":
        return [
            "## Jumbo FFN: per layer vs shared vs LoRA (Table 3)",
            "",
            "Paper (Jumbo Table 3, ImageNet-21K, ViT-S): sharing one Jumbo "
            "FFN over the layers cuts the parameters 6.3x for -0.34 points "
            "(44.95 → 44.61%); layer-specific LoRAs on the shared FFN "
            "recover it (rank 8: 44.94%, rank 32: 44.97%). Here: pico, "
            f"depth {DEPTH}, {ABLATION_DATASET}, {EPOCHS[ABLATION_DATASET]} "
            "epochs; `per_layer` is the `compare` Jumbo run.",
            "",
        ] + jumbo_ffn_markdown(records)
    if section == "token_drop":
        return [
            "## Token dropping (§4.2)",
            "",
            "Paper (Jumbo §4.2, ImageNet-21K): dropping 90% → 10% of the "
            "patch tokens (linear over training) halves the tokens "
            "processed, used to cut the training cost of every model "
            "alike; the paper reports no accuracy without it. Here: the "
            "same schedule (`TokenDropSchedule(0.9, 0.1)`) vs none, pico, "
            f"depth {DEPTH}, {ABLATION_DATASET}, "
            f"{EPOCHS[ABLATION_DATASET]} epochs; training images/s is the "
            "whole `fit` (including the retraces when the kept-token count "
            "changes), so it understates the steady-state gain.",
            "",
        ] + token_drop_markdown(records)
    if section == "non_deep":
        return [
            "## Non-Deep ViT: joined branches vs depth (Tables 1, 5, 6)",
            "",
            "Paper (Non-Deep ViT, ImageNet-1K): the 6x2 branchy model, "
            "joined and reparameterised into 6 layers, beats its "
            "depth-scaled 6-layer baseline (Table 6: +3.4 points for "
            "D-MAE-6-R) and approaches the 12-layer model (Table 1: DeiT-6-R "
            "70.2% vs DeiT-Tiny 72.2%); linear λ is the best schedule and "
            "instant joining the worst (Table 5, CIFAR-10). Here: DeiT-Tiny "
            f"width (192, 12 heads, average pooling), {ABLATION_DATASET}, "
            f"{EPOCHS[ABLATION_DATASET]} epochs for every model; the branchy "
            f"ones pre-train at λ=0 for "
            f"{round(NON_DEEP_PRETRAIN_FRACTION * EPOCHS[ABLATION_DATASET])}"
            " of them and join over the rest (λ warm-up over 60% of the "
            "join steps, then λ=1), and are scored after "
            "`convert.reparameterize` as plain 6-layer ViTs.",
            "",
        ] + non_deep_markdown(records)
    if section == "resnas":
        search = RESNAS["search"]
        return [
            "## ViT-ResNAS: evolutionary search vs random (§3)",
            "",
            "Paper (ViT-ResNAS §2.3, §3): evolutionary search over the "
            "weight-sharing super-network finds better sub-networks at a "
            "MAC budget than random sampling (its searched networks are "
            "retrained; here every sub-network keeps the super-network's "
            "weights). Here: the recipe's small space "
            "(`recipes.vit_resnas_supernet.smoke_space`), Fashion-MNIST "
            f"upsampled to {RESNAS['image_size']} px, "
            f"{RESNAS['train_examples']:,} training images of which "
            f"{RESNAS['search_per_class']} per class are held out for the "
            f"search, {RESNAS['epochs']} epochs of super-network training "
            f"(N_a = {RESNAS['num_architectures']}, batch "
            f"{RESNAS['batch_size']}, largest sub-network only over the "
            "first 25%), the Tiny space's budget placed in this space "
            "(`search_budget`), search with population "
            f"{search['population_size']}, {search['num_parents']} parents, "
            f"{search['num_children']} children, {search['iterations']} "
            "iterations (the paper: 500/75/150/20); the random search scores "
            "as many random candidates in the same MAC window "
            "[0.975 C, C] and keeps the best; the first "
            f"{RESNAS['random_subnets']} of them are also scored on the test "
            "split. Every number is on the whole 10k test split.",
            "",
        ] + resnas_markdown(records)
    raise ValueError(
        f"`section` must be one of {SECTIONS}. Received: section={section!r}"
    )


def _backends(records):
    """The Keras backends of the records (records written before the
    `backend` field existed were all trained on JAX)."""
    return sorted({r.get("backend", "jax") for r in records}) or ["-"]


def write_results(path, args):
    done = group(load_records(args.records), *_KEY_FIELDS)
    append = appender(args.records)
    kept, missing, seen = [], [], set()
    for section in args.sections:
        for spec in specs(section, args.datasets, args.sizes, args.seeds):
            key = _key(spec)
            if key in seen:
                continue
            seen.add(key)
            label = _label(spec)
            record = reuse_or_run(
                done.get(key, []),
                lambda spec=spec: run_spec(spec),
                args.from_records,
                append,
                lambda r, label=label: (
                    f"{label}: {100 * r['test_accuracy']:.2f}% "
                    f"({r['train_seconds'] / 60:.1f} min)"
                ),
            )
            (missing if record is None else kept).append(record or label)
    summary = summarize(kept)
    lines = [
        "# Image results",
        "",
        f"Produced by `python -m recipes.image_results --records "
        f"{args.records} --results {path}` on {platform.machine()} with "
        f"{os.cpu_count()} CPU cores, no GPU, "
        f"{time.strftime('%Y-%m-%d')}. Runs trained on Keras "
        f"{keras.__version__} / " + ", ".join(_backends(kept)) + ". Settings "
        "and data: `recipes/image_results.py`. Throughput columns were "
        "measured inside the runs, often while another study shared the 2 "
        "cores or while the run was paused for a benchmark: they are "
        "indications only; `benchmarks/` has the controlled speed "
        "measurements.",
        "",
    ]
    for section in args.sections:
        lines += _section_text(section, args, kept, summary) + [
            "Reproduce this section (reuses the finished runs of the "
            "records, trains the missing ones, writes this section alone): "
            f"`KERAS_BACKEND=jax python -m recipes.image_results --sections "
            f"{section} --records {args.records} --results {section}.md`.",
            "",
        ]
    if missing:
        lines += [f"Not yet run ({len(missing)}): " + ", ".join(missing), ""]
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
        "--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS)
    )
    parser.add_argument(
        "--datasets", nargs="+", choices=DATASETS, default=list(DATASETS)
    )
    parser.add_argument(
        "--sizes", nargs="+", choices=SIZES, default=list(SIZES)
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    common.add_huge_pages_argument(parser)
    args = parser.parse_args(argv)
    write_results(args.results, args)
    return 0


if __name__ == "__main__":
    common.restart_with_huge_pages()
    raise SystemExit(main())
