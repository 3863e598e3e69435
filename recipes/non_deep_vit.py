"""Non-Deep ViT: pre-train parallel branches, join them progressively, collapse
them into a plain shallow ViT, fine-tune it (Non-Deep ViT §3.4, §4,
Appendix A).

Stages (`--stage`), as the paper runs them:

1. `pretrain` — the branchy model at λ=0 (independent branches) with DeiT's
   supervised settings (Table 7): AdamW, lr 1e-3 at batch 1024, weight
   decay 0.05, 5 warm-up epochs, cosine decay, 300 epochs, RandAugment +
   MixUp 0.8 / CutMix 1.0. With `--attention-teacher` (a `.keras` model or
   a registry name with `forward_with_attention_maps`, e.g. a trained
   keras_jumbo ViT with the student's head count), the loss adds
   attention-map distillation: the teacher's attention maps vs the
   branch-averaged maps (`keras_jumbo.losses.AttentionMapDistiller`,
   `--attention-weight`, last block to last block by default).
2. `join` — from the pre-trained branchy model (`--init`; or from scratch)
   right after pre-training (Table 4, strategy A), same settings: λ grows
   linearly 0 -> 1 over a 10k-step warm-up
   (`keras_jumbo.callbacks.JoinSchedule`), then a 50k-step adjustment at
   λ=1: 60k steps, 48 epochs of ImageNet-1K at batch 1024 (A.2). The model
   is then reparameterised (`keras_jumbo.convert.reparameterize`) into a
   plain `depth`-layer ViT, checked equal, and saved as `plain.keras`.
3. `finetune` — the plain model (`--init plain.keras`, required) with
   Table 9: AdamW, lr 1e-3 at batch 1024, weight decay 0.05, 5 warm-up
   epochs, cosine decay, 300 epochs, RandAugment, MixUp 0.2, CutMix 0, no
   drop path. The paper fine-tunes its self-supervised models so; its
   supervised ones are evaluated right after joining.

Deviations from the paper (also in the CHANGELOG):
- No MAE pre-training: the library has no masked-image-modelling
  objective, so the `pretrain` stage is DeiT's supervised one; the
  attention-map distillation the paper adds to MAE can be added to it.
- The distillation loss sums the squared map differences over the key
  axis (the element mean times the token count; the paper: "mean squared
  error"), so it does not vanish next to the cross-entropy; its weight and
  the block pairing are not in the paper (defaults: 1.0, last blocks).
- Fine-tuning has no layer-wise learning-rate decay (Table 9: 0.85) and no
  colour jitter: Keras optimisers take one learning rate for all weights.

Expected (paper, ImageNet-1K top-1, 8 H200 GPUs): supervised pretrain ->
join -> reparameterise: DeiT-6-R 70.2%, DeiT-4-R 64.1%, DeiT-3-R 58.5%
(12-layer DeiT-Tiny 72.2%). The D-MAE-6-R 72.4% of Table 1 needs the MAE
pre-training this recipe does not run.

Commands:
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --stage pretrain \\
        --variant 6x2 --data-dir /data/imagenet --output-dir runs/nd_pre
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --stage join \\
        --init runs/nd_pre/model.keras --data-dir /data/imagenet \\
        --output-dir runs/nd_join
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --stage finetune \\
        --init runs/nd_join/plain.keras --data-dir /data/imagenet \\
        --output-dir runs/nd_ft
    # smoke (real Fashion-MNIST, 3 blocks x 2 branches, width 64; a minute
    # or two per stage on 2 CPU cores; pretrain distils from a small ViT
    # trained first when no --attention-teacher is given)
    KERAS_BACKEND=jax python -m recipes.non_deep_vit --stage pretrain \\
        --smoke --output-dir /tmp/nd_pre
"""

import argparse
import os

from keras_jumbo import callbacks
from keras_jumbo import convert
from keras_jumbo import losses
from keras_jumbo import models
from keras_jumbo import optimizers
from recipes import common

VARIANTS = {"6x2": (6, 2), "4x3": (4, 3), "3x4": (3, 4)}
STAGES = ("pretrain", "join", "finetune")
WARMUP_STEPS = 10_000  # λ warm-up (A.2)
ADJUSTMENT_STEPS = 50_000  # at λ=1 after it
# The smoke models: 28 px Fashion-MNIST, patch 7 (16 tokens), width 64.
SMOKE_MODEL = dict(patch_size=7, hidden_dim=64, num_heads=4)
SMOKE = dict(
    image_size=28,
    batch_size=64,
    learning_rate=2e-3,
    augmentation="none",
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    warmup_fraction=0.1,
)


