"""Batch augmentation built from Keras core preprocessing layers, with
per-batch seeds so that a run can be reproduced (and resumed) exactly.

Keras' augmentation layers draw from their own `SeedGenerator`s; here
every generator of a layer is re-seeded from `(seed, step)` before it is
applied, so batch `i` of epoch `e` is augmented the same way in every run
with the same seed, on every backend, whether or not the run was
interrupted. keras-cv is not used (0.9 is no longer developed and its
MixUp / CutMix / RandAugment fail inside `model.fit` under Keras 3.15).
"""

import keras
import numpy as np
from keras import ops

from keras_jumbo._keras_internals import WaitsForBatches
from keras_jumbo._keras_internals import sublayers
from keras_jumbo.data.host_augment import HostRandAugment
from keras_jumbo.data.host_augment import HostRandomFlip
from keras_jumbo.data.host_augment import HostThreeAugment
from keras_jumbo.data.host_augment import pil_available
from keras_jumbo.data.randaugment import RandAugment
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.runtime import accelerator_available

# Augmentation runs in float32 whatever the global (mixed) policy is.
_F32 = "float32"


def seed_generators(layer):
    """Every `keras.random.SeedGenerator` owned by `layer` or its sublayers."""
    found = []
    for item in sublayers(layer, include_self=True):
        for value in vars(item).values():
            if isinstance(value, keras.random.SeedGenerator) and not any(
                value is other for other in found
            ):
                found.append(value)
    return found


def reseed(layer, seed):
    """Set every seed generator of `layer` to a state derived from `seed`."""
    for index, generator in enumerate(seed_generators(layer)):
        state = np.array(
            [int(seed) % (2**31), index], dtype=generator.state.dtype
        )
        generator.state.assign(state)


def step_seed(seed, *parts):
    """A 31-bit seed from an int tuple (stable across runs and platforms)."""
    sequence = np.random.SeedSequence([int(seed), *map(int, parts)])
    return int(sequence.generate_state(1)[0] % (2**31 - 1))


@keras.saving.register_keras_serializable(package="keras_jumbo")
class OneOf(keras.layers.Layer):
    """Apply one of `layers`, chosen uniformly per image.

    Every candidate is applied to the whole batch and each image keeps the
    output of its own draw (DeiT III's 3-Augment picks one of grayscale,
    solarisation and Gaussian blur per image).

    Args:
        layers: list of image-to-image Keras layers (same output shape).
        seed: int or None.
    """

    def __init__(self, layers, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not layers:
            raise ValueError(f"`layers` must be non-empty. Received: {layers}")
        self.candidates = list(layers)
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=True):
        if not training:
            return images
        outputs = [layer(images, training=True) for layer in self.candidates]
        choice = keras.random.randint(
            (ops.shape(images)[0],),
            0,
            len(outputs),
            seed=self.generator,
        )
        result = outputs[0]
        for index in range(1, len(outputs)):
            keep = ops.reshape(choice == index, (-1, 1, 1, 1))
            result = ops.where(
                keep, ops.cast(outputs[index], result.dtype), result
            )
        return result

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "layers": [
                keras.saving.serialize_keras_object(layer)
                for layer in self.candidates
            ],
            "seed": self.seed,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["layers"] = [
            keras.saving.deserialize_keras_object(layer)
            for layer in config["layers"]
        ]
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PadAndRandomCrop(keras.layers.Layer):
    """Reflect-pad by `padding` pixels, then crop back at a random offset
    (DeiT III's "simple random crop" at the training resolution)."""

    def __init__(self, padding=4, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.padding = check_positive_int("padding", padding, allow_zero=True)
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=True):
        if not training or self.padding == 0:
            return images
        height, width = images.shape[1], images.shape[2]
        pad = self.padding
        padded = ops.pad(
            images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="reflect"
        )
        offsets = keras.random.randint(
            (2,), 0, 2 * pad + 1, seed=self.generator
        )
        zero = ops.zeros((1,), "int32")
        start = ops.concatenate([zero, ops.cast(offsets, "int32"), zero])
        size = (ops.shape(images)[0], height, width, ops.shape(images)[3])
        return ops.slice(padded, start, size)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "padding": self.padding,
            "seed": self.seed,
        }


