"""A model called at another input size says so, the same way on every
backend, and stays usable (issue #17: JAX silently cropped or resampled)."""

import re

import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights


def tiny_jumbo():
    model = models.JumboViT(
        "pico", num_classes=10, image_size=32, patch_size=8, depth=2
    )
    randomize_weights(model)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


@pytest.mark.parametrize("size", [36, 48])
def test_other_image_size_is_refused_everywhere(size):
    model = tiny_jumbo()
    good = np.random.default_rng(0).normal(size=(4, 32, 32, 3))
    good = good.astype("float32")
    before = model.predict(good, verbose=0)
    bad = np.zeros((4, size, size, 3), "float32")
    labels = np.zeros((4,), "int32")
    message = (
        rf"takes inputs of shape \(None, 32, 32, 3\)\. Received: input of "
        rf"shape \(4, {size}, {size}, 3\).*with_image_size"
    )
    calls = {
        "call": lambda: model(bad),
        "predict": lambda: model.predict(bad, verbose=0),
        "fit": lambda: model.fit(bad, labels, verbose=0),
        "evaluate": lambda: model.evaluate(bad, labels, verbose=0),
        "validation_data": lambda: model.fit(
            good, labels, validation_data=(bad, labels), verbose=0
        ),
        "train_on_batch": lambda: model.train_on_batch(bad, labels),
        "predict_on_batch": lambda: model.predict_on_batch(bad),
    }
    for name, call in calls.items():
        try:
            call()
        except ValueError as error:
            assert re.search(message, str(error)), (name, str(error))
        else:
            raise AssertionError(f"{name} accepted {size} px images")
    # Nothing was traced with the bad shape: the model still works.
    assert_allclose(model.predict(good, verbose=0), before, atol=1e-6)


def test_tf_data_element_spec_is_checked():
    import tensorflow as tf  # part of every CI pass (tensorflow-cpu)

    model = tiny_jumbo()
    images = np.zeros((4, 40, 40, 3), "float32")
    data = tf.data.Dataset.from_tensor_slices(
        (images, np.zeros((4,), "int32"))
    ).batch(2)
    with pytest.raises(ValueError, match=r"\(None, 40, 40, 3\)"):
        model.fit(data, verbose=0)


def test_time_series_model_refuses_another_length():
    model = models.PatchTSTClassifier(
        3, 48, 2, hidden_dim=16, num_heads=2, depth=1, mlp_dim=32
    )
    with pytest.raises(ValueError, match=r"\(None, 48, 2\).*\(2, 40, 2\)"):
        model.predict(np.zeros((2, 40, 2), "float32"), verbose=0)
    with pytest.raises(ValueError, match=r"\(2, 48, 3\)"):
        model(np.zeros((2, 48, 3), "float32"))


def test_reload_uses_the_loading_backends_compile_default(tmp_path):
    """jit_compile=True (what the recipes use on JAX) is not carried into
    another backend: a reloaded model compiles with "auto"."""
    import keras

    model = tiny_jumbo()
    model.compile(
        optimizer="adam",
        loss="sparse_categorical_crossentropy",
        jit_compile=True,
    )
    model.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    fresh = tiny_jumbo()
    fresh.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    assert reloaded.jit_compile == fresh.jit_compile
    assert reloaded.optimizer.__class__.__name__ == "Adam"
    x = np.zeros((2, 32, 32, 3), "float32")
    assert_allclose(reloaded.predict(x, verbose=0), model(x))
