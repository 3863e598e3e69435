"""What every image recipe shares: the command line, data, optimiser and
schedule, callbacks (resume, NaN guard, logs), mixed precision, seeds and
multi-device training.

A recipe is an `ImageRecipe` (configuration as code) plus `run(recipe)`.
Each run writes to `--output-dir`:
    backup/      `keras.callbacks.BackupAndRestore` state (deleted at the
                 end of a finished run; a restarted run resumes from it)
    log.csv      per-epoch metrics (`keras.callbacks.CSVLogger`)
    tensorboard/ with `--tensorboard`
    model.keras  the trained model (the student, for distillation)
    result.json  final metrics and the settings used

Data:
    --smoke                      real Fashion-MNIST (offline, Debian
                                 `dataset-fashion-mnist`), tiny model, a
                                 few minutes on a CPU
    --data-dir D                 ImageNet-style folders D/train/<class>/*
                                 and D/val/<class>/*
    --tfds NAME --tfds-data-dir  a tensorflow-datasets dataset prepared
                                 beforehand (never downloaded)

Resuming: rerun the same command with the same `--output-dir`. The run
continues from the last finished epoch; data order, augmentation and
dropout of every epoch depend only on `(--seed, epoch)`
(`keras_jumbo.callbacks.EpochSeed`), so for in-memory data (`--smoke`) the
result equals an uninterrupted run (tests/recipes). Streaming pipelines
(`--data-dir`, `--tfds`) resume at the epoch too; their augmentation seeds
restart per process, so they resume statistically, not bit for bit.

Multi-device: `--distribution data` (JAX `keras.distribution.DataParallel`
over all local devices), `--distribution model` (JAX `ModelParallel`, the
Jumbo FFNs sharded over the devices), `--distribution mirrored`
(TensorFlow `MirroredStrategy`). `--batch-size` is the global batch. On a
node with 8 GPUs:
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k \\
        --data-dir /data/imagenet --distribution data --batch-size 1024
"""

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable

import keras
import numpy as np

from keras_jumbo import callbacks as kj_callbacks
from keras_jumbo import data as kj_data
from keras_jumbo import distribution as kj_distribution
from keras_jumbo import losses as kj_losses
from keras_jumbo import models as kj_models
from keras_jumbo import optimizers as kj_optimizers
from keras_jumbo import runtime as kj_runtime
from keras_jumbo.schedules import warmup_cosine

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FASHION_MNIST_MEAN, FASHION_MNIST_STD = 0.2860, 0.3530
AUGMENTATIONS = ("three_augment", "rand_augment", "none")
# DeiT's supervised ImageNet settings (Touvron et al., 2021), which the
# Non-Deep ViT and ViT-ResNAS papers train with.
DEIT = dict(
    image_size=224,
    batch_size=1024,
    learning_rate=1e-3,
    weight_decay=0.05,
    end_learning_rate=1e-6,
    clipnorm=None,
    augmentation="rand_augment",
    mixup_alpha=0.8,
    cutmix_alpha=1.0,
)


@dataclasses.dataclass
class ImageRecipe:
    """A training recipe as code.

    `build_model(num_classes, image_size, smoke)` returns the model to
    train. `teacher_image_size` set means function-matching distillation
    (`keras_jumbo.losses.Distiller`), a teacher must then be given with
    `--teacher` (a `.keras` file or a registry name); smoke runs train a
    small convolutional teacher first. `callbacks(model, train_data,
    total_steps)` adds recipe-specific callbacks; `finish(model, args,
    evaluate)` post-processes the trained model and returns extra results.
    `make_train_data(images, labels, recipe, args, kwargs)` replaces the
    in-memory training batches (smoke); `map_stream(images, labels, step,
    total_steps)` maps every streamed training batch (`--data-dir`,
    `--tfds`) to the model's inputs; `evaluate(model, val)` replaces
    top-1 accuracy of `model(images)` (and turns off validation in `fit`);
    `wrap_model(model, args, train)` returns the model to compile and fit
    around the one being trained (e.g. an attention-map distiller); the
    inner model is the one saved. `state` is scratch space shared by a
    recipe's hooks. `smoke` overrides fields for `--smoke`.
    `torch_compile=False` keeps `--jit-compile auto` eager on PyTorch
    whatever the run's length (`resolve_jit_compile`).
    """

    name: str
    build_model: Callable
    image_size: int
    epochs: int
    batch_size: int
    learning_rate: float
    weight_decay: float
    end_learning_rate: float = 1e-5
    warmup_fraction: float = 0.1
    clipnorm: float | None = 1.0
    augmentation: str = "three_augment"
    mixup_alpha: float = 0.8
    cutmix_alpha: float = 1.0
    teacher_image_size: int | None = None
    needs_init: bool = False
    callbacks: Callable | None = None
    finish: Callable | None = None
    make_train_data: Callable | None = None
    map_stream: Callable | None = None
    evaluate: Callable | None = None
    wrap_model: Callable | None = None
    torch_compile: bool = True
    state: dict = dataclasses.field(default_factory=dict)
    smoke: dict = dataclasses.field(default_factory=dict)

    def for_smoke(self):
        return dataclasses.replace(self, **self.smoke)