def gaussian_blur(images, sigma, radius):
    """Blur each image of a batch with its own isotropic Gaussian.

    The kernel is `exp(-x**2 / (2 * sigma_i**2))` on the integers
    `-radius..radius`, normalised to sum 1, applied separably (columns,
    then rows) with the edge pixels repeated outside the image -- as
    `scipy.ndimage.gaussian_filter(mode="nearest", radius=radius)` per
    image and channel. Each pass is one batched matrix product with the
    image's banded blur matrix (edges folded in): at 224 px, 9x faster on
    JAX than the 7x7 depthwise convolution of Keras' `gaussian_blur`, as
    fast on TensorFlow, 0.79x on PyTorch (CHANGELOG). The two passes cost
    `height * width * (height + width)` multiply-adds per image and
    channel (each matrix spans a whole side), so it suits training
    resolutions, not megapixel images.

    Args:
        images: float `(batch, height, width, channels)`.
        sigma: float `(batch,)`, each > 0.
        radius: int >= 0, the kernel's half-width in pixels.
    """
    taps = ops.arange(-radius, radius + 1, dtype=images.dtype)
    sigma = ops.cast(ops.reshape(sigma, (-1, 1)), images.dtype)
    weights = ops.exp(-0.5 * ops.square(taps[None, :] / sigma))
    weights = weights / ops.sum(weights, axis=1, keepdims=True)
    height, width = images.shape[1], images.shape[2]
    rows = ops.einsum(
        "bt,itj->bij", weights, _blur_taps(height, radius, images.dtype)
    )
    images = ops.einsum("bij,bjwc->biwc", rows, images)
    columns = ops.einsum(
        "bt,itj->bij", weights, _blur_taps(width, radius, images.dtype)
    )
    return ops.einsum("bij,bhjc->bhic", columns, images)


def _blur_taps(size, radius, dtype):
    """`(size, 2 * radius + 1, size)` 0/1: output pixel i, tap t reads
    pixel j = clip(i + t - radius) (edge pixels repeated)."""
    source = np.clip(
        np.arange(size)[:, None] + np.arange(-radius, radius + 1)[None, :],
        0,
        size - 1,
    )
    return ops.convert_to_tensor(np.eye(size)[source], dtype)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class RandomGaussianBlur(keras.layers.Layer):
    """Gaussian blur with a standard deviation drawn per image.

    DeiT III's 3-Augment blurs each image with PIL's
    `GaussianBlur(radius=uniform(0.1, 2.0))`: one isotropic sigma per
    image, edge pixels extended. This layer does the same with an exact
    (truncated) Gaussian: sigma ~ U(`sigma`) per image, kernel half-width
    `ceil(3 * max sigma)` pixels unless `radius` is given, edges repeated
    (`gaussian_blur`). Keras' `RandomGaussianBlur` differs on all three
    counts (one sigma pair per batch, independent in x and y; a fixed
    `kernel_size`; zero padding, which darkens the border) and is 9x
    slower on JAX at 224 px (`benchmarks/augment_throughput.py`).

    Args:
        sigma: float or `(min, max)` pair of floats > 0; a float is a
            fixed sigma.
        radius: int >= 0 or None (from `sigma`).
        seed: int or None.

    Call arguments:
        images: float `(batch, height, width, channels)`.
        training: bool; the layer is the identity unless True.
    """

    def __init__(self, sigma=(0.1, 2.0), radius=None, seed=None, **kwargs):
        super().__init__(**kwargs)
        pair = sigma if isinstance(sigma, (tuple, list)) else (sigma, sigma)
        if (
            len(pair) != 2
            or not all(
                isinstance(v, (int, float))
                and not isinstance(v, bool)
                and v > 0
                for v in pair
            )
            or pair[0] > pair[1]
        ):
            raise ValueError(
                "`sigma` must be a float > 0 or a pair (min, max) with "
                f"0 < min <= max. Received: sigma={sigma!r}"
            )
        self.sigma = (float(pair[0]), float(pair[1]))
        if radius is None:
            radius = int(np.ceil(3.0 * self.sigma[1]))
        self.radius = check_positive_int("radius", radius, allow_zero=True)
        self.seed = seed
        self.generator = keras.random.SeedGenerator(seed)

    def call(self, images, training=True):
        if not training:
            return images
        sigma = keras.random.uniform(
            (ops.shape(images)[0],),
            self.sigma[0],
            self.sigma[1],
            dtype=images.dtype,
            seed=self.generator,
        )
        return gaussian_blur(images, sigma, self.radius)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "sigma": self.sigma,
            "radius": self.radius,
            "seed": self.seed,
        }


