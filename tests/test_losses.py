import keras
import numpy as np
import pytest

from keras_jumbo import losses
from tests.conftest import numpy


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _kl(teacher, student, temperature=1.0):
    p = _softmax(teacher / temperature)
    q = _softmax(student / temperature)
    return (p * (np.log(p) - np.log(q))).sum(-1) * temperature**2


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_kl_matches_formula(rng, temperature):
    teacher = rng.normal(size=(5, 7)).astype("float32") * 3
    student = rng.normal(size=(5, 7)).astype("float32") * 3
    got = numpy(losses.kl_divergence_from_logits(teacher, student, temperature))
    np.testing.assert_allclose(got, _kl(teacher, student, temperature), 1e-5)
    loss = losses.FunctionMatchingKL(temperature)(teacher, student)
    np.testing.assert_allclose(
        float(loss), _kl(teacher, student, temperature).mean(), 1e-5
    )


def test_kl_equals_keras_kl_divergence(rng):
    teacher = rng.normal(size=(4, 6)).astype("float32")
    student = rng.normal(size=(4, 6)).astype("float32")
    reference = keras.losses.KLDivergence()(
        _softmax(teacher), _softmax(student)
    )
    ours = losses.FunctionMatchingKL()(teacher, student)
    np.testing.assert_allclose(float(ours), float(reference), rtol=1e-4)


def _models():
    inputs = keras.Input((8, 8, 3))
    x = keras.layers.Flatten()(inputs)
    student = keras.Model(inputs, keras.layers.Dense(4)(x))
    inputs = keras.Input((12, 12, 3))
    x = keras.layers.Conv2D(5, 3, strides=2)(inputs)
    x = keras.layers.GlobalAveragePooling2D()(x)
    teacher = keras.Model(inputs, keras.layers.Dense(4)(x))
    return student, teacher


def test_distiller_loss_uses_teacher_at_its_resolution(rng):
    student, teacher = _models()
    distiller = losses.Distiller(student, teacher)
    assert distiller.teacher_image_size == (12, 12)
    x = rng.normal(size=(6, 8, 8, 3)).astype("float32")
    resized = keras.ops.image.resize(x, (12, 12), interpolation="bilinear")
    expected = _kl(numpy(teacher(resized)), numpy(student(x))).mean()
    got = distiller.compute_loss(x=x, y_pred=distiller(x))
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    # With a label term: (1 - w) KL + w CE.
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 6)]
    mixed = losses.Distiller(student, teacher, label_loss_weight=0.25)
    ce = -(y * np.log(_softmax(numpy(student(x))))).sum(-1).mean()
    got = mixed.compute_loss(x=x, y=y, y_pred=mixed(x))
    np.testing.assert_allclose(float(got), 0.75 * expected + 0.25 * ce, 1e-5)


def test_distiller_fit_trains_student_only_and_saves(rng, tmp_path):
    student, teacher = _models()
    teacher_before = [numpy(w) for w in teacher.weights]
    distiller = losses.Distiller(student, teacher)
    distiller.compile(optimizer=keras.optimizers.Adam(1e-2))
    x = rng.normal(size=(32, 8, 8, 3)).astype("float32")
    y = np.eye(4, dtype="float32")[rng.integers(0, 4, 32)]
    history = distiller.fit(x, y, batch_size=16, epochs=5, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    for before, after in zip(teacher_before, teacher.weights, strict=True):
        np.testing.assert_array_equal(before, numpy(after))
    path = str(tmp_path / "distiller.keras")
    distiller.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(numpy(loaded(x)), numpy(distiller(x)), 1e-6)
    assert loaded.teacher_image_size == (12, 12)


def test_distiller_errors():
    student, teacher = _models()
    with pytest.raises(TypeError, match="teacher"):
        losses.Distiller(student, "deit3")
    with pytest.raises(ValueError, match="temperature"):
        losses.Distiller(student, teacher, temperature=0)
    with pytest.raises(ValueError, match="label_loss_weight"):
        losses.Distiller(student, teacher, label_loss_weight=1.5)
    with pytest.raises(ValueError, match="teacher_image_size"):
        losses.Distiller(student, teacher, teacher_image_size=(1, 2, 3))
