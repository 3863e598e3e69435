"""Augmentation on the host: per image with Pillow, as the references.

The Keras layers (`RandAugment`, the 3-Augment layers) compute every
operation family for every image of a batch in float32, one compiled
program: the form for an accelerator. On a CPU the references' form is
faster: each image gets only its own operations, on uint8, in Pillow's C
code. `HostRandAugment` (timm's RandAugment), `HostThreeAugment` (DeiT
III's 3-Augment) and `HostRandomFlip` are that form, for the input
pipeline (`ImageBatches` and `augmented_batches` call augmentations on
numpy batches, `BatchAugmentation(host_transforms=...)`);
`rand_augment()` and `three_augment()` pick them when there is no
accelerator (`implementation="auto"`). `model.fit` of a pico model at 128
px on 2 CPU cores trained 1.2-2.1x faster with them
(`benchmarks/augmented_fit.py`, CHANGELOG).

`HostRandAugment` and the `RandAugment` layer draw the same distribution
and agree operation by operation to one level on a few pixels (PIL's own
rounding; the tests compare them); they do not draw the same choices from
the same seed.
"""

import functools
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np

from keras_jumbo.data.randaugment import _ENHANCE
from keras_jumbo.data.randaugment import _ROTATE_DEGREES
from keras_jumbo.data.randaugment import _SHEAR
from keras_jumbo.data.randaugment import _TRANSLATE
from keras_jumbo.data.randaugment import RAND_AUGMENT_OPS
from keras_jumbo.data.randaugment import check_rand_augment_args
from keras_jumbo.layers._utils import check_number_in
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_value_range


@functools.cache
def _pil():
    """Pillow's modules used here, as attributes (imported once, not per
    image or operation); an `ImportError` saying how to install it
    otherwise."""
    try:
        from PIL import Image
        from PIL import ImageEnhance
        from PIL import ImageFilter
        from PIL import ImageOps
    except ImportError as error:
        raise ImportError(
            "The host augmentations (`HostRandAugment`, `HostThreeAugment`, "
            "`implementation='host'`) need Pillow: `pip install pillow` "
            "(or `pip install keras-jumbo[data]`)."
        ) from error
    return SimpleNamespace(
        Image=Image,
        ImageEnhance=ImageEnhance,
        ImageFilter=ImageFilter,
        ImageOps=ImageOps,
    )


def pil_available():
    """Whether Pillow imports (the host augmentations need it)."""
    try:
        _pil()
    except ImportError:
        return False
    return True


def pil_rand_augment_op(image, name, level, fill=(128, 128, 128)):
    """One of timm's RandAugment operations on one image, with Pillow.

    timm's `AugmentOp(name)` with its `inc1` level functions, bilinear
    resampling and `img_mean=fill`, at a given signed level (magnitude /
    10, negated where timm's draw negated it; the unsigned operations use
    its absolute value).

    Args:
        image: a `PIL.Image.Image` (RGB) or a uint8 array `(H, W, 3)`.
        name: one of `RAND_AUGMENT_OPS`.
        level: float in [-1, 1].
        fill: three ints, the colour geometric operations bring in.

    Returns:
        a `PIL.Image.Image`.
    """
    pil = _pil()
    Image, ImageEnhance, ImageOps = pil.Image, pil.ImageEnhance, pil.ImageOps
    if name not in RAND_AUGMENT_OPS:
        raise ValueError(
            f"`name` must be one of {RAND_AUGMENT_OPS}. Received: name={name!r}"
        )
    img = image if isinstance(image, Image.Image) else Image.fromarray(image)
    size = abs(float(level))
    fill = tuple(int(round(v)) for v in fill)
    geometric = dict(resample=Image.BILINEAR, fillcolor=fill)
    width, height = img.size
    if name == "AutoContrast":
        return ImageOps.autocontrast(img)
    if name == "Equalize":
        return ImageOps.equalize(img)
    if name == "Invert":
        return ImageOps.invert(img)
    if name == "Rotate":
        return img.rotate(_ROTATE_DEGREES * level, **geometric)
    if name == "PosterizeIncreasing":
        bits = 4 - int(size * 4)
        if bits == 0:
            # PIL 13 refuses 0 bits; its mask for 0 bits zeroes every value.
            return Image.new("RGB", img.size)
        return ImageOps.posterize(img, bits)
    if name == "SolarizeIncreasing":
        return ImageOps.solarize(img, 256 - min(256, int(size * 256)))
    if name == "SolarizeAdd":
        add = min(128, int(size * 110))
        table = [min(255, i + add) if i < 128 else i for i in range(256)]
        return img.point(table * 3)
    if name.endswith("Increasing"):  # Color, Contrast, Brightness, Sharpness
        enhancer = getattr(ImageEnhance, name[: -len("Increasing")])
        return enhancer(img).enhance(max(0.1, 1.0 + _ENHANCE * level))
    matrix = {
        "ShearX": (1, _SHEAR * level, 0, 0, 1, 0),
        "ShearY": (1, 0, 0, _SHEAR * level, 1, 0),
        "TranslateXRel": (1, 0, _TRANSLATE * level * width, 0, 1, 0),
        "TranslateYRel": (1, 0, 0, 0, 1, _TRANSLATE * level * height),
    }[name]
    return img.transform(img.size, Image.AFFINE, matrix, **geometric)