class MixUpOrCutMix:
    """Per batch, MixUp (probability `1 - switch_prob`) or CutMix.

    timm's `Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5)`, as
    the Jumbo ImageNet recipes use it, with Keras' own `MixUp(alpha)` and
    `CutMix(factor)`. An alpha of 0 disables that mix (the ImageNet-21K
    recipe: MixUp 0.8, CutMix 0).

    Args:
        mixup_alpha, cutmix_alpha: floats >= 0 (0: that mix is off).
        switch_prob: float in [0, 1], the probability of CutMix when both
            are on.
        compiled: bool; as `BatchAugmentation`.

    Call arguments:
        images, labels (one-hot, float); seed: int.
    """

    def __init__(
        self, mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, compiled=True
    ):
        for name, value in (
            ("mixup_alpha", mixup_alpha),
            ("cutmix_alpha", cutmix_alpha),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"`{name}` must be a float. Received: {name}={value!r}"
                )
            if value < 0:
                raise ValueError(
                    f"`{name}` must be >= 0. Received: {name}={value!r}"
                )
        if not 0.0 <= switch_prob <= 1.0:
            raise ValueError(
                "`switch_prob` must be in [0, 1]. "
                f"Received: switch_prob={switch_prob!r}"
            )
        self.mixup_alpha = float(mixup_alpha)
        self.cutmix_alpha = float(cutmix_alpha)
        self.switch_prob = float(switch_prob)
        self.mixup = (
            keras.layers.MixUp(alpha=mixup_alpha, dtype=_F32)
            if mixup_alpha
            else None
        )
        self.cutmix = (
            keras.layers.CutMix(factor=cutmix_alpha, dtype=_F32)
            if cutmix_alpha
            else None
        )
        self.compiled = check_bool("compiled", compiled)
        self._models = {
            id(layer): TrainingModeModel([layer], name=f"{layer.name}_model")
            for layer in (self.mixup, self.cutmix)
            if layer is not None and self.compiled
        }

    def __call__(self, images, labels, seed):
        layer = self.mixup or self.cutmix
        if self.mixup is not None and self.cutmix is not None:
            draw = np.random.default_rng(step_seed(seed, 1)).random()
            layer = self.cutmix if draw < self.switch_prob else self.mixup
        if layer is None:
            return images, labels
        reseed(layer, step_seed(seed, 2))
        inputs = {
            "images": ops.convert_to_tensor(images, _F32),
            "labels": ops.convert_to_tensor(labels, _F32),
        }
        if self.compiled:
            out = self._models[id(layer)].predict_on_batch(inputs)
        else:
            out = layer(inputs, training=True)
        return out["images"], out["labels"]


