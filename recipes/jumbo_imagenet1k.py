"""Jumbo ImageNet-1K: 400 epochs at 128 px with function matching, then a
20-epoch fine-tune at 224 px (Jumbo paper §4.1, Appendix A.2.1).

Pre-training (`--stage pretrain`, default): 128x128 px, batch 1024,
AdamW (weight decay 0.05), global clip norm 1.0, linear warm-up over 10%
of the steps to 1e-3 (3e-3 is the other value the paper sweeps), cosine
decay to 1e-5, MixUp 0.8 / CutMix 1.0, 3-Augment, and function-matching
distillation: KL between the student's and the teacher's logits, the
teacher seeing the same augmented image at 224 px
(`keras_jumbo.losses.Distiller`). The paper's teacher is timm's
`deit3_base_patch16_224.fb_in22k_ft_in1k` (85.7%); any Keras model works
(`--teacher teacher.keras`).

Fine-tuning (`--stage finetune --init pretrain/model.keras`): 224 px,
20 epochs, batch 512, weight decay 0.1, warm-up over 25% to 5e-5, cosine
to 1e-5, MixUp 0.8 / CutMix 1.0, RandAugment (timm rand-m9-mstd0.5-inc1,
per image: `keras_jumbo.data.RandAugment`, or `HostRandAugment` with
Pillow without an accelerator), teacher
`deit3_large_patch16_224.fb_in22k_ft_in1k` (87.0%) at 224 px. The 128 px
model's position embeddings are resampled to the 224 px grid
(`keras_jumbo.models.with_image_size`).

Expected (paper, ImageNet-Val top-1, best learning rate; one RTX 4090,
4-5 days per model): at 128 px (Table 6) Jumbo pico 64.0%, nano 68.8%,
tiny 73.0%, small 78.5%; after the 224 px fine-tune (Table 10) 70.5%,
74.5%, 77.7%, 81.8%.

Commands:
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k --size nano \\
        --data-dir /data/imagenet --teacher deit3_base_224.keras \\
        --output-dir runs/jumbo_nano_128
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k --stage finetune \\
        --init runs/jumbo_nano_128/model.keras \\
        --teacher deit3_large_224.keras --data-dir /data/imagenet \\
        --output-dir runs/jumbo_nano_224
    # smoke (real Fashion-MNIST, a 2-layer pico Jumbo, a small MLP teacher
    # trained for six epochs at 56 px; about 1 minute on 2 CPU cores)
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k --smoke
"""

import argparse

from keras_jumbo import models
from recipes import common

SMOKE_MODEL = dict(patch_size=7, depth=2, jumbo_mlp_ratio=1)


def jumbo_model(size, drop_path_rate=0.0):
    def build(num_classes, image_size, smoke):
        if smoke:
            return models.JumboViT(
                "pico",
                num_classes=num_classes,
                image_size=image_size,
                **SMOKE_MODEL,
            )
        return models.JumboViT(
            size,
            num_classes=num_classes,
            image_size=image_size,
            drop_path_rate=drop_path_rate,
        )

    return build


def pretrain(size="nano"):
    return common.ImageRecipe(
        name=f"jumbo_{size}_in1k_128",
        build_model=jumbo_model(size),
        image_size=128,
        epochs=400,
        batch_size=1024,
        learning_rate=1e-3,
        weight_decay=0.05,
        end_learning_rate=1e-5,
        warmup_fraction=0.1,
        clipnorm=1.0,
        augmentation="three_augment",
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        teacher_image_size=224,
        smoke=dict(
            image_size=28,
            teacher_image_size=56,
            epochs=2,
            batch_size=64,
            learning_rate=2e-3,
        ),
    )


def finetune(size="nano"):
    return common.ImageRecipe(
        name=f"jumbo_{size}_in1k_224",
        build_model=jumbo_model(size),
        image_size=224,
        epochs=20,
        batch_size=512,
        learning_rate=5e-5,
        weight_decay=0.1,
        end_learning_rate=1e-5,
        warmup_fraction=0.25,
        clipnorm=1.0,
        augmentation="rand_augment",
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
        teacher_image_size=224,
        needs_init=True,
        smoke=dict(
            image_size=42,
            teacher_image_size=56,
            epochs=1,
            batch_size=64,
            learning_rate=5e-4,
            end_learning_rate=1e-6,
        ),
    )


def main(argv=None):
    stage_parser = argparse.ArgumentParser(add_help=False)
    stage_parser.add_argument(
        "--stage", choices=("pretrain", "finetune"), default="pretrain"
    )
    stage_parser.add_argument(
        "--size", choices=tuple(models.VIT_SIZES), default="nano"
    )
    known, rest = stage_parser.parse_known_args(argv)
    build = pretrain if known.stage == "pretrain" else finetune
    return common.run(build(known.size), rest, description=__doc__)


if __name__ == "__main__":
    common.restart_with_huge_pages()
    main()
