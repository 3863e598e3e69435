"""Token labelling with patch-wise CutMix / Mixup switching (ViT-ResNAS
§2.4)."""

import keras
import numpy as np
from keras import ops

from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.nas.search_space import as_rng


class TokenLabelingMix:
    """Mix a batch and produce image and per-patch soft labels.

    With probability `switch_prob` a batch gets patch-wise CutMix: a box of
    whole patches on the `grid x grid` patch grid (the last stage's, 4x4
    for ViT-Res at 224 px) is pasted from a shuffled partner image, the
    patch labels inside the box become the partner's, and the image label
    is `lam * y1 + (1 - lam) * y2` with `lam` the kept fraction of
    patches. Otherwise Mixup: `lam ~ Beta(alpha, alpha)` blends the images
    and labels, and every patch gets the mixed image label. Labels are
    one-hot with optional label smoothing.

    The paper chooses one of the two per image pair; the reference code
    applies CutMix to one half of the batch and Mixup to the other. This
    class switches per batch with `switch_prob` (0.5), the paper's
    description; both give half the examples each on average.

    Args:
        num_classes: int.
        grid: int, patches per side of the token-label grid.
        switch_prob: float, probability of patch-wise CutMix.
        mixup_alpha: float, Beta parameter of Mixup (0.8, as DeiT).
        label_smoothing: float.
        seed: int or numpy Generator.

    Call arguments:
        images: `(batch, H, W, C)` (H, W divisible by `grid`), channels
            last.
        labels: int class indices `(batch,)`.

    Returns:
        `(images, {"logits": (batch, classes), "patch_logits": (batch,
        grid * grid, classes)})`, the targets of a `token_labeling=True`
        model; train it with `token_labeling_losses()`.
    """

    def __init__(
        self,
        num_classes,
        grid=4,
        switch_prob=0.5,
        mixup_alpha=0.8,
        label_smoothing=0.0,
        seed=0,
    ):
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.grid = check_positive_int("grid", grid)
        if not 0.0 <= switch_prob <= 1.0:
            raise ValueError(
                f"`switch_prob` must be in [0, 1]. Received: {switch_prob}"
            )
        if mixup_alpha <= 0:
            raise ValueError(
                f"`mixup_alpha` must be > 0. Received: {mixup_alpha}"
            )
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                "`label_smoothing` must be in [0, 1). Received: "
                f"{label_smoothing}"
            )
        self.switch_prob = switch_prob
        self.mixup_alpha = mixup_alpha
        self.label_smoothing = label_smoothing
        self.rng = as_rng(seed)

    def _one_hot(self, labels):
        smooth = self.label_smoothing
        y = ops.one_hot(ops.cast(labels, "int32"), self.num_classes)
        return y * (1.0 - smooth) + smooth / self.num_classes

    def random_box(self):
        """`(top, left, height, width)` in patches; at least one patch."""
        k = self.grid
        area = max(1, int(round(self.rng.uniform() * k * k)))
        height = int(self.rng.integers(1, min(k, area) + 1))
        width = min(k, max(1, area // height))
        top = int(self.rng.integers(0, k - height + 1))
        left = int(self.rng.integers(0, k - width + 1))
        return top, left, height, width

    def __call__(self, images, labels):
        images = ops.convert_to_tensor(images, "float32")
        batch, height, width = images.shape[0], images.shape[1], images.shape[2]
        k = self.grid
        if height % k or width % k:
            raise ValueError(
                f"Image size must be divisible by grid={k}. Received: "
                f"{height}x{width}"
            )
        partner = ops.convert_to_tensor(self.rng.permutation(batch))
        y = self._one_hot(labels)
        y2 = ops.take(y, partner, axis=0)
        other = ops.take(images, partner, axis=0)
        if self.rng.uniform() < self.switch_prob:
            top, left, box_h, box_w = self.random_box()
            grid_mask = np.zeros((k, k), "float32")
            grid_mask[top : top + box_h, left : left + box_w] = 1.0
            lam = 1.0 - grid_mask.mean()
            pixel_mask = np.kron(
                grid_mask, np.ones((height // k, width // k), "float32")
            )[None, :, :, None]
            mixed = images * (1.0 - pixel_mask) + other * pixel_mask
            patch_mask = ops.convert_to_tensor(grid_mask.reshape(1, k * k, 1))
            patch_labels = (
                y[:, None] * (1.0 - patch_mask) + y2[:, None] * patch_mask
            )
        else:
            lam = float(self.rng.beta(self.mixup_alpha, self.mixup_alpha))
            mixed = images * lam + other * (1.0 - lam)
            patch_labels = None
        image_labels = y * lam + y2 * (1.0 - lam)
        if patch_labels is None:
            patch_labels = ops.repeat(image_labels[:, None], k * k, axis=1)
        return mixed, {"logits": image_labels, "patch_logits": patch_labels}


def token_labeling_losses():
    """Losses for a `token_labeling=True` model: soft-label cross-entropy on
    the image logits plus soft-label cross-entropy averaged over the patch
    logits, added without scaling (§3.1)."""
    return {
        "logits": keras.losses.CategoricalCrossentropy(from_logits=True),
        "patch_logits": keras.losses.CategoricalCrossentropy(from_logits=True),
    }