class BatchAugmentation:
    """Image layers, then an optional mix, applied to a batch with a seed.

    Args:
        image_layers: Keras image-to-image layers (e.g. `RandomFlip`,
            `RandAugment`), applied in order to the images.
        mix: a `MixUpOrCutMix` or None.
        host_transforms: callables `(images, rng) -> images` on numpy
            batches (e.g. `HostRandomFlip`, `HostRandAugment`), applied in
            order before `image_layers`, each with its own
            `numpy.random.Generator` seeded from the batch's seed.
        compiled: bool. True (default): the layers run as one compiled
            program per batch shape (`keras.Model.predict_on_batch` in
            training mode: `jax.jit` on JAX, a `tf.function` on
            TensorFlow; PyTorch runs eagerly either way), False: layer by
            layer, eagerly. The same seed gives the same batch both ways
            (to float rounding). 3-Augment at 224 px: 1.7x faster per batch
            compiled on JAX, 1.2x on TensorFlow
            (`benchmarks/augment_throughput.py`).

    Call arguments:
        images: float `(batch, H, W, C)` in the pixel range the layers
            expect (`value_range`, [0, 255] for the presets here).
        labels: one-hot float `(batch, classes)`.
        seed: int; the same seed gives the same augmentation.

    Returns:
        `(images, labels)` as numpy arrays.
    """

    def __init__(
        self, image_layers=(), mix=None, compiled=True, host_transforms=()
    ):
        self.image_layers = list(image_layers)
        self.mix = mix
        self.compiled = check_bool("compiled", compiled)
        self.host_transforms = list(host_transforms)
        for transform in self.host_transforms:
            if not callable(transform):
                raise TypeError(
                    "`host_transforms` must be callables (images, rng) -> "
                    f"images. Received: {transform!r}"
                )
        self._model = None
        if self.compiled and self.image_layers:
            self._model = TrainingModeModel(self.image_layers)

    def __call__(self, images, labels, seed):
        if self.host_transforms:
            images = np.asarray(images, "float32")
            for index, transform in enumerate(self.host_transforms):
                rng = np.random.default_rng(step_seed(seed, 30 + index))
                images = transform(images, rng)
        images = ops.convert_to_tensor(images, "float32")
        labels = ops.convert_to_tensor(labels, "float32")
        for index, layer in enumerate(self.image_layers):
            reseed(layer, step_seed(seed, 10 + index))
        if self._model is not None:
            images = self._model.predict_on_batch(images)
        else:
            for layer in self.image_layers:
                images = layer(images, training=True)
        if self.mix is not None:
            images, labels = self.mix(images, labels, seed)
        return ops.convert_to_numpy(images), ops.convert_to_numpy(labels)


class TrainingModeModel(WaitsForBatches, keras.Model):
    """`layers` applied in order with `training=True`, as a model.

    Its `predict_on_batch` runs random augmentation layers (identities at
    inference) as one compiled program; the input may be a tensor or a
    dict (`{"images", "labels"}` for `MixUp` / `CutMix`). Float32 whatever
    the global policy, as the augmentation here.
    """

    def __init__(self, layers, **kwargs):
        kwargs.setdefault("name", "training_mode_model")
        super().__init__(dtype=_F32, **kwargs)
        self.applied = list(layers)

    def call(self, inputs):
        for layer in self.applied:
            inputs = layer(inputs, training=True)
        return inputs


def _mix(mixup_alpha, cutmix_alpha, compiled):
    if mixup_alpha or cutmix_alpha:
        return MixUpOrCutMix(mixup_alpha, cutmix_alpha, compiled=compiled)
    return None


