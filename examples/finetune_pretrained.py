"""Fine-tune a pretrained JumboViT (official ImageNet-1K) on Fashion-MNIST.

`JumboViT.from_preset(preset, num_classes=10, image_size=64)` keeps the
pretrained backbone, starts a fresh 10-class head (it says so in one log
line) and resamples the position embeddings from 224 px to 64 px. The
images go through the official evaluation preprocessing
(`ImageNetPreprocessing`: resize the short side, centre crop, ImageNet
mean/std) after the grey channel is repeated three times. Accuracy is on
the whole Fashion-MNIST test split (10,000 images).

Weights: `--preset jumbo_pico_imagenet1k` (default) downloads the official
`jumbo_pico.pth` once (Hugging Face `antofuller/jumbo`), converts and caches
it. Offline, download the file elsewhere and pass its path:
`--preset /path/to/jumbo_pico.pth`. `--random-preset` writes a preset
directory with randomly initialised weights of the same architecture and
fine-tunes from it: the offline smoke run CI does (the accuracy then says
nothing about pretraining).

Expected result: not measured here (these machines cannot download the
official weights); the random-preset smoke run (1 epoch, 1,024 images)
checks the path end to end.

Command:
    KERAS_BACKEND=jax python examples/finetune_pretrained.py \\
        --preset jumbo_pico_imagenet1k --epochs 3
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_jumbo  # noqa: E402
from keras_jumbo.convert import official_jumbo_model  # noqa: E402
from keras_jumbo.data import load_fashion_mnist  # noqa: E402
from keras_jumbo.layers import ImageNetPreprocessing  # noqa: E402
from keras_jumbo.models import JumboViT  # noqa: E402


def preprocess(images, image_size, batch_size=1000):
    """uint8 `(n, 28, 28)` -> ImageNet-normalised `(n, S, S, 3)` float32."""
    layer = ImageNetPreprocessing(image_size)
    rgb = np.repeat(images[..., None], 3, axis=-1)
    return np.concatenate(
        [
            keras.ops.convert_to_numpy(layer(rgb[i : i + batch_size]))
            for i in range(0, len(rgb), batch_size)
        ]
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="jumbo_pico_imagenet1k")
    parser.add_argument(
        "--random-preset",
        action="store_true",
        help="fine-tune from a random-weight pico preset (offline smoke)",
    )
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--train-examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(args.seed)

    (x_train, y_train), (x_test, y_test) = load_fashion_mnist()
    x_train, y_train = (
        x_train[: args.train_examples],
        y_train[: args.train_examples],
    )
    x_train = preprocess(x_train, args.image_size)
    x_test = preprocess(x_test, args.image_size)
    print(
        f"backend={keras.backend.backend()} keras_jumbo="
        f"{keras_jumbo.__version__} train={len(x_train)} test={len(x_test)}"
    )

    preset = args.preset
    scratch = None
    if args.random_preset:
        scratch = tempfile.TemporaryDirectory()
        preset = official_jumbo_model("pico").save_to_preset(
            os.path.join(scratch.name, "random_pico")
        )
        print("random-weight preset (smoke run):", preset)
    model = JumboViT.from_preset(
        preset, num_classes=10, image_size=args.image_size
    )
    steps = int(np.ceil(len(x_train) / args.batch_size)) * args.epochs
    schedule = keras_jumbo.schedules.WarmupCosineDecay(
        0.0,
        decay_steps=steps - steps // 10,
        warmup_target=args.learning_rate,
        warmup_steps=steps // 10,
    )
    model.compile(
        optimizer=keras_jumbo.optimizers.AdamW(
            schedule, weight_decay=0.05, global_clipnorm=1.0
        ),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.time()
    model.fit(
        x_train,
        y_train,
        batch_size=args.batch_size,
        epochs=args.epochs,
        verbose=2 if os.environ.get("CI") else 1,
    )
    _, accuracy = model.evaluate(x_test, y_test, batch_size=500, verbose=0)
    minutes = (time.time() - start) / 60
    print(
        f"test accuracy (all {len(x_test)} test images): {accuracy:.4f} "
        f"({minutes:.1f} min)"
    )
    if scratch is not None:
        scratch.cleanup()
    return accuracy


if __name__ == "__main__":
    # glibc's malloc on transparent huge pages (every backend; faster
    # training steps on a CPU): starts the script again, once.
    keras_jumbo.runtime.restart_with_huge_pages()
    main()
