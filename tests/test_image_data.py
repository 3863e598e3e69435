import keras
import numpy as np
import pytest

from keras_jumbo import data


def _images(rng, n=12, size=8):
    return rng.integers(0, 256, size=(n, size, size, 3)).astype("uint8")


def test_image_batches_epoch_order_and_normalisation(rng):
    images, labels = _images(rng), np.arange(12) % 5
    batches = data.ImageBatches(
        images, labels, 4, num_classes=5, mean=(0.5,) * 3, std=(0.25,) * 3
    )
    assert len(batches) == 3
    seen = []
    for i in range(len(batches)):
        x, y = batches[i]
        seen.append(y.argmax(-1))
        rows = [
            int(np.flatnonzero((images == v).all((1, 2, 3)))[0])
            for v in np.round((x * 0.25 + 0.5) * 255).astype("uint8")
        ]
        np.testing.assert_allclose(
            x, (images[rows] / 255.0 - 0.5) / 0.25, atol=1e-6
        )
        np.testing.assert_array_equal(y, np.eye(5)[labels[rows]])
    order0 = np.concatenate(seen)
    assert sorted(order0.tolist()) == sorted(labels.tolist())
    # Same epoch: same batches (a restart reproduces them); another epoch:
    # another order.
    again = data.ImageBatches(
        images, labels, 4, num_classes=5, mean=(0.5,) * 3, std=(0.25,) * 3
    )
    np.testing.assert_array_equal(again[1][0], batches[1][0])
    batches.set_epoch(1)
    assert not np.array_equal(batches[0][0], again[0][0])
    again.set_epoch(1)
    np.testing.assert_array_equal(batches[2][0], again[2][0])


@pytest.mark.parametrize(
    "mean, std",
    [
        ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        (0.5, 0.25),
        ((0.3,), (0.2,)),
        (np.full((7, 3), 0.4), (0.2, 0.3, 0.5)),  # not per channel
    ],
)
def test_normalize_is_the_formula_bit_for_bit(rng, mean, std):
    """The tiled, in-place normalisation gives exactly the broadcast
    formula's float32 numbers, and leaves its (read-only) input alone."""
    from keras_jumbo.data.images import _normalize

    images = rng.integers(0, 256, (4, 5, 7, 3)).astype("float32")
    images.setflags(write=False)
    before = images.copy()
    mean = np.asarray(mean, "float32")
    std = np.asarray(std, "float32")
    out = _normalize(images, 255.0, mean, std)
    expected = (images / 255.0 - mean) / std
    assert out.dtype == np.float32 and out.shape == images.shape
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(images, before)


def test_image_batches_errors(rng):
    with pytest.raises(ValueError, match="images"):
        data.ImageBatches(np.zeros((4, 8, 8)), np.zeros(4), 2)
    with pytest.raises(ValueError, match="labels"):
        data.ImageBatches(_images(rng, 4), np.zeros(3), 2)
    with pytest.raises(ValueError, match="batch_size"):
        data.ImageBatches(_images(rng, 4), np.zeros(4), 0)
    with pytest.raises(ValueError, match="No batch"):
        data.ImageBatches(_images(rng, 4), np.zeros(4), 8, drop_remainder=True)
    images = _images(rng, 4)
    with pytest.raises(ValueError, match="std"):
        data.ImageBatches(images, np.zeros(4, int), 2, mean=0.5, std=0.0)
    with pytest.raises(ValueError, match="both"):
        data.ImageBatches(images, np.zeros(4, int), 2, mean=0.5)
    with pytest.raises(ValueError, match=r"num_classes=3.*from 0 to 3"):
        data.ImageBatches(images, np.array([0, 1, 2, 3]), 2, num_classes=3)
    with pytest.raises(TypeError, match="integer class indices"):
        data.ImageBatches(images, np.array([0, 0.5, 1, 2]), 2)
    nan_images = images.astype("float32")
    nan_images[1, 2, 3, 0] = np.nan
    with pytest.raises(ValueError, match="1 NaN/inf"):
        data.ImageBatches(nan_images, np.zeros(4, int), 2)
    batches = data.ImageBatches(images, np.zeros(4, int), 2)
    with pytest.raises(IndexError, match="index=2"):
        batches[2]


@pytest.mark.parametrize("implementation", ["host", "batched"])
def test_three_augment_is_reproducible_per_seed(rng, implementation):
    images = _images(rng, 6, 16).astype("float32")
    labels = np.eye(3, dtype="float32")[[0, 1, 2, 0, 1, 2]]
    augment = data.three_augment(
        mixup_alpha=0.8, cutmix_alpha=1.0, implementation=implementation
    )
    a = augment(images, labels, seed=3)
    b = augment(images, labels, seed=3)
    c = augment(images, labels, seed=4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])
    assert a[0].shape == images.shape
    np.testing.assert_allclose(a[1].sum(-1), 1.0, atol=1e-5)


