"""timm's RandAugment (`rand-m9-mstd0.5-inc1`), one draw per image, batched.

timm draws, for every image, `num_ops` operations (with replacement) from
fifteen, applies each with probability 0.5 at a magnitude drawn from
N(m, mstd) clipped to [0, 10], with a random sign where the operation has
one, on the uint8 PIL image. `RandAugment` does the same for a whole batch
at once in `keras.ops`: per slot, one affine resampling (identity for the
images whose operation is not geometric), one 256-entry lookup table per
image and channel (the pointwise operations, equalize and autocontrast
included, as PIL computes them), and the two blends that are not pointwise
(colour, sharpness). `apply_rand_augment_op` is one slot with the choices
given, the function the tests compare with PIL operation by operation.
"""

import math

import keras
import numpy as np
from keras import ops

from keras_jumbo.layers._utils import check_number_in
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_value_range

RAND_AUGMENT_OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ColorIncreasing",
    "ContrastIncreasing",
    "BrightnessIncreasing",
    "SharpnessIncreasing",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
_OP = {name: index for index, name in enumerate(RAND_AUGMENT_OPS)}
_LOOKUP = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "PosterizeIncreasing",
    "SolarizeIncreasing",
    "SolarizeAdd",
    "ContrastIncreasing",
    "BrightnessIncreasing",
)
# timm's ranges at level 1 (magnitude 10).
_ROTATE_DEGREES = 30.0
_SHEAR = 0.3
_TRANSLATE = 0.45
_ENHANCE = 0.9


def _any_of(op, names):
    """`(batch,)` bool: whether each image's operation is in `names`."""
    hit = ops.zeros_like(op, dtype="bool")
    for name in names:
        hit = ops.logical_or(hit, ops.equal(op, _OP[name]))
    return hit


def _luma(images):
    """PIL's RGB -> L: (299 R + 587 G + 114 B) / 1000 in 16-bit fixed
    point, rounded. Exact in float32 for 0..255 inputs (every partial sum
    is an integer below 2**24); one matmul: the mean luma of 32 images at
    224 px took 3 ms so on JAX, 68 ms from the three channel slices."""
    weights = ops.convert_to_tensor([19595.0, 38470.0, 7471.0], images.dtype)
    return ops.floor((ops.matmul(images, weights) + 32768.0) / 65536.0)


def _blend(degenerate, images, factor):
    """PIL's `Image.blend(degenerate, image, factor)` on uint8: clipped to
    [0, 255], then truncated."""
    factor = ops.reshape(factor, (-1,) + (1,) * (len(images.shape) - 1))
    out = degenerate + factor * (images - degenerate)
    return ops.floor(ops.clip(out, 0.0, 255.0))


