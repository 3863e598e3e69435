import keras
import numpy as np
import pytest

from keras_jumbo import data

FILL = (124, 116, 104)


def _pil(image, name, level):
    """timm's `AugmentOp` for `name` (`rand-...-inc1` level functions,
    bilinear, `img_mean=FILL`) on one uint8 image, via PIL directly."""
    from PIL import Image
    from PIL import ImageEnhance
    from PIL import ImageOps

    img = Image.fromarray(image)
    size = abs(level)
    height, width = image.shape[:2]
    enhance = max(0.1, 1.0 + 0.9 * level)
    geometric = dict(resample=Image.BILINEAR, fillcolor=FILL)

    def affine(matrix):
        return img.transform(img.size, Image.AFFINE, matrix, **geometric)

    add = min(128, int(size * 110))
    ops = {
        "AutoContrast": lambda: ImageOps.autocontrast(img),
        "Equalize": lambda: ImageOps.equalize(img),
        "Invert": lambda: ImageOps.invert(img),
        "Rotate": lambda: img.rotate(30.0 * level, **geometric),
        "PosterizeIncreasing": lambda: ImageOps.posterize(
            img, 4 - int(size * 4)
        ),
        "SolarizeIncreasing": lambda: ImageOps.solarize(
            img, 256 - min(256, int(size * 256))
        ),
        "SolarizeAdd": lambda: img.point(
            [min(255, i + add) if i < 128 else i for i in range(256)] * 3
        ),
        "ColorIncreasing": lambda: ImageEnhance.Color(img).enhance(enhance),
        "ContrastIncreasing": lambda: ImageEnhance.Contrast(img).enhance(
            enhance
        ),
        "BrightnessIncreasing": lambda: ImageEnhance.Brightness(img).enhance(
            enhance
        ),
        "SharpnessIncreasing": lambda: ImageEnhance.Sharpness(img).enhance(
            enhance
        ),
        "ShearX": lambda: affine((1, 0.3 * level, 0, 0, 1, 0)),
        "ShearY": lambda: affine((1, 0, 0, 0.3 * level, 1, 0)),
        "TranslateXRel": lambda: affine((1, 0, 0.45 * level * width, 0, 1, 0)),
        "TranslateYRel": lambda: affine((1, 0, 0, 0, 1, 0.45 * level * height)),
    }
    return np.asarray(ops[name]()).astype("float32")


