"""Jumbo ImageNet-21K: 50 epochs at 224 px with token dropping (Jumbo
paper §4.2, Appendix A.2.1).

224x224 px, batch 1024, AdamW (weight decay 0.02), global clip norm 1.0,
linear warm-up over 10% of the steps to 3e-3, cosine decay to 1e-5,
cross-entropy, MixUp 0.8 (CutMix 0), 3-Augment, and token dropping from
90% of the patch tokens down to 10%, linearly over training
(`keras_jumbo.callbacks.TokenDropSchedule`; the model is built with
`token_drop_rate=0.9`). The paper uses ImageNet-21K-P (10,450 classes,
Ridnik et al., 2021).

Expected (paper §4.2 / Fig. 1b; one RTX 4090, 3.3 days for small, 7 for
base): Jumbo beats Registers by 3.4 points top-1 at small and 1.0 at base.

Commands:
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet21k --size small \\
        --data-dir /data/imagenet21k_p --output-dir runs/jumbo_small_21k
    # smoke (real Fashion-MNIST, a 2-layer pico Jumbo; about 1 minute)
    # with 14-px patches: 4 patch tokens, so the kept-token count takes 4
    # values and the compiled train step is traced 4 times (7-px patches:
    # 16 tokens, 13 traces)
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet21k --smoke
"""

import argparse

from keras_jumbo import callbacks
from keras_jumbo import models
from recipes import common
from recipes.jumbo_imagenet1k import SMOKE_MODEL


def recipe(size="small"):
    def build(num_classes, image_size, smoke):
        kwargs = dict(SMOKE_MODEL, patch_size=14) if smoke else {}
        return models.JumboViT(
            "pico" if smoke else size,
            num_classes=num_classes,
            image_size=image_size,
            token_drop_rate=0.9,
            **kwargs,
        )

    def schedule(model, train, total_steps):
        return [callbacks.TokenDropSchedule(0.9, 0.1, total_steps=total_steps)]

    return common.ImageRecipe(
        name=f"jumbo_{size}_in21k",
        build_model=build,
        image_size=224,
        epochs=50,
        batch_size=1024,
        learning_rate=3e-3,
        weight_decay=0.02,
        end_learning_rate=1e-5,
        warmup_fraction=0.1,
        clipnorm=1.0,
        augmentation="three_augment",
        mixup_alpha=0.8,
        cutmix_alpha=0.0,
        callbacks=schedule,
        smoke=dict(image_size=28, epochs=2, batch_size=64, learning_rate=2e-3),
    )


def main(argv=None):
    size_parser = argparse.ArgumentParser(add_help=False)
    size_parser.add_argument(
        "--size", choices=tuple(models.VIT_SIZES), default="small"
    )
    known, rest = size_parser.parse_known_args(argv)
    return common.run(recipe(known.size), rest, description=__doc__)


if __name__ == "__main__":
    common.restart_with_huge_pages()
    main()
