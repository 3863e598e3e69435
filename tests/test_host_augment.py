"""`data.HostThreeAugment`: DeiT III's 3-Augment per image with Pillow,
step by step against closed forms of the PIL operations it calls."""

import numpy as np
import pytest

from keras_jumbo import data


def _images(rng, n=4, height=20, width=24):
    blocks = rng.integers(30, 220, (n, height // 4, width // 4, 3))
    images = np.kron(blocks, np.ones((1, 4, 4, 1)))
    images = images + rng.integers(-25, 25, images.shape)
    return np.clip(images, 0, 255).astype("uint8")


def _luma(x):
    """PIL's RGB -> L in its fixed point, rounded."""
    weights = np.array([19595, 38470, 7471])
    return (x.astype("int64") @ weights + 32768) >> 16


def _blend(degenerate, x, factor):
    return np.floor(np.clip(degenerate + factor * (x - degenerate), 0, 255))


def _choices(n, choice, factor=(1.0, 1.0, 1.0), order=(0, 1, 2), **kw):
    return {
        "offset": np.asarray(kw.get("offset", np.zeros((n, 2), int))),
        "flip": np.asarray(kw.get("flip", np.zeros(n, bool))),
        "choice": np.full(n, choice),
        "radius": np.asarray(kw.get("radius", np.full(n, 1.0))),
        "factor": np.tile(np.asarray(factor, float), (n, 1)),
        "order": np.tile(np.asarray(order), (n, 1)),
    }


def test_crop_flip_and_the_three_choices(rng):
    images = _images(rng)
    x = images.astype("float32")
    augment = data.HostThreeAugment(padding=4)
    # Crop at per-image offsets from the reflect-padded image, flip some,
    # then solarise (at 128): closed form.
    offset = np.array([[0, 8], [3, 1], [8, 0], [4, 4]])
    flip = np.array([True, False, True, False])
    out = augment.apply(images, _choices(4, 1, offset=offset, flip=flip))
    padded = np.pad(x, ((0, 0), (4, 4), (4, 4), (0, 0)), "reflect")
    for i, (top, left) in enumerate(offset):
        crop = padded[i, top : top + 20, left : left + 24]
        if flip[i]:
            crop = crop[:, ::-1]
        np.testing.assert_array_equal(
            out[i], np.where(crop >= 128, 255 - crop, crop)
        )
    # Grayscale: PIL's luma in all three channels.
    gray = augment.apply(images, _choices(4, 0, offset=np.full((4, 2), 4)))
    np.testing.assert_array_equal(
        gray, np.repeat(_luma(images)[..., None], 3, -1)
    )
    # Blur: PIL's box approximation of a Gaussian of the drawn radius; near
    # the exact Gaussian, and more blur for a larger radius.
    radius = np.array([0.5, 2.0, 0.5, 2.0])
    blurred = augment.apply(
        images, _choices(4, 2, offset=np.full((4, 2), 4), radius=radius)
    )
    import keras

    exact = keras.ops.convert_to_numpy(
        data.gaussian_blur(x, radius.astype("float32"), 8)
    )
    assert np.mean(np.abs(blurred - exact)) < 2.0
    change = np.abs(blurred - x).mean(axis=(1, 2, 3))
    assert change[1] > change[0] and change[3] > change[2]


def test_colour_jitter_factors_in_their_order(rng):
    images = _images(rng, 2)
    x = images.astype("float32")
    augment = data.HostThreeAugment(padding=0)
    solar = np.where(x >= 128, 255 - x, x)

    def contrast(y, f):
        mean = int(np.mean(_luma(y), axis=(0, 1)) + 0.5)
        return _blend(float(mean), y, f)

    def saturation(y, f):
        return _blend(_luma(y)[..., None].astype("float32"), y, f)

    one = {
        0: lambda y, f: _blend(0.0, y, f),
        1: contrast,
        2: saturation,
    }
    for order in ((0, 1, 2), (2, 1, 0)):
        factor = (1.25, 0.75, 0.8)
        out = augment.apply(images, _choices(2, 1, factor, order))
        for i in range(2):
            expected = solar[i]
            for k in order:
                expected = one[k](expected, factor[k])
            # PIL's blends round in fixed point: a level apart at most on
            # each step.
            np.testing.assert_allclose(out[i], expected, atol=3)
            assert np.mean(np.abs(out[i] - expected) > 1) < 0.02
    # The order matters (contrast's mean depends on the brightness).
    a = augment.apply(images, _choices(2, 1, (1.3, 0.7, 1.0), (0, 1, 2)))
    b = augment.apply(images, _choices(2, 1, (1.3, 0.7, 1.0), (1, 0, 2)))
    assert not np.array_equal(a, b)
    # color_jitter=0: no jitter whatever the factors.
    plain = data.HostThreeAugment(padding=0, color_jitter=0.0)
    np.testing.assert_array_equal(
        plain.apply(images, _choices(2, 1, (1.3, 0.7, 1.2))), solar
    )


def test_draws_value_range_threads_and_errors(rng):
    augment = data.HostThreeAugment(padding=4, color_jitter=0.3)
    draws = augment.draw(6000, np.random.default_rng(0))
    assert draws["offset"].min() == 0 and draws["offset"].max() == 8
    assert abs(draws["flip"].mean() - 0.5) < 0.02
    counts = np.bincount(draws["choice"], minlength=3) / 6000
    assert np.all(np.abs(counts - 1 / 3) < 0.02)
    assert 0.1 <= draws["radius"].min() and draws["radius"].max() <= 2.0
    assert 0.7 <= draws["factor"].min() and draws["factor"].max() <= 1.3
    np.testing.assert_array_equal(
        np.sort(draws["order"], axis=1), np.tile([0, 1, 2], (6000, 1))
    )
    # All six orders, about equally often.
    orders = draws["order"] @ np.array([9, 3, 1])
    assert len(np.unique(orders)) == 6
    images = _images(rng, 5)
    choices = augment.draw(5, np.random.default_rng(1))
    out = augment.apply(images, choices)
    threaded = data.HostThreeAugment(padding=4, workers=2)
    np.testing.assert_array_equal(threaded.apply(images, choices), out)
    scaled = data.HostThreeAugment(padding=4, value_range=(0, 1))
    np.testing.assert_allclose(
        scaled.apply(images / 255.0, choices), out / 255.0, atol=1e-6
    )
    for kwargs, name in (
        ({"padding": -1}, "padding"),
        ({"color_jitter": -0.1}, "color_jitter"),
        ({"value_range": (1, 1)}, "value_range"),
        ({"workers": 0}, "workers"),
    ):
        with pytest.raises(ValueError, match=name):
            data.HostThreeAugment(**kwargs)
    with pytest.raises(ValueError, match="RGB"):
        augment(np.zeros((2, 8, 8)), np.random.default_rng(0))
    with pytest.raises(ValueError, match="implementation"):
        data.three_augment(implementation="pil")
    # "auto" on these CPU machines: the host form.
    auto = data.three_augment()
    assert [type(t) for t in auto.host_transforms] == [data.HostThreeAugment]