def _branchy(variant):
    depth, branches = VARIANTS[variant]

    def build(num_classes, image_size, smoke):
        if smoke:
            return models.NonDeepViT(
                3,
                2,
                num_classes=num_classes,
                image_size=image_size,
                **SMOKE_MODEL,
            )
        return models.NonDeepViT(
            depth, branches, num_classes=num_classes, image_size=image_size
        )

    return build


def smoke_attention_teacher(train, image_size, epochs=2):
    """A small keras_jumbo ViT (the smoke student's heads and patch grid,
    with a class token) trained briefly on the smoke images."""
    teacher = models.ViT(
        "pico",
        depth=2,
        num_classes=train.num_classes,
        image_size=image_size,
        **SMOKE_MODEL,
    )
    return common.fit_smoke_teacher(
        teacher,
        train,
        epochs,
        optimizers.AdamW(2e-3),
        label="attention teacher",
    )


def pretrain(variant="6x2", teacher=None, weight=1.0):
    """Stage 1: the branchy model at λ=0, optionally distilling attention."""

    def wrap(model, args, train):
        if teacher is None and not args.smoke:
            return model
        if teacher is not None:
            source = common.load_teacher(
                teacher, model.num_classes, model.image_size[0]
            )
        else:
            source = smoke_attention_teacher(train, model.image_size[0])
        return losses.AttentionMapDistiller(model, source, weight=weight)

    return common.ImageRecipe(
        name=f"non_deep_vit_{variant}_pretrain",
        build_model=_branchy(variant),
        epochs=300,
        warmup_fraction=5 / 300,
        **common.DEIT,
        wrap_model=wrap,
        smoke=dict(SMOKE, epochs=1),
    )


def join_warmup_steps(total_steps):
    """The paper's 10k-step λ warm-up when the run holds it and the 50k-step
    adjustment; shorter runs warm up over 60% of their steps."""
    if total_steps >= WARMUP_STEPS + ADJUSTMENT_STEPS:
        return WARMUP_STEPS
    return max(1, int(0.6 * total_steps))


def join(variant="6x2"):
    """Stage 2: progressive joining, then the plain model."""
    depth, _ = VARIANTS[variant]

    def schedule(model, train, total_steps):
        return [
            callbacks.JoinSchedule("linear", join_warmup_steps(total_steps))
        ]

    def finish(model, args, evaluate):
        plain = convert.reparameterize(model)
        plain.save(os.path.join(args.output_dir, "plain.keras"))
        return {
            "plain_layers": len(model.blocks),
            "plain_val_accuracy": evaluate(plain),
        }

    return common.ImageRecipe(
        name=f"non_deep_vit_{variant}",
        build_model=_branchy(variant),
        epochs=48,
        warmup_fraction=5 / 300,
        **common.DEIT,
        callbacks=schedule,
        finish=finish,
        smoke=dict(SMOKE, epochs=2),
    )


def finetune(variant="6x2"):
    """Stage 3: fine-tune the reparameterised plain ViT (Table 9)."""

    def refuse(num_classes, image_size, smoke):
        raise ValueError(
            "The finetune stage fine-tunes a reparameterised model: pass "
            "--init plain.keras (from --stage join). Received: init=None"
        )

    return common.ImageRecipe(
        name=f"non_deep_vit_{variant}_finetune",
        build_model=refuse,
        image_size=224,
        epochs=300,
        batch_size=1024,
        learning_rate=1e-3,
        weight_decay=0.05,
        end_learning_rate=1e-6,
        warmup_fraction=5 / 300,
        clipnorm=None,
        augmentation="rand_augment",
        mixup_alpha=0.2,
        cutmix_alpha=0.0,
        needs_init=True,
        smoke=dict(SMOKE, epochs=1, learning_rate=5e-4),
    )


def recipe(variant="6x2", stage="join", teacher=None, weight=1.0):
    if stage == "pretrain":
        return pretrain(variant, teacher, weight)
    if teacher is not None:
        raise ValueError(
            "--attention-teacher belongs to --stage pretrain (the paper "
            f"distils while pre-training). Received: stage={stage!r}"
        )
    return join(variant) if stage == "join" else finetune(variant)


def main(argv=None):
    stage_parser = argparse.ArgumentParser(add_help=False)
    stage_parser.add_argument(
        "--variant", choices=tuple(VARIANTS), default="6x2"
    )
    stage_parser.add_argument("--stage", choices=STAGES, default="join")
    stage_parser.add_argument("--attention-teacher")
    stage_parser.add_argument("--attention-weight", type=float, default=1.0)
    known, rest = stage_parser.parse_known_args(argv)
    chosen = recipe(
        known.variant,
        known.stage,
        known.attention_teacher,
        known.attention_weight,
    )
    return common.run(chosen, rest, description=__doc__)


if __name__ == "__main__":
    common.restart_with_huge_pages()
    main()