def _check_images(images):
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[-1] != 3:
        raise ValueError(
            "`images` must be RGB images (batch, height, width, 3). "
            f"Received: images.shape={images.shape}"
        )
    return images


def _per_image(images, value_range, workers, one, choices):
    """`one(pixels, index, choices) -> PIL image` for each image of the
    batch, as uint8 pixels (`value_range` mapped to [0, 255], rounded),
    the results mapped back, float32; the batch split over `workers`
    threads, each converting, augmenting and writing back its images."""
    images = _check_images(images)
    low, high = value_range
    scaled = (low, high) != (0.0, 255.0)
    out = np.empty(images.shape, "float32")

    def run(indices):
        for index in indices:
            pixels = images[index]
            if scaled:
                pixels = (pixels - low) * (255.0 / (high - low))
            if pixels.dtype != np.uint8:
                pixels = np.clip(np.rint(pixels), 0, 255).astype("uint8")
            out[index] = np.asarray(one(pixels, index, choices))
            if scaled:
                out[index] = out[index] * ((high - low) / 255.0) + low

    workers = min(workers, len(images))
    if workers <= 1:
        run(range(len(images)))
        return out
    with ThreadPoolExecutor(workers) as pool:
        done = [
            pool.submit(run, chunk)
            for chunk in np.array_split(np.arange(len(images)), workers)
        ]
        for future in done:
            future.result()
    return out


class HostRandAugment:
    """timm's RandAugment per image with Pillow, on numpy batches.

    The same augmentation as the `RandAugment` layer (timm's
    `rand-m{magnitude}-mstd{magnitude_std}-inc1`, every choice per image,
    bilinear resampling), computed as timm computes it: each image as a
    uint8 PIL image, only its own operations (`pil_rand_augment_op`). For
    the input pipeline on a CPU; not a Keras layer (no graph, no
    `model.fit` inside a model). Needs Pillow.

    Args:
        num_ops, magnitude, magnitude_std, prob, fill, value_range: as
            `RandAugment`.
        workers: int > 0; threads the batch is split over (Pillow
            releases the GIL in its operations). The output does not
            depend on it: the choices are drawn for the whole batch first.
            Default 1: on 2 cores, batch 32, two threads against one
            were 0.77x as fast at 64 px, 0.91x at 128 px, 1.15x at 224
            px (Python holds the lock between PIL calls).

    Call arguments:
        images: array `(batch, height, width, 3)` in `value_range`
            (rounded to integers in [0, 255] first, as the layer does).
        rng: a `numpy.random.Generator`.

    Returns:
        float32 array of the same shape, in `value_range`.
    """

    def __init__(
        self,
        num_ops=2,
        magnitude=9.0,
        magnitude_std=0.5,
        prob=0.5,
        fill=128,
        value_range=(0, 255),
        workers=1,
    ):
        checked = check_rand_augment_args(
            num_ops, magnitude, magnitude_std, prob, fill, value_range
        )
        for name, value in checked.items():
            setattr(self, name, value)
        self.workers = check_positive_int("workers", workers)
        _pil()  # fail at construction, not at the first batch

    def draw(self, batch, rng):
        """`(op, level)`, each int / float `(batch, num_ops)`, drawn as the
        layer's `RandAugment.draw` draws them (op -1: skipped)."""
        shape = (batch, self.num_ops)
        op = rng.integers(0, len(RAND_AUGMENT_OPS), shape)
        applied = rng.random(shape) < self.prob
        magnitude = self.magnitude + self.magnitude_std * rng.standard_normal(
            shape
        )
        level = np.clip(magnitude, 0.0, 10.0) / 10.0
        negate = rng.random(shape) < 0.5
        return np.where(applied, op, -1), np.where(negate, -level, level)

    def apply(self, images, op, level):
        """`images` with the choices `op`, `level` (as `draw` returns
        them) applied in order, image by image."""
        return _per_image(
            images, self.value_range, self.workers, self._one, (op, level)
        )

    def _one(self, pixels, index, choices):
        op, level = choices
        img = _pil().Image.fromarray(pixels)
        for name, value in zip(op[index], level[index], strict=True):
            if name >= 0:
                img = pil_rand_augment_op(
                    img, RAND_AUGMENT_OPS[name], value, self.fill
                )
        return img

    def __call__(self, images, rng):
        images = _check_images(images)
        op, level = self.draw(len(images), rng)
        return self.apply(images, op, level)


