import keras
import numpy as np
import pytest

from keras_jumbo import data

FILL = (124, 116, 104)


def _pil(image, name, level):
    """timm's `AugmentOp(name)` on one uint8 image with Pillow (checked by
    hand against timm 1.0.12's own, PIL 13: identical for 10 of the 15,
    one level apart on 0.1-3% of the pixels for the rest)."""
    return np.asarray(
        data.pil_rand_augment_op(image, name, level, FILL)
    ).astype("float32")


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


def _check_draws(op, level):
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


def test_layer_draws_per_image_and_applies_the_draws_in_order(rng):
    layer = data.RandAugment(seed=0)
    _check_draws(*layer.draw(6000))
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
        with pytest.raises(ValueError, match=name):
            data.HostRandAugment(**kwargs)
    with pytest.raises(TypeError, match="magnitude"):
        data.RandAugment(magnitude="9")
    with pytest.raises(ValueError, match="workers"):
        data.HostRandAugment(workers=0)
    with pytest.raises(ValueError, match="RGB"):
        data.HostRandAugment()(np.zeros((2, 8, 8, 1)), np.random.default_rng())
    with pytest.raises(ValueError, match="name"):
        data.pil_rand_augment_op(np.zeros((4, 4, 3), "uint8"), "Blur", 0.5)
    with pytest.raises(ValueError, match="implementation"):
        data.rand_augment(implementation="pil")
    with pytest.raises(TypeError, match="host_transforms"):
        data.BatchAugmentation(host_transforms=[3])
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


def test_host_form_draws_as_the_layer_and_matches_it_per_slot(rng):
    host = data.HostRandAugment(num_ops=2, fill=FILL)
    _check_draws(*host.draw(6000, np.random.default_rng(0)))
    # The same choices through both forms: the host form is each image's
    # PIL operations in order; the layer's slots agree with PIL to one
    # level on a few pixels per operation (as above), so after two
    # operations to a few levels on a few pixels.
    images = _images(rng, 32)
    op, level = host.draw(32, np.random.default_rng(1))
    out = host.apply(images.astype("float32"), op, level)
    assert out.dtype == np.float32
    expected = images.astype("float32")
    for slot in range(2):
        expected = data.apply_rand_augment_op(
            expected, op[:, slot], level[:, slot].astype("float32"), FILL
        )
    error = np.abs(out - keras.ops.convert_to_numpy(expected))
    assert np.mean(error > 1) <= 0.01, np.mean(error > 1)
    assert np.mean(error > 0) <= 0.05, np.mean(error > 0)
    for index in range(32):  # each image: its own operations, in order
        image = images[index]
        for name, value in zip(op[index], level[index], strict=True):
            if name >= 0:
                image = data.pil_rand_augment_op(
                    image, data.RAND_AUGMENT_OPS[name], value, FILL
                )
        np.testing.assert_array_equal(out[index], np.asarray(image))
    # Threads split the batch; the output does not change.
    threaded = data.HostRandAugment(num_ops=2, fill=FILL, workers=3)
    np.testing.assert_array_equal(threaded.apply(images, op, level), out)
    # value_range maps to [0, 255] and back; uint8 input as float input.
    scaled = data.HostRandAugment(num_ops=2, fill=FILL, value_range=(-1, 1))
    np.testing.assert_allclose(
        scaled.apply(images / 127.5 - 1.0, op, level),
        out / 127.5 - 1.0,
        atol=1e-6,
    )


def test_pil_operations_against_closed_forms(rng):
    image = _images(rng, 1)[0]
    x = image.astype("float32")

    def run(name, level):
        return np.asarray(
            data.pil_rand_augment_op(image, name, level, FILL)
        ).astype("float32")

    np.testing.assert_array_equal(run("Invert", 0.3), 255.0 - x)
    # 0.5: 4 - int(2) = 2 bits kept.
    np.testing.assert_array_equal(
        run("PosterizeIncreasing", -0.5), x // 64 * 64
    )
    # 0.25: threshold 256 - 64 = 192; signs do not matter.
    np.testing.assert_array_equal(
        run("SolarizeIncreasing", -0.25), np.where(x >= 192, 255 - x, x)
    )
    # 0.5: add int(55) below 128.
    np.testing.assert_array_equal(
        run("SolarizeAdd", 0.5), np.where(x < 128, np.minimum(x + 55, 255), x)
    )
    # Translate by 0.45 * level * width = 6 of 24 columns: output column c
    # is input column c + 6, the fill beyond the edge (one level off where
    # the float shift lands a hair from 6).
    shifted = run("TranslateXRel", 6 / (0.45 * 24))
    np.testing.assert_allclose(shifted[:, :-6], x[:, 6:], atol=1)
    np.testing.assert_array_equal(
        shifted[:, -6:], np.broadcast_to(FILL, (20, 6, 3))
    )
    # Brightness at level 0.5: factor 1.45, PIL's blend with black.
    np.testing.assert_allclose(
        run("BrightnessIncreasing", 0.5),
        np.floor(np.clip(x * 1.45, 0, 255)),
        atol=1,
    )


def test_host_flip_and_rand_augment_implementations(rng):
    images = _images(rng).astype("float32")
    flipped = data.HostRandomFlip()(images, np.random.default_rng(0))
    mirrored = [
        np.array_equal(f, i[:, ::-1])
        for f, i in zip(flipped, images, strict=True)
    ]
    same = [np.array_equal(f, i) for f, i in zip(flipped, images, strict=True)]
    assert all(m or s for m, s in zip(mirrored, same, strict=True))
    assert 3 <= sum(mirrored) <= 13
    # "auto" on these CPU machines (no accelerator): the host form.
    auto = data.rand_augment(mixup_alpha=0.8)
    assert [type(t) for t in auto.host_transforms] == [
        data.HostRandomFlip,
        data.HostRandAugment,
    ]
    assert auto.image_layers == []
    batched = data.rand_augment(implementation="batched", compiled=False)
    assert batched.host_transforms == []
    assert isinstance(batched.image_layers[1], data.RandAugment)
    labels = np.eye(16, dtype="float32")
    # Reproducible from the batch seed; different seeds differ.
    a, la = auto(images, labels, 5)
    b, lb = auto(images, labels, 5)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(la, lb)
    assert not np.array_equal(a, auto(images, labels, 6)[0])
    # The mix ran on the host form's output (labels mixed, rows sum to 1).
    np.testing.assert_allclose(la.sum(-1), 1.0, atol=1e-6)
    assert not np.array_equal(la, labels)