def test_compiled_augmentation_equals_eager_per_seed(rng):
    images = _images(rng, 6, 16).astype("float32")
    labels = np.eye(3, dtype="float32")[[0, 1, 2, 0, 1, 2]]
    for seed in (3, 4):
        outputs = [
            data.three_augment(
                mixup_alpha=0.8,
                cutmix_alpha=1.0,
                compiled=compiled,
                implementation="batched",
            )(images, labels, seed=seed)
            for compiled in (True, False)
        ]
        np.testing.assert_allclose(outputs[0][0], outputs[1][0], atol=1e-3)
        np.testing.assert_allclose(outputs[0][1], outputs[1][1], atol=1e-6)
    with pytest.raises(TypeError, match="compiled"):
        data.BatchAugmentation([], compiled="yes")


def _scipy_blur(images, sigmas, radius):
    from scipy import ndimage

    return np.stack(
        [
            np.stack(
                [
                    ndimage.gaussian_filter(
                        image[..., c].astype("float64"),
                        sigma,
                        mode="nearest",
                        radius=radius,
                    )
                    for c in range(image.shape[-1])
                ],
                axis=-1,
            )
            for image, sigma in zip(images, sigmas, strict=True)
        ]
    )


def test_gaussian_blur_matches_scipy_per_image_sigma(rng):
    images = rng.uniform(0, 255, size=(3, 9, 11, 2)).astype("float32")
    sigmas = np.array([0.3, 1.0, 2.0], "float32")
    out = data.gaussian_blur(
        keras.ops.convert_to_tensor(images),
        keras.ops.convert_to_tensor(sigmas),
        4,
    )
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(out),
        _scipy_blur(images, sigmas, 4),
        atol=2e-4,
    )


def test_random_gaussian_blur_draws_one_isotropic_sigma_per_image(
    rng, tmp_path
):
    images = rng.uniform(0, 255, size=(2, 8, 10, 3)).astype("float32")
    fixed = data.RandomGaussianBlur(sigma=1.3, seed=0)
    assert fixed.radius == 4  # ceil(3 * 1.3)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(fixed(images, training=True)),
        _scipy_blur(images, [1.3, 1.3], 4),
        atol=2e-4,
    )
    # An impulse: its blurred centre is the kernel's centre weight squared,
    # which falls with sigma, so each image shows the sigma it drew.
    impulse = np.zeros((16, 13, 13, 1), "float32")
    impulse[:, 6, 6] = 1.0
    layer = data.RandomGaussianBlur(sigma=(0.5, 2.0), radius=6, seed=1)
    centres = keras.ops.convert_to_numpy(layer(impulse))[:, 6, 6, 0]
    bounds = [
        _scipy_blur(impulse[:1], [sigma], 6)[0, 6, 6, 0] for sigma in (2.0, 0.5)
    ]
    assert np.all((centres >= bounds[0] - 1e-6) & (centres <= bounds[1] + 1e-6))
    assert len(np.unique(np.round(centres, 5))) > 8  # per image, not batch
    path = str(tmp_path / "blur.keras")
    keras.Sequential([keras.Input((13, 13, 1)), layer]).save(path)
    loaded = keras.saving.load_model(path).layers[0]
    assert (loaded.sigma, loaded.radius) == ((0.5, 2.0), 6)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(impulse, training=False)), impulse
    )
    for bad in (0.0, (2.0, 1.0), (1.0,), "1"):
        with pytest.raises(ValueError, match="sigma"):
            data.RandomGaussianBlur(sigma=bad)
    with pytest.raises(ValueError, match="radius"):
        data.RandomGaussianBlur(radius=-1)


def test_mixup_mixes_images_and_labels_alike(rng):
    images = _images(rng, 4, 8).astype("float32")
    labels = np.eye(4, dtype="float32")
    mixed_images, mixed_labels = data.MixUpOrCutMix(0.8, 0.0)(
        keras.ops.convert_to_tensor(images),
        keras.ops.convert_to_tensor(labels),
        seed=7,
    )
    mixed_images = keras.ops.convert_to_numpy(mixed_images)
    mixed_labels = keras.ops.convert_to_numpy(mixed_labels)
    for i in range(4):
        # label row i = lam * e_i + (1 - lam) * e_j: the images must mix
        # with the same weights.
        weights = mixed_labels[i]
        expected = np.tensordot(weights, images, axes=1)
        np.testing.assert_allclose(
            mixed_images[i], expected, rtol=1e-4, atol=1e-3
        )


def test_pad_and_random_crop_is_a_window_of_the_reflect_padded_image(rng):
    images = rng.normal(size=(2, 6, 6, 3)).astype("float32")
    crop = data.PadAndRandomCrop(2, seed=1)
    out = keras.ops.convert_to_numpy(crop(images))
    padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)), mode="reflect")
    windows = [
        padded[:, t : t + 6, s : s + 6] for t in range(5) for s in range(5)
    ]
    assert any(np.allclose(out, w) for w in windows)