def parser(recipe, description):
    p = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--smoke", action="store_true", help="Fashion-MNIST run")
    p.add_argument("--data-dir", help="folder with train/ and val/")
    p.add_argument("--tfds", help="tensorflow-datasets name (prepared)")
    p.add_argument("--tfds-data-dir", help="tfds data_dir")
    p.add_argument("--tfds-splits", nargs=2, default=["train", "validation"])
    p.add_argument("--output-dir", default=f"runs/{recipe.name}")
    p.add_argument("--teacher", help=".keras file or registry model name")
    p.add_argument("--init", help=".keras model to start from (fine-tune)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--learning-rate", type=float)
    p.add_argument("--train-examples", type=int, default=4096)
    p.add_argument("--val-examples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mixed-precision",
        choices=["none", "bfloat16", "float16"],
        default="none",
    )
    p.add_argument(
        "--distribution",
        choices=kj_distribution.DISTRIBUTIONS,
        default="none",
    )
    p.add_argument("--model-axis-size", type=int)
    p.add_argument(
        "--jit-compile",
        choices=("auto", "true", "false"),
        default="auto",
        help="auto: XLA on JAX and TensorFlow (Keras' own default turns "
        "XLA off for TensorFlow on CPU-only machines; with it, pico trains "
        "1.26x faster there); on PyTorch torch.compile for a run of at "
        f"least {TORCH_COMPILE_MIN_STEPS} training steps when a C++ "
        "compiler is found, else eager (compiling takes minutes on a CPU "
        "and pays back after a few thousand steps); benchmarks/README.md",
    )
    p.add_argument(
        "--allocator",
        choices=("auto", "default"),
        default="auto",
        help="auto: run as a script, the recipe first starts itself again "
        "with glibc's malloc on transparent huge pages "
        "(keras_jumbo.runtime.restart_with_huge_pages; every backend, where "
        "Linux's mode is 'madvise'; JAX training steps ~1.2x faster on 2 "
        "CPU cores); on JAX it also keeps the memory a training step frees "
        "in the process (keras_jumbo.runtime.keep_freed_memory; JAX then "
        "runs its computations on the calling thread), except the Non-Deep "
        "ViT recipe's branchy stages on huge pages. default: glibc's "
        "defaults and JAX's asynchronous dispatch",
    )
    p.add_argument("--tensorboard", action="store_true")
    p.add_argument("--verbose", type=int, default=2)
    return p


def add_huge_pages_argument(parser):
    """`--allocator auto|default` for a recipe whose only allocator setting
    is the restart with huge pages (`restart_with_huge_pages`): the
    time-series and results recipes."""
    parser.add_argument(
        "--allocator",
        choices=("auto", "default"),
        default="auto",
        help="auto: run as a script, start again with glibc's malloc on "
        "transparent huge pages first (keras_jumbo.runtime."
        "restart_with_huge_pages; e.g. the PatchTST forecaster's and "
        "MS-PatchTST's training steps ~1.2x faster on 2 CPU cores; "
        "the time-series --fusion-study on JAX also keeps freed memory, "
        "keras_jumbo.runtime.keep_freed_memory); default: glibc's defaults",
    )