def _images(rng, n=16, height=20, width=24):
    """Blocky images with noise: uneven histograms and edges. (One batch
    shape throughout: eager JAX compiles each primitive per shape.)"""
    blocks = rng.integers(30, 220, (n, height // 4, width // 4, 3))
    images = np.kron(blocks, np.ones((1, 4, 4, 1)))
    images = images + rng.integers(-25, 25, images.shape)
    return np.clip(images, 0, 255).astype("uint8")


@pytest.mark.parametrize("level", [0.9, -0.63])
def test_each_operation_matches_pil_per_image(rng, level):
    # One batch, one operation per image (and one image untouched): the
    # per-image choice and each operation against PIL at once.
    names = data.RAND_AUGMENT_OPS
    images = _images(rng, len(names) + 1)
    op = np.arange(-1, len(names))
    out = keras.ops.convert_to_numpy(
        data.apply_rand_augment_op(
            images.astype("float32"),
            op,
            np.full(len(op), level, "float32"),
            fill=FILL,
        )
    )
    np.testing.assert_array_equal(out[0], images[0])
    for index, name in enumerate(names, start=1):
        reference = _pil(images[index], name, level)
        error = np.abs(out[index] - reference)
        # PIL rounds in fixed point or float64 in places: at most one level
        # apart, on at most a few pixels.
        assert error.max() <= 1.0, (name, error.max())
        assert np.mean(error > 0) <= 0.05, (name, np.mean(error > 0))
        assert not np.array_equal(reference, images[index]), name


def test_posterize_at_magnitude_ten_keeps_no_bits(rng):
    # timm: 4 - int(4 * 1.0) = 0 bits; PIL's mask ~(2**8 - 1) zeroes all.
    images = _images(rng)
    op = np.full(16, data.RAND_AUGMENT_OPS.index("PosterizeIncreasing"))
    level = np.where(np.arange(16) < 8, 1.0, 0.99).astype("float32")
    out = keras.ops.convert_to_numpy(
        data.apply_rand_augment_op(images.astype("float32"), op, level)
    )
    np.testing.assert_array_equal(out[:8], 0.0)
    # 0.99: 4 - int(3.96) = 1 bit kept, the top one.
    np.testing.assert_array_equal(out[8:], (images[8:] >= 128) * 128.0)


def test_layer_draws_per_image_and_applies_the_draws_in_order(rng):
    layer = data.RandAugment(seed=0)
    op, level = layer.draw(6000)
    op = keras.ops.convert_to_numpy(op)
    level = keras.ops.convert_to_numpy(level)
    assert op.shape == level.shape == (6000, 2)
    # Probability 0.5 per operation, uniform over the fifteen.
    skipped = np.mean(op == -1)
    assert abs(skipped - 0.5) < 0.02
    counts = np.bincount(op[op >= 0], minlength=15) / np.sum(op >= 0)
    assert np.all(np.abs(counts - 1 / 15) < 0.012)
    # Magnitude N(9, 0.5) clipped to [0, 10], / 10; random sign.
    size = np.abs(level)
    assert abs(size.mean() - 0.9) < 0.003
    assert abs(size.std() - 0.05) < 0.003
    assert size.max() <= 1.0
    assert abs(np.mean(level < 0) - 0.5) < 0.02

    images = _images(rng).astype("float32")
    data.reseed(layer, 5)
    out = keras.ops.convert_to_numpy(layer(images, training=True))
    data.reseed(layer, 5)
    op, level = layer.draw(16)
    expected = images
    for slot in range(2):
        expected = data.apply_rand_augment_op(
            expected, op[:, slot], level[:, slot], fill=128
        )
    np.testing.assert_array_equal(out, keras.ops.convert_to_numpy(expected))
    # The same image gets different operations across the batch.
    layer = data.RandAugment(num_ops=1, prob=1.0, seed=1)
    same = np.repeat(images[:1], 16, axis=0)
    out = keras.ops.convert_to_numpy(layer(same, training=True))
    assert len({row.tobytes() for row in out}) > 8


def test_value_range_and_save_reload(rng, tmp_path):
    images = _images(rng)
    scaled = data.RandAugment(value_range=(0, 1), seed=3)
    plain = data.RandAugment(seed=3)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(scaled(images / 255.0, training=True)),
        keras.ops.convert_to_numpy(plain(images, training=True)) / 255.0,
        atol=1e-6,
    )
    model = keras.Sequential(
        [
            keras.Input((20, 24, 3)),
            data.RandAugment(
                num_ops=3, magnitude=7, magnitude_std=1.0, fill=FILL, seed=4
            ),
        ]
    )
    path = str(tmp_path / "rand_augment.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    config = loaded.layers[0].get_config()
    assert (config["num_ops"], config["magnitude"], config["fill"]) == (
        3,
        7.0,
        FILL,
    )
    data.reseed(model, 9)
    data.reseed(loaded, 9)
    x = images.astype("float32")
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(model(x, training=True)),
        keras.ops.convert_to_numpy(loaded(x, training=True)),
    )
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(x, training=False)), x
    )


def test_rand_augment_errors():
    for kwargs, name in (
        ({"num_ops": 0}, "num_ops"),
        ({"magnitude": 11}, "magnitude"),
        ({"magnitude_std": -1.0}, "magnitude_std"),
        ({"prob": 1.5}, "prob"),
        ({"fill": (1, 2)}, "fill"),
        ({"fill": 300}, "fill"),
        ({"value_range": (1, 0)}, "value_range"),
    ):
        with pytest.raises(ValueError, match=name):
            data.RandAugment(**kwargs)
    with pytest.raises(TypeError, match="magnitude"):
        data.RandAugment(magnitude="9")
    with pytest.raises(ValueError, match="RGB"):
        data.RandAugment()(np.zeros((2, 8, 8, 1), "float32"))


def test_layer_trains_inside_a_model_with_a_partial_last_batch(rng):
    # fit traces the layer with the batch size unknown (TensorFlow) or per
    # batch shape (JAX): 4 images in batches of 3 and 1.
    images = _images(rng, 4, 8, 8).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            data.RandAugment(prob=1.0, seed=2),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )
    model.compile("sgd", "mse")
    history = model.fit(
        images / 255.0, np.ones((4, 2)), batch_size=3, epochs=1, verbose=0
    )
    assert np.isfinite(history.history["loss"][0])
