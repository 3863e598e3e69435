"""Non-Deep ViT: train parallel branches with progressive joining, then
collapse them into a plain shallow ViT (Non-Deep ViT §3.4, Appendix A.2).

DeiT's supervised settings (Appendix Table 7): AdamW, learning rate 1e-3
at batch 1024, weight decay 0.05, cosine decay, RandAugment + MixUp 0.8 /
CutMix 1.0. Joining: λ grows linearly from 0 to 1 over a 10k-step warm-up
(`keras_jumbo.callbacks.JoinSchedule`), then a 50k-step adjustment phase
at λ=1 — 60k steps, 48 epochs of ImageNet-1K at batch 1024. The paper
joins right after pre-training (its Table 4, strategy A): pass the
pre-trained branchy model with `--init`, or train from scratch. At the
end the model is reparameterised (`keras_jumbo.convert.reparameterize`)
into a plain `depth`-layer ViT, its accuracy checked equal, and saved as
`plain.keras` (export it with `keras-jumbo export`).

Expected (paper Table 1, ImageNet-1K top-1, 8 H200 GPUs, distilled from
MAE-Base): D-MAE-6-R 72.4% (6 layers, vs 72.2% for 12-layer DeiT-Tiny),
D-MAE-4-R 67.0%, D-MAE-3-R 60.5%.

Commands:
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --variant 6x2 \\
        --data-dir /data/imagenet --output-dir runs/non_deep_6x2
    # smoke (real Fashion-MNIST, 3 blocks x 2 branches, width 64; about
    # 2 minutes on 2 CPU cores)
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --smoke
"""

import argparse
import os

from keras_jumbo import callbacks
from keras_jumbo import convert
from keras_jumbo import models
from recipes import common

VARIANTS = {"6x2": (6, 2), "4x3": (4, 3), "3x4": (3, 4)}
WARMUP_STEPS = 10_000


def recipe(variant="6x2"):
    depth, branches = VARIANTS[variant]

    def build(num_classes, image_size, smoke):
        if smoke:
            return models.NonDeepViT(
                3,
                2,
                num_classes=num_classes,
                image_size=image_size,
                patch_size=7,
                hidden_dim=64,
                num_heads=4,
            )
        return models.NonDeepViT(
            depth, branches, num_classes=num_classes, image_size=image_size
        )

    def join(model, train, total_steps):
        warmup = (
            WARMUP_STEPS
            if total_steps > 2 * WARMUP_STEPS
            else int(0.6 * total_steps)
        )
        return [callbacks.JoinSchedule("linear", warmup)]

    def finish(model, args, evaluate):
        plain = convert.reparameterize(model)
        plain.save(os.path.join(args.output_dir, "plain.keras"))
        return {
            "plain_layers": depth if not args.smoke else 3,
            "plain_val_accuracy": evaluate(plain),
        }

    return common.ImageRecipe(
        name=f"non_deep_vit_{variant}",
        build_model=build,
        epochs=48,
        warmup_fraction=5 / 300,
        **common.DEIT,
        callbacks=join,
        finish=finish,
        smoke=dict(
            image_size=28,
            epochs=2,
            batch_size=64,
            learning_rate=2e-3,
            augmentation="none",
            mixup_alpha=0.0,
            cutmix_alpha=0.0,
            warmup_fraction=0.1,
        ),
    )


def main(argv=None):
    variant_parser = argparse.ArgumentParser(add_help=False)
    variant_parser.add_argument(
        "--variant", choices=tuple(VARIANTS), default="6x2"
    )
    known, rest = variant_parser.parse_known_args(argv)
    return common.run(recipe(known.variant), rest, description=__doc__)


if __name__ == "__main__":
    main()