class HostRandomFlip:
    """Flip each image of a numpy batch left-right with probability 1/2.

    Call arguments:
        images: array `(batch, height, width, channels)`.
        rng: a `numpy.random.Generator`.
    """

    def __call__(self, images, rng):
        images = np.asarray(images)
        if images.ndim != 4:
            raise ValueError(
                "`images` must have shape (batch, height, width, channels). "
                f"Received: images.shape={images.shape}"
            )
        flip = rng.random(len(images)) < 0.5
        out = images.copy()
        out[flip] = images[flip, :, ::-1]
        return out


# `HostThreeAugment.draw`'s colour jitter order and factors, by index.
_JITTER = ("Brightness", "Contrast", "Color")
_THREE_AUGMENT_CHOICES = ("grayscale", "solarize", "blur")


class HostThreeAugment:
    """DeiT III's 3-Augment per image with Pillow, as its reference code.

    Per image: reflect-pad by `padding` and crop back at a random offset,
    flip left-right with probability 1/2, then one of {grayscale,
    solarisation, Gaussian blur with radius U(0.1, 2.0)} drawn uniformly,
    then colour jitter as torchvision's `ColorJitter(color_jitter,
    color_jitter, color_jitter)` on a PIL image: brightness, contrast and
    saturation factors each U(1 - color_jitter, 1 + color_jitter), applied
    in a random order. Each step is the PIL call DeiT III's transforms make
    (`ImageOps.solarize(img)` at 128, `ImageFilter.GaussianBlur(radius)`,
    `convert("L")` to three channels, `ImageEnhance`), on the uint8 image.
    The batched `three_augment(implementation="batched")` differs in
    stated ways: one crop offset per batch, an exact Gaussian where PIL
    approximates it with box blurs, Keras' `RandomColorJitter`.

    Args:
        padding: int >= 0.
        color_jitter: float >= 0; 0 skips the jitter.
        value_range: `(low, high)` of the pixels, mapped to [0, 255] and
            back.
        workers: int > 0, threads the batch is split over (as
            `HostRandAugment`).

    Call arguments:
        images: array `(batch, height, width, 3)` in `value_range`.
        rng: a `numpy.random.Generator`.

    Returns:
        float32 array of the same shape, in `value_range`.
    """

    def __init__(
        self, padding=4, color_jitter=0.3, value_range=(0, 255), workers=1
    ):
        self.padding = check_positive_int("padding", padding, allow_zero=True)
        self.color_jitter = check_number_in(
            "color_jitter", color_jitter, 0.0, float("inf")
        )
        self.value_range = check_value_range(value_range)
        self.workers = check_positive_int("workers", workers)
        _pil()

    def draw(self, batch, rng):
        """The choices for `batch` images, a dict of arrays: `offset`
        `(batch, 2)` crop rows/columns in [0, 2 * padding], `flip`
        `(batch,)`, `choice` `(batch,)` in {0: grayscale, 1: solarize, 2:
        blur}, `radius` `(batch,)`, `factor` `(batch, 3)` (brightness,
        contrast, saturation), `order` `(batch, 3)` (a permutation of
        those three)."""
        jitter = self.color_jitter
        return {
            "offset": rng.integers(0, 2 * self.padding + 1, (batch, 2)),
            "flip": rng.random(batch) < 0.5,
            "choice": rng.integers(0, 3, batch),
            "radius": rng.uniform(0.1, 2.0, batch),
            "factor": rng.uniform(
                max(0.0, 1.0 - jitter), 1.0 + jitter, (batch, 3)
            ),
            "order": np.argsort(rng.random((batch, 3)), axis=1),
        }

    def apply(self, images, choices):
        """`images` with `choices` (as `draw` returns them) applied."""
        return _per_image(
            images, self.value_range, self.workers, self._one, choices
        )

    def _one(self, pixels, index, choices):
        pil = _pil()
        pad = self.padding
        if pad:
            height, width = pixels.shape[:2]
            padded = np.pad(pixels, ((pad, pad), (pad, pad), (0, 0)), "reflect")
            top, left = choices["offset"][index]
            pixels = padded[top : top + height, left : left + width]
        if choices["flip"][index]:
            pixels = pixels[:, ::-1]
        img = pil.Image.fromarray(np.ascontiguousarray(pixels))
        choice = _THREE_AUGMENT_CHOICES[choices["choice"][index]]
        if choice == "grayscale":
            img = img.convert("L").convert("RGB")
        elif choice == "solarize":
            img = pil.ImageOps.solarize(img, 128)
        else:
            radius = float(choices["radius"][index])
            img = img.filter(pil.ImageFilter.GaussianBlur(radius))
        if self.color_jitter:
            for k in choices["order"][index]:
                enhancer = getattr(pil.ImageEnhance, _JITTER[k])
                img = enhancer(img).enhance(float(choices["factor"][index, k]))
        return img

    def __call__(self, images, rng):
        images = _check_images(images)
        return self.apply(images, self.draw(len(images), rng))