def _smooth(images):
    """PIL's `ImageFilter.SMOOTH` (3x3, centre 5, others 1, / 13), rounded;
    the one-pixel border is copied, as PIL does."""
    height, width = images.shape[1], images.shape[2]
    total = 4.0 * images[:, 1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            total = total + images[:, dy : dy + height - 2, dx : dx + width - 2]
    inner = ops.pad(
        ops.floor(total / 13.0 + 0.5), ((0, 0), (1, 1), (1, 1), (0, 0))
    )
    border = np.ones((1, height, width, 1), bool)
    border[:, 1:-1, 1:-1] = False
    return ops.where(border, images, inner)


def _histogram(values, bins):
    """Counts of the integers `values` (batch, n, channels) in `bins`
    bins, per image and channel: `(batch, channels, bins)`."""
    batch, channels = ops.shape(values)[0], values.shape[-1]
    index = (
        ops.arange(batch, dtype="int32")[:, None, None] * (channels * bins)
        + ops.arange(channels, dtype="int32")[None, None, :] * bins
        + values
    )
    index = ops.reshape(index, (-1,))
    size = batch * channels * bins
    if keras.backend.backend() == "jax":
        # jnp.bincount needs a static length Keras does not pass.
        counts = ops.segment_sum(
            ops.ones_like(index, dtype="float32"), index, num_segments=size
        )
    else:
        # bincount: 15x faster than segment_sum on PyTorch, 2x on TF.
        counts = ops.cast(ops.bincount(index, minlength=size), "float32")
    return ops.reshape(counts, (batch, channels, bins))


def _lookup_tables(images, op, level):
    """`(batch, channels, 256)` tables: each image's pointwise operation
    as PIL computes it (identity for the other operations)."""
    batch, channels = ops.shape(images)[0], images.shape[-1]
    v = ops.arange(256, dtype="float32")[None, None, :]
    magnitude = ops.abs(level)[:, None, None]
    flat = ops.reshape(images, (batch, -1, channels))
    counts = _histogram(ops.cast(flat, "int32"), 256)
    low = ops.min(flat, axis=1)[:, :, None]
    high = ops.max(flat, axis=1)[:, :, None]
    # ImageOps.autocontrast(cutoff=0): lut = int(v * scale - low * scale).
    scale = 255.0 / ops.maximum(high - low, 1.0)
    autocontrast = ops.where(
        high > low, ops.clip(ops.floor((v - low) * scale), 0.0, 255.0), v
    )
    # ImageOps.equalize: step = (pixels - count of the top value) // 255,
    # lut = (step // 2 + pixels below v) // step.
    top = ops.take_along_axis(counts, ops.cast(high, "int32"), axis=2)
    step = ops.floor((ops.sum(counts, axis=2, keepdims=True) - top) / 255.0)
    below = ops.cumsum(counts, axis=2) - counts
    # (PIL's `point` clips the table to 255.)
    equalize = ops.floor(
        (ops.floor(step / 2.0) + below) / ops.maximum(step, 1.0)
    )
    equalize = ops.where(step > 0, ops.minimum(equalize, 255.0), v)
    # Posterize keeps 4 - int(4 m) bits; SolarizeIncreasing inverts from
    # 256 - int(256 m); SolarizeAdd adds int(110 m) below 128.
    quantum = ops.power(2.0, 4.0 + ops.floor(4.0 * magnitude))
    posterize = ops.floor(v / quantum) * quantum
    threshold = 256.0 - ops.minimum(256.0, ops.floor(256.0 * magnitude))
    solarize = ops.where(v < threshold, v, 255.0 - v)
    add = ops.minimum(128.0, ops.floor(110.0 * magnitude))
    solarize_add = ops.where(v < 128.0, ops.minimum(255.0, v + add), v)
    # ImageEnhance.Contrast blends with the rounded mean luma,
    # ImageEnhance.Brightness with black.
    factor = _enhance_factor(level)
    mean = ops.floor(ops.mean(_luma(images), axis=(1, 2)) + 0.5)
    contrast = _blend(mean[:, None, None], v, factor)
    brightness = _blend(0.0, v, factor)
    table = ops.broadcast_to(v, (batch, channels, 256))
    for name, value in (
        ("AutoContrast", autocontrast),
        ("Equalize", equalize),
        ("Invert", 255.0 - v),
        ("PosterizeIncreasing", posterize),
        ("SolarizeIncreasing", solarize),
        ("SolarizeAdd", solarize_add),
        ("ContrastIncreasing", contrast),
        ("BrightnessIncreasing", brightness),
    ):
        table = ops.where(
            ops.reshape(ops.equal(op, _OP[name]), (-1, 1, 1)), value, table
        )
    return table


def _enhance_factor(level):
    """timm's increasing enhance argument: max(0.1, 1 + 0.9 * level)."""
    return ops.maximum(0.1, 1.0 + _ENHANCE * level)


def _affine(images, op, level, fill):
    """Each image resampled as PIL's `Image.transform(AFFINE)` /
    `rotate` would (bilinear, edges clamped inside the image, `fill`
    outside); the identity for the non-geometric operations."""
    height, width = images.shape[1], images.shape[2]
    zero, one = ops.zeros_like(level), ops.ones_like(level)
    radians = -level * (_ROTATE_DEGREES * math.pi / 180.0)
    cos, sin = ops.cos(radians), ops.sin(radians)
    cx, cy = width / 2.0, height / 2.0
    shear, shift = _SHEAR * level, _TRANSLATE * level
    # Rows (a, b, c, d, e, f): source = (a x + b y + c, d x + e y + f) in
    # PIL's pixel-centre coordinates (pixel i covers [i, i + 1)).
    candidates = {
        "Rotate": (
            cos,
            sin,
            cx - cos * cx - sin * cy,
            -sin,
            cos,
            cy + sin * cx - cos * cy,
        ),
        "ShearX": (one, shear, zero, zero, one, zero),
        "ShearY": (one, zero, zero, shear, one, zero),
        "TranslateXRel": (one, zero, shift * width, zero, one, zero),
        "TranslateYRel": (one, zero, zero, zero, one, shift * height),
    }
    matrix = ops.stack([one, zero, zero, zero, one, zero], axis=1)
    for name, row in candidates.items():
        matrix = ops.where(
            ops.equal(op, _OP[name])[:, None], ops.stack(row, axis=1), matrix
        )
    a, b, c = matrix[:, 0:1], matrix[:, 1:2], matrix[:, 2:3]
    d, e, f = matrix[:, 3:4], matrix[:, 4:5], matrix[:, 5:6]
    xs = ops.arange(width, dtype="float32")[None, None, :] + 0.5
    ys = ops.arange(height, dtype="float32")[None, :, None] + 0.5

    def at(p, q, r):
        return p[:, :, None] * xs + q[:, :, None] * ys + r[:, :, None]

    source_x, source_y = at(a, b, c), at(d, e, f)
    warped = _bilinear(images, source_x - 0.5, source_y - 0.5)
    # PIL fills a pixel whose source point lies outside the image.
    inside = (
        (source_x >= 0.0)
        & (source_x < width)
        & (source_y >= 0.0)
        & (source_y < height)
    )
    fill = ops.convert_to_tensor(fill, "float32")
    warped = ops.where(inside[..., None], ops.floor(warped), fill)
    # The identity matrix samples each pixel exactly, but without this
    # select XLA fused the resampling into the consumers downstream: a
    # slot took 267 ms instead of 109 (JAX, 224 px, batch 32).
    geometric = _any_of(op, candidates)
    return ops.where(geometric[:, None, None, None], warped, images)


def _bilinear(images, x, y):
    """`images` sampled at pixel-index points `(x, y)` (each
    `(batch, height, width)`), bilinearly, neighbours clamped to the image
    (PIL's bilinear filter): four row gathers from the flattened batch."""
    batch, (height, width, channels) = ops.shape(images)[0], images.shape[1:]
    flat = ops.reshape(images, (-1, channels))
    x0, y0 = ops.floor(x), ops.floor(y)
    wx, wy = (x - x0)[..., None], (y - y0)[..., None]
    base = ops.arange(batch, dtype="int32")[:, None, None] * (height * width)

    def clamp(v, size):
        return ops.cast(ops.clip(v, 0.0, size - 1.0), "int32")

    left, right = clamp(x0, width), clamp(x0 + 1.0, width)
    top, bottom = clamp(y0, height) * width, clamp(y0 + 1.0, height) * width

    def row_lerp(row):
        start = ops.take(flat, base + row + left, axis=0)
        end = ops.take(flat, base + row + right, axis=0)
        return start + wx * (end - start)

    upper, lower = row_lerp(top), row_lerp(bottom)
    return upper + wy * (lower - upper)


def apply_rand_augment_op(images, op, level, fill=(128, 128, 128)):
    """One RandAugment slot: image i gets operation `op[i]` at `level[i]`.

    Args:
        images: float `(batch, height, width, 3)` holding integers in
            [0, 255] (a uint8 image, as timm's PIL pipeline has).
        op: int `(batch,)`, an index into `RAND_AUGMENT_OPS`, or -1 for
            no operation.
        level: float `(batch,)` in [-1, 1]: magnitude / 10, negative for
            the negated argument (rotation, shear, translation direction,
            enhance below 1); the unsigned operations use its size.
        fill: per-channel value of the pixels a geometric operation
            brings in from outside the image (timm: `img_mean`).

    Returns:
        The images, integer-valued float32, as PIL computes each operation
        on uint8: timm's `AugmentOp` functions with the argument its
        `rand-...-inc1` level functions give.
    """
    images = ops.convert_to_tensor(images, "float32")
    op = ops.cast(op, "int32")
    level = ops.cast(level, "float32")
    images = _affine(images, op, level, fill)
    batch, channels = ops.shape(images)[0], images.shape[-1]
    table = ops.reshape(_lookup_tables(images, op, level), (-1,))
    index = (
        ops.arange(batch, dtype="int32")[:, None, None, None] * (channels * 256)
        + ops.arange(channels, dtype="int32") * 256
        + ops.cast(images, "int32")
    )
    # The other images' tables are the identity; they keep their pixels.
    images = ops.where(
        _any_of(op, _LOOKUP)[:, None, None, None],
        ops.take(table, index),
        images,
    )
    factor = _enhance_factor(level)
    gray = _luma(images)[..., None]
    color = _blend(gray, images, factor)
    sharpness = _blend(_smooth(images), images, factor)
    select = ops.reshape(op, (-1, 1, 1, 1))
    images = ops.where(ops.equal(select, _OP["ColorIncreasing"]), color, images)
    return ops.where(
        ops.equal(select, _OP["SharpnessIncreasing"]), sharpness, images
    )


def check_rand_augment_args(
    num_ops, magnitude, magnitude_std, prob, fill, value_range
):
    """RandAugment's arguments checked and normalised (`fill` to three
    floats, `value_range` to a float pair), as a dict by name; a
    `ValueError` naming the argument otherwise."""
    checked = {
        "num_ops": check_positive_int("num_ops", num_ops),
        "magnitude": check_number_in("magnitude", magnitude, 0.0, 10.0),
        "magnitude_std": check_number_in(
            "magnitude_std", magnitude_std, 0.0, float("inf")
        ),
        "prob": check_number_in("prob", prob, 0.0, 1.0),
    }
    channels = fill if isinstance(fill, (tuple, list)) else (fill,) * 3
    if len(channels) != 3:
        raise ValueError(
            "`fill` must be a number or three numbers in [0, 255]. "
            f"Received: fill={fill!r}"
        )
    checked["fill"] = tuple(
        check_number_in("fill", value, 0.0, 255.0) for value in channels
    )
    checked["value_range"] = check_value_range(value_range)
    return checked


@keras.saving.register_keras_serializable(package="keras_jumbo")
class RandAugment(keras.layers.Layer):
    """timm's RandAugment with every choice made per image.

    timm's `rand-m{magnitude}-mstd{magnitude_std}-inc1` (DeiT, the Jumbo
    fine-tune stage and the Non-Deep ViT recipe use `rand-m9-mstd0.5-inc1`):
    for each image, `num_ops` operations drawn uniformly with replacement
    from `RAND_AUGMENT_OPS` (timm's increasing set), each applied with
    probability `prob` at a magnitude drawn from
    N(`magnitude`, `magnitude_std`) clipped to [0, 10], with a random sign
    for the signed operations; each operation as PIL computes it on uint8
    (`apply_rand_augment_op`). Keras' `RandAugment` differs: one draw of
    operations per batch, no magnitude noise, its own operation set, and
    it is slow on JAX (`benchmarks/augment_throughput.py`).

    Choices, stated: the input is rounded to integers first (timm works on
    uint8 images); geometric operations resample bilinearly (timm draws
    bilinear or bicubic unless told; DeiT asks for bicubic); at magnitude
    10, PosterizeIncreasing keeps 0 bits: a black image, what PIL's
    `posterize` computed with 0 bits (PIL 13 refuses 0 bits, so timm with
    it fails there).

    Args:
        num_ops: int > 0, operations per image (timm `n`, default 2).
        magnitude: float in [0, 10] (timm `m`, default 9).
        magnitude_std: float >= 0 (timm `mstd`, default 0.5).
        prob: float in [0, 1], each operation's probability (timm 0.5).
        fill: float in [0, 255] or three of them, the colour a geometric
            operation brings in (timm's `img_mean`; its default 128).
        value_range: `(low, high)` of the input pixels; mapped to [0, 255]
            and back.
        seed: int or None.

    Call arguments:
        images: float `(batch, height, width, 3)`, channels last.
        training: bool; the layer is the identity unless True.
    """

    def __init__(
        self,
        num_ops=2,
        magnitude=9.0,
        magnitude_std=0.5,
        prob=0.5,
        fill=128,
        value_range=(0, 255),
        seed=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        checked = check_rand_augment_args(
            num_ops, magnitude, magnitude_std, prob, fill, value_range
        )
        for name, value in checked.items():
            setattr(self, name, value)
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def build(self, input_shape):
        if len(input_shape) != 4 or input_shape[-1] != 3:
            raise ValueError(
                f"Layer '{self.name}' expects RGB images (batch, height, "
                f"width, 3). Received: input_shape={tuple(input_shape)}"
            )
        if input_shape[1] is not None and min(input_shape[1:3]) < 3:
            raise ValueError(
                f"Layer '{self.name}' needs images of at least 3x3 pixels. "
                f"Received: input_shape={tuple(input_shape)}"
            )

    def draw(self, batch):
        """The random choices for `batch` images, from the layer's seed
        generator: `(op, level)`, each `(batch, num_ops)`, as
        `apply_rand_augment_op` takes them per slot (op -1: skipped)."""
        shape = (batch, self.num_ops)
        op = keras.random.randint(
            shape, 0, len(RAND_AUGMENT_OPS), seed=self.generator
        )
        applied = keras.random.uniform(shape, seed=self.generator) < self.prob
        magnitude = self.magnitude + self.magnitude_std * keras.random.normal(
            shape, seed=self.generator
        )
        negate = keras.random.uniform(shape, seed=self.generator) < 0.5
        level = ops.clip(magnitude, 0.0, 10.0) / 10.0
        return ops.where(applied, op, -1), ops.where(negate, -level, level)

    def call(self, images, training=True):
        if not training:
            return images
        low, high = self.value_range
        x = ops.cast(images, "float32")
        x = ops.round(ops.clip((x - low) * (255.0 / (high - low)), 0.0, 255.0))
        op, level = self.draw(ops.shape(images)[0])
        for slot in range(self.num_ops):
            x = apply_rand_augment_op(x, op[:, slot], level[:, slot], self.fill)
        return ops.cast(x * ((high - low) / 255.0) + low, images.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_ops": self.num_ops,
            "magnitude": self.magnitude,
            "magnitude_std": self.magnitude_std,
            "prob": self.prob,
            "fill": self.fill,
            "value_range": self.value_range,
            "seed": self.seed,
        }