def three_augment(
    padding=4,
    color_jitter=0.3,
    value_range=(0, 255),
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    compiled=True,
    implementation="auto",
):
    """DeiT III's 3-Augment (Touvron et al., 2022), optionally mixed.

    Simple random crop (reflect padding + crop), horizontal flip, then per
    image one of {grayscale, solarisation, Gaussian blur}, then colour
    jitter (brightness/contrast/saturation `color_jitter`); optionally
    MixUp/CutMix. Needs 3-channel images.

    `implementation` as `rand_augment`: "host" is `HostThreeAugment`, the
    reference's PIL calls per image on the numpy batch; "batched" is built
    from Keras core layers, one compiled program a batch (`compiled` as
    `BatchAugmentation`); "auto" picks "host" without an accelerator.
    The batched form differs from the reference, stated: one crop offset
    per batch; Keras' `Solarization` with `threshold_factor=(0.5, 0.5)`
    inverts values above the middle of `value_range` (the reference: at
    128 of 255, the same); the Gaussian blur is this module's
    `RandomGaussianBlur(sigma=(0.1, 2.0))`: sigma per image as the
    reference's PIL `GaussianBlur(radius)`, but an exact Gaussian
    truncated at 3 sigma where PIL approximates it with box blurs; colour
    jitter is Keras' `RandomColorJitter` (fixed order), where the
    reference's torchvision `ColorJitter` applies the three in a random
    order.
    """
    mix = _mix(mixup_alpha, cutmix_alpha, compiled)
    if _resolve(implementation) == "host":
        host = HostThreeAugment(padding, color_jitter, value_range)
        return BatchAugmentation([], mix, compiled, host_transforms=[host])
    image_layers = [
        PadAndRandomCrop(padding, dtype=_F32),
        keras.layers.RandomFlip("horizontal", dtype=_F32),
        OneOf(
            [
                keras.layers.RandomGrayscale(factor=1.0, dtype=_F32),
                keras.layers.Solarization(
                    addition_factor=0.0,
                    threshold_factor=(0.5, 0.5),
                    value_range=value_range,
                    dtype=_F32,
                ),
                RandomGaussianBlur(sigma=(0.1, 2.0), dtype=_F32),
            ],
            dtype=_F32,
        ),
    ]
    if color_jitter:
        image_layers.append(
            keras.layers.RandomColorJitter(
                value_range=value_range,
                brightness_factor=color_jitter,
                contrast_factor=color_jitter,
                saturation_factor=color_jitter,
                dtype=_F32,
            )
        )
    return BatchAugmentation(image_layers, mix, compiled)


AUGMENT_IMPLEMENTATIONS = ("auto", "host", "batched")


def _resolve(implementation):
    """`implementation` resolved to "host" or "batched" ("auto": host when
    Pillow imports and the backend has no accelerator)."""
    if implementation not in AUGMENT_IMPLEMENTATIONS:
        raise ValueError(
            f"`implementation` must be one of {AUGMENT_IMPLEMENTATIONS}. "
            f"Received: implementation={implementation!r}"
        )
    if implementation == "auto":
        host = pil_available() and not accelerator_available()
        return "host" if host else "batched"
    return implementation


def rand_augment(
    magnitude=9.0,
    magnitude_std=0.5,
    num_ops=2,
    fill=(124, 116, 104),
    value_range=(0, 255),
    mixup_alpha=0.0,
    cutmix_alpha=0.0,
    compiled=True,
    implementation="auto",
):
    """Horizontal flip + timm's RandAugment, optionally mixed.

    The Jumbo fine-tune stage and the Non-Deep ViT recipe (DeiT's
    settings) use timm's `rand-m9-mstd0.5-inc1` (the defaults here): per
    image, 2 operations at magnitude N(9, 0.5) out of 10, each with
    probability 0.5; geometric operations fill with the ImageNet mean
    (124, 116, 104), as timm's `create_transform` sets `img_mean`.

    `implementation`: "host": the flip and `HostRandAugment` on the numpy
    batch, image by image with Pillow, as timm does; "batched": Keras'
    `RandomFlip` and the `RandAugment` layer, one program for the batch
    (`compiled` as `BatchAugmentation`); "auto" (default): "host" when
    Pillow imports and Keras sees no accelerator
    (`keras_jumbo.runtime.accelerator_available()`), else "batched". On
    a 2-core CPU the host form is ~7x faster a batch
    (`benchmarks/augment_throughput.py`). The two draw the same
    distribution, not the same choices from a seed. The mix is the same
    either way.
    """
    implementation = _resolve(implementation)
    args = dict(
        num_ops=num_ops,
        magnitude=magnitude,
        magnitude_std=magnitude_std,
        fill=fill,
        value_range=value_range,
    )
    mix = _mix(mixup_alpha, cutmix_alpha, compiled)
    if implementation == "host":
        transforms = [HostRandomFlip(), HostRandAugment(**args)]
        return BatchAugmentation([], mix, compiled, host_transforms=transforms)
    image_layers = [
        keras.layers.RandomFlip("horizontal", dtype=_F32),
        RandAugment(**args, dtype=_F32),
    ]
    return BatchAugmentation(image_layers, mix, compiled)