def restart_with_huge_pages(argv=None):
    """A recipe script's first step (under `if __name__ == "__main__"`):
    unless its command line `argv` (default `sys.argv[1:]`) says
    `--allocator default`, start the process again with glibc's malloc on
    transparent huge pages (`keras_jumbo.runtime.restart_with_huge_pages`,
    every backend; it does not return then). Only there: tests and other
    code call the recipes' `main` in their own process, which a restart
    would replace. Returns False when it does not restart."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("--allocator", default="auto")
    known, _ = flags.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.allocator == "default":
        return False
    return kj_runtime.restart_with_huge_pages()


def allocator_label(kept):
    """What a benchmark records of the process's allocator: "huge-pages"
    when it started with glibc's malloc on transparent huge pages
    (`keras_jumbo.runtime.huge_pages_active()`), "kept" when `kept`
    (`apply_allocator` applied `keep_freed_memory`), both joined by "+",
    else "default"."""
    labels = ["huge-pages"] if kj_runtime.huge_pages_active() else []
    labels += ["kept"] if kept else []
    return "+".join(labels) or "default"


def apply_allocator(flag):
    """`--allocator`: True when `keras_jumbo.runtime.keep_freed_memory`
    was applied: flag "auto", on JAX, with glibc (every image recipe and
    the time-series recipe's MS-PatchTST fusion study, also in a process
    started with glibc's malloc on transparent huge pages).
    On top of huge pages it measured 1.11-1.23x for the official pico
    Jumbo's training step (`vs_official.py`, `jax_kept` against `jax`) and
    1.02-1.07x for pico / tiny Jumbo in other runs; NonDeepViT-6x2 at 224
    px, batch 16, trained at 21.6-23.2 img/s with it against 18.8-21.1
    without, now that the models' steps wait for their batches
    (benchmarks/README.md, forty-third session; before that its steps
    faulted ~1.7 GB each in most processes and its recipe left it out).
    It must run before the run's first JAX computation, so `run` calls it
    first."""
    if flag not in ("auto", "default"):
        raise ValueError(
            "`allocator` must be 'auto' or 'default'. "
            f"Received: allocator={flag!r}"
        )
    if flag == "default" or keras.backend.backend() != "jax":
        return False
    return kj_runtime.keep_freed_memory()


# "auto" compiles PyTorch runs of at least this many training steps. On a
# 2-core CPU compiling the smoke recipes' steps took 1.3-2.7 minutes (Jumbo
# pico with distillation, Non-Deep ViT 6x2 with its diversity loss) and cut
# the Jumbo step from 115 to 62 ms: it paid back after ~1,500 steps; the
# margin covers larger models' longer compiles (benchmarks/README.md).
TORCH_COMPILE_MIN_STEPS = 10_000


def cxx_compiler():
    """The C++ compiler torch.compile's CPU code generation would use
    (`$CXX`, else `g++`, `c++` or `clang++` on the PATH), or None."""
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def resolve_jit_compile(flag, total_steps, torch_compile=True):
    """`--jit-compile` as `model.compile`'s argument, for a run of
    `total_steps` training steps.

    "auto" is XLA on JAX and on TensorFlow too: Keras' "auto" turns it off
    on CPU-only TensorFlow machines, where it is the faster setting
    (`benchmarks/vs_official.py`, `tensorflow_xla`: 1.26x training, 1.27x
    inference at pico). On PyTorch "auto" is `torch.compile` for a run of
    at least `TORCH_COMPILE_MIN_STEPS` steps when a C++ compiler is found
    (`cxx_compiler`), else eager: compiling costs minutes once, each step
    is then at least as fast (pico at 128 px, 2026-11-26: training 1.31x
    the official eager step compiled, 1.29x eager; on small inputs, where
    eager PyTorch pays per op, the smoke recipes' Jumbo step took 62
    against 115 ms on 2026-11-25). `torch_compile=False` (a recipe whose
    compiled step is no faster) keeps "auto" eager on PyTorch."""
    if flag not in ("auto", "true", "false"):
        raise ValueError(
            "`jit_compile` must be one of 'auto', 'true', 'false'. "
            f"Received: jit_compile={flag!r}"
        )
    if flag != "auto":
        return flag == "true"
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return True
    if backend == "torch":
        long_run = total_steps >= TORCH_COMPILE_MIN_STEPS
        return torch_compile and long_run and bool(cxx_compiler())
    return "auto"


def _smoke_data(args):
    """Real Fashion-MNIST as 3-channel uint8 images (offline)."""
    (x_train, y_train), (x_test, y_test) = kj_data.load_fashion_mnist()
    rng = np.random.default_rng(args.seed)
    train = rng.permutation(len(x_train))[: args.train_examples]
    x_train, y_train = x_train[train], y_train[train]
    x_val, y_val = x_test[: args.val_examples], y_test[: args.val_examples]

    def rgb(x):
        return np.repeat(x[..., None], 3, axis=-1)

    return (rgb(x_train), y_train), (rgb(x_val), y_val), 10


# Runs of at least this many training steps augment with one compiled
# program per batch shape (`BatchAugmentation(compiled=True)`: 3-Augment
# 1.71x faster a batch on JAX at 224 px, 1.21x on TensorFlow, the same on
# PyTorch; `benchmarks/augment_throughput.py`); shorter runs (the smoke
# runs, the tests) layer by layer, where compiling the whole program once
# is not paid back. Without an accelerator the augmentations run per image
# on the host (`implementation="auto"`: `HostRandAugment`,
# `HostThreeAugment`) and only the MixUp/CutMix step is compiled.
AUGMENT_COMPILE_MIN_STEPS = 500


def _check_augmentation(recipe):
    if recipe.augmentation not in AUGMENTATIONS:
        raise ValueError(
            f"`augmentation` must be one of {AUGMENTATIONS}. "
            f"Received: augmentation={recipe.augmentation!r}"
        )


def _augmentation(recipe, total_steps):
    _check_augmentation(recipe)
    compiled = total_steps >= AUGMENT_COMPILE_MIN_STEPS
    kind = recipe.augmentation
    mix = dict(mixup_alpha=recipe.mixup_alpha, cutmix_alpha=recipe.cutmix_alpha)
    if kind == "three_augment":
        return kj_data.three_augment(**mix, compiled=compiled)
    if kind == "rand_augment":
        return kj_data.rand_augment(**mix, compiled=compiled)
    if recipe.mixup_alpha or recipe.cutmix_alpha:
        return kj_data.BatchAugmentation(
            [], kj_data.MixUpOrCutMix(**mix, compiled=compiled), compiled
        )
    return None


def load_data(recipe, args):
    """`(train, val, steps_per_epoch, num_classes, mean, std)`."""
    _check_augmentation(recipe)  # before any data loads
    if args.smoke:
        (x, y), (x_val, y_val), num_classes = _smoke_data(args)
        augmentation = _augmentation(
            recipe, len(x) // recipe.batch_size * recipe.epochs
        )
        if recipe.image_size != x.shape[1]:
            x = _resize(x, recipe.image_size)
            x_val = _resize(x_val, recipe.image_size)
        mean = (FASHION_MNIST_MEAN,) * 3
        std = (FASHION_MNIST_STD,) * 3
        common = dict(num_classes=num_classes, mean=mean, std=std)
        if recipe.make_train_data is not None:
            train = recipe.make_train_data(x, y, recipe, args, common)
        else:
            train = kj_data.ImageBatches(
                x,
                y,
                recipe.batch_size,
                augmentation=augmentation,
                seed=args.seed,
                drop_remainder=True,
                **common,
            )
        val = kj_data.ImageBatches(x_val, y_val, 256, shuffle=False, **common)
        return train, val, len(train), num_classes, mean, std
    if args.data_dir:
        train_ds = kj_data.image_directory_dataset(
            os.path.join(args.data_dir, "train"),
            recipe.image_size,
            recipe.batch_size,
            seed=args.seed,
        )
        num_classes = len(train_ds.class_names)
        val_ds = kj_data.image_directory_dataset(
            os.path.join(args.data_dir, "val"),
            recipe.image_size,
            256,
            shuffle=False,
        )
    elif args.tfds:
        train_split, val_split = args.tfds_splits
        common = dict(data_dir=args.tfds_data_dir, seed=args.seed)
        train_ds = kj_data.tfds_dataset(
            args.tfds,
            train_split,
            recipe.image_size,
            recipe.batch_size,
            **common,
        )
        val_ds = kj_data.tfds_dataset(
            args.tfds,
            val_split,
            recipe.image_size,
            256,
            shuffle=False,
            **common,
        )
        import tensorflow_datasets as tfds

        builder = tfds.builder(args.tfds, data_dir=args.tfds_data_dir)
        num_classes = builder.info.features["label"].num_classes
    else:
        raise ValueError(
            "Give the data: --smoke, --data-dir DIR or --tfds NAME. "
            "Received none of them."
        )
    steps = int(train_ds.cardinality())
    if steps <= 0:
        raise ValueError(
            f"Cannot count the training batches (cardinality {steps})."
        )
    one_hot = _one_hot_batches(num_classes)
    train = kj_data.augmented_batches(
        train_ds.map(one_hot),
        _augmentation(recipe, steps * recipe.epochs),
        seed=args.seed,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
    )
    if recipe.map_stream is not None:
        train = _mapped(train, recipe.map_stream, steps * recipe.epochs)
    val = kj_data.augmented_batches(
        val_ds.map(one_hot), None, mean=IMAGENET_MEAN, std=IMAGENET_STD
    )
    return train, val, steps, num_classes, IMAGENET_MEAN, IMAGENET_STD


def _mapped(batches, function, total_steps):
    for step, (images, labels) in enumerate(batches):
        yield function(images, labels, step, total_steps)


def _one_hot_batches(num_classes):
    import tensorflow as tf

    return lambda x, y: (x, tf.one_hot(y, num_classes))


def _resize(images, size):
    resized = keras.ops.image.resize(
        images.astype("float32"), (size, size), interpolation="bilinear"
    )
    return np.clip(keras.ops.convert_to_numpy(resized), 0, 255)


def smoke_teacher(train, image_size, epochs=6):
    """A small MLP trained for a few epochs at `image_size` (2x the
    student's) on the smoke images without augmentation: any Keras model
    can teach. No convolutions: XLA's CPU convolution gradients made a
    three-layer CNN teacher take ~100 s of a JAX smoke run on the 2-core
    machines; this one trains in ~3 s and learns more in its six epochs
    (training accuracy 0.88 against the CNN's 0.70)."""
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.AveragePooling2D(2)(inputs)
    x = keras.layers.Flatten()(x)
    for units in (256, 128):
        x = keras.layers.Dense(units, activation="relu")(x)
    teacher = keras.Model(
        inputs, keras.layers.Dense(train.num_classes)(x), name="teacher"
    )
    resize = keras.layers.Resizing(image_size, image_size)
    teacher = keras.Sequential(
        [keras.Input(train.images.shape[1:]), resize, teacher]
    )
    fit_smoke_teacher(teacher, train, epochs, keras.optimizers.Adam(3e-3))
    return teacher.layers[-1]


def fit_smoke_teacher(teacher, train, epochs, optimizer, label="teacher"):
    """Train a smoke run's teacher on the smoke images, unaugmented."""
    plain = kj_data.ImageBatches(
        train.images,
        train.labels,
        128,
        num_classes=train.num_classes,
        mean=train.mean,
        std=train.std,
        seed=1,
    )
    teacher.compile(
        optimizer=optimizer,
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
        metrics=["categorical_accuracy"],
    )
    history = teacher.fit(plain, epochs=epochs, verbose=0)
    print(
        f"smoke {label}: training accuracy "
        f"{history.history['categorical_accuracy'][-1]:.3f}"
    )
    return teacher


def load_teacher(name_or_path, num_classes, image_size):
    if name_or_path.endswith(".keras"):
        return keras.saving.load_model(name_or_path)
    return kj_models.create_model(
        name_or_path, num_classes=num_classes, image_size=image_size
    )


def run(recipe, argv=None, description=None, extra_callbacks=()):
    """Run `recipe` from the command line `argv`; returns the result dict.

    `extra_callbacks` are appended to the recipe's (tests use them)."""
    args = parser(recipe, description or recipe.name).parse_args(argv)
    if kj_runtime.huge_pages_active():
        print("allocator: glibc's malloc on transparent huge pages")
    if apply_allocator(args.allocator):
        print("allocator: freed memory kept in the process (--allocator auto)")
    if args.smoke:
        recipe = recipe.for_smoke()
    overrides = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
    }
    recipe = dataclasses.replace(
        recipe, **{k: v for k, v in overrides.items() if v is not None}
    )
    if recipe.needs_init and not args.init and not args.smoke:
        raise ValueError(
            f"Recipe {recipe.name!r} fine-tunes a trained model: pass "
            "--init model.keras. Received: init=None"
        )
    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision != "none":
        keras.mixed_precision.set_dtype_policy(f"mixed_{args.mixed_precision}")
    os.makedirs(args.output_dir, exist_ok=True)

    train, val, steps, num_classes, _, _ = load_data(recipe, args)
    recipe.state["val"] = val
    recipe.state["seed"] = args.seed
    recipe.state["validation_steps"] = int(math.ceil(args.val_examples / 256))
    total_steps = steps * recipe.epochs

    with kj_distribution.distribution_scope(
        args.distribution, args.model_axis_size
    ):
        if args.init:
            model = keras.saving.load_model(args.init)
            size = (recipe.image_size, recipe.image_size)
            if tuple(model.input_shape[1:3]) != size:
                model = kj_models.with_image_size(model, recipe.image_size)
        else:
            model = recipe.build_model(
                num_classes=num_classes,
                image_size=recipe.image_size,
                smoke=args.smoke,
            )
        trained = model
        loss = keras.losses.CategoricalCrossentropy(from_logits=True)
        if recipe.teacher_image_size is not None:
            if args.teacher:
                teacher = load_teacher(
                    args.teacher, num_classes, recipe.teacher_image_size
                )
            elif args.smoke:
                teacher = smoke_teacher(train, recipe.teacher_image_size)
            else:
                raise ValueError(
                    f"Recipe {recipe.name!r} distils from a teacher: pass "
                    "--teacher (a .keras file or a registry name). "
                    "Received: teacher=None"
                )
            trained = kj_losses.Distiller(
                model, teacher, teacher_image_size=recipe.teacher_image_size
            )
            loss = None
        if recipe.wrap_model is not None:
            trained = recipe.wrap_model(model, args, train)
        optimizer = kj_optimizers.AdamW(
            warmup_cosine(
                recipe.learning_rate,
                total_steps,
                recipe.warmup_fraction,
                recipe.end_learning_rate,
            ),
            weight_decay=recipe.weight_decay,
            global_clipnorm=recipe.clipnorm,
        )
        jit_compile = resolve_jit_compile(
            args.jit_compile, total_steps, recipe.torch_compile
        )
        print(
            f"jit_compile={jit_compile!r} (--jit-compile {args.jit_compile}, "
            f"{keras.backend.backend()}, {total_steps} training steps)"
        )
        trained.compile(
            optimizer=optimizer,
            loss=loss,
            metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
            jit_compile=jit_compile,
        )
        if not trained.built:  # BackupAndRestore needs built weights
            size = recipe.image_size
            trained(np.zeros((1, size, size, 3), "float32"))

    callbacks = [
        kj_callbacks.EpochSeed(
            args.seed, [train] if hasattr(train, "set_epoch") else []
        ),
        keras.callbacks.BackupAndRestore(
            os.path.join(args.output_dir, "backup")
        ),
        keras.callbacks.TerminateOnNaN(),
        keras.callbacks.CSVLogger(
            os.path.join(args.output_dir, "log.csv"), append=True
        ),
    ]
    if args.tensorboard:
        callbacks.append(
            keras.callbacks.TensorBoard(
                os.path.join(args.output_dir, "tensorboard")
            )
        )
    if recipe.callbacks is not None:
        callbacks += recipe.callbacks(model, train, total_steps)
    start = time.time()
    fit_kwargs = {}
    if not hasattr(train, "__len__"):
        fit_kwargs = dict(
            steps_per_epoch=steps,
            validation_steps=int(math.ceil(args.val_examples / 256)),
        )
    history = trained.fit(
        train,
        # The datasets shuffle themselves by (seed, epoch); fit's own batch
        # shuffle draws from the global RNG, which a restart replays.
        shuffle=False,
        validation_data=val if recipe.evaluate is None else None,
        epochs=recipe.epochs,
        callbacks=callbacks + list(extra_callbacks),
        verbose=args.verbose,
        **fit_kwargs,
    )
    minutes = (time.time() - start) / 60
    evaluate = lambda m: _accuracy(m, val, fit_kwargs)  # noqa: E731
    model_accuracy = (
        recipe.evaluate(model, val) if recipe.evaluate else evaluate(model)
    )
    result = {
        "recipe": recipe.name,
        "backend": keras.backend.backend(),
        "smoke": args.smoke,
        "epochs": recipe.epochs,
        "seed": args.seed,
        "val_accuracy": model_accuracy,
        "last_loss": history.history.get("loss", [math.nan])[-1],
        "train_minutes": round(minutes, 2),
    }
    model.save(os.path.join(args.output_dir, "model.keras"))
    if recipe.finish is not None:
        result.update(recipe.finish(model, args, evaluate))
    with open(os.path.join(args.output_dir, "result.json"), "w") as handle:
        json.dump(result, handle, indent=1)
    print(json.dumps(result))
    return result


def _accuracy(model, val, fit_kwargs):
    """Top-1 accuracy of `model` (images -> logits) on the validation data."""
    correct = total = 0
    if hasattr(val, "__len__"):
        batches = (val[i] for i in range(len(val)))
    else:
        steps = fit_kwargs["validation_steps"]
        batches = (next(val) for _ in range(steps))
    for images, labels in batches:
        logits = keras.ops.convert_to_numpy(model.predict_on_batch(images))
        correct += int(np.sum(logits.argmax(-1) == labels.argmax(-1)))
        total += len(labels)
    return correct / max(total, 1)