def test_one_of_picks_one_candidate_per_image(rng):
    images = rng.uniform(0, 255, size=(16, 4, 4, 3)).astype("float32")
    negate = keras.layers.Lambda(lambda x: -x)
    double = keras.layers.Lambda(lambda x: 2 * x)
    out = keras.ops.convert_to_numpy(
        data.OneOf([negate, double], seed=0)(images)
    )
    negated = np.all(np.isclose(out, -images), axis=(1, 2, 3))
    doubled = np.all(np.isclose(out, 2 * images), axis=(1, 2, 3))
    assert np.all(negated ^ doubled)
    assert negated.any() and doubled.any()


def test_augmentation_layers_save_and_reload(rng, tmp_path):
    images = rng.uniform(0, 255, size=(4, 8, 8, 3)).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            data.PadAndRandomCrop(2, seed=3),
            data.OneOf(
                [keras.layers.RandomGrayscale(1.0), keras.layers.Identity()],
                seed=4,
            ),
        ]
    )
    path = str(tmp_path / "augment.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    data.reseed(model, 11)
    data.reseed(loaded, 11)
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(model(images, training=True)),
        keras.ops.convert_to_numpy(loaded(images, training=True)),
        atol=1e-5,
    )
    # Inference passes images through unchanged.
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(images, training=False)), images
    )
    with pytest.raises(ValueError, match="padding"):
        data.PadAndRandomCrop(-1)
    with pytest.raises(ValueError, match="layers"):
        data.OneOf([])


def test_epoch_seed_and_multi_architecture_batches_resume(rng):
    from keras_jumbo import callbacks
    from keras_jumbo import nas

    with pytest.raises(TypeError, match="set_epoch"):
        callbacks.EpochSeed(0, datasets=[object()])
    with pytest.raises(TypeError, match="seed"):
        callbacks.EpochSeed(seed="0")
    space = nas.SearchSpace.preset("tiny")
    images = rng.normal(size=(32, 4)).astype("float32")
    labels = np.arange(32)

    def batches():
        return nas.MultiArchitectureBatches(
            images, labels, space, batch_size=8, num_architectures=2, seed=5
        )

    a, b = batches(), batches()
    for _ in range(3):  # a runs epochs 0..2 in order; b jumps to epoch 2
        a.on_epoch_end()
    a.set_epoch(2)
    b.set_epoch(2)
    for index in range(len(a)):
        (xa, ya), (xb, yb) = a[index], b[index]
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa["architecture"], xb["architecture"])


def test_augmented_batches_normalise_and_seed_each_pass(rng):
    """Batches of any iterable, normalised as `ImageBatches` (exact float32
    formula), the augmentation called with the seed `(seed, pass, i)`,
    looping over the dataset forever."""
    from keras_jumbo.data.augment import step_seed

    batches = [
        (_images(rng, 2), np.eye(3, dtype="float32")[[0, 1]]),
        (_images(rng, 2), np.eye(3, dtype="float32")[[2, 0]]),
    ]
    seeds = []

    def augmentation(images, labels, seed):
        seeds.append(seed)
        return images, labels

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    stream = data.augmented_batches(batches, augmentation, 7, mean, std)
    for step in range(5):
        x, y = next(stream)
        images, labels = batches[step % 2]
        expected = (
            images.astype("float32") / 255.0 - np.asarray(mean, "float32")
        ) / np.asarray(std, "float32")
        np.testing.assert_array_equal(x, expected)
        np.testing.assert_array_equal(y, labels)
    assert seeds == [
        step_seed(7, 0, 0),
        step_seed(7, 0, 1),
        step_seed(7, 1, 0),
        step_seed(7, 1, 1),
        step_seed(7, 2, 0),
    ]


@pytest.mark.parametrize("shuffle", [True, False])
def test_image_batches_cover_each_epoch_once_and_follow_set_epoch(rng, shuffle):
    """Every example once per epoch, the last batch partial; the epoch's
    order is kept between batches and follows `set_epoch` both ways."""
    images = _images(rng, 10, size=2)
    labels = np.arange(10)
    batches = data.ImageBatches(images, labels, 4, shuffle=shuffle, seed=3)

    def epoch_labels():
        return [batches[i][1].tolist() for i in range(len(batches))]

    first = epoch_labels()
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(sum(first, [])) == list(range(10))
    if not shuffle:
        assert sum(first, []) == list(range(10))
    batches.set_epoch(1)
    second = epoch_labels()
    assert sorted(sum(second, [])) == list(range(10))
    assert (second != first) == shuffle
    batches.set_epoch(0)
    assert epoch_labels() == first
    fresh = data.ImageBatches(images, labels, 4, shuffle=shuffle, seed=3)
    fresh.set_epoch(1)
    assert [fresh[i][1].tolist() for i in range(3)] == second
