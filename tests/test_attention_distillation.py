"""Attention-map distillation (Non-Deep ViT §4) and the models'
`forward_with_attention_maps`."""

import keras
import numpy as np
import pytest

from keras_jumbo import losses
from keras_jumbo import models
from keras_jumbo.testing import randomize_weights
from tests.conftest import numpy
from tests.layers import reference

SMALL = dict(image_size=16, patch_size=4, num_classes=5)


def _models():
    return {
        "vit": models.ViT("pico", depth=2, **SMALL),
        "registers": models.RegistersViT(
            "pico", depth=2, num_registers=2, **SMALL
        ),
        "jumbo": models.JumboViT("pico", depth=2, **SMALL),
        "non_deep": models.NonDeepViT(
            2,
            2,
            hidden_dim=24,
            num_heads=3,
            initial_lambda=0.4,
            diversity_weight=0.0,  # its own loss would join `losses`
            **SMALL,
        ),
    }


@pytest.mark.parametrize("name", ["vit", "registers", "jumbo", "non_deep"])
def test_forward_with_attention_maps_is_the_models_forward(rng, name):
    model = _models()[name]
    randomize_weights(model)
    x = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    outputs, maps = model.forward_with_attention_maps(x, blocks=(0, -1))
    np.testing.assert_allclose(numpy(outputs), numpy(model(x)), atol=1e-6)
    # Block by block: the maps are each block's maps of its own input.
    tokens = model._embed(x)
    expected = []
    for block in model.blocks:
        expected.append(block.attention_maps(tokens))
        tokens = model._run_block(block, tokens)
    for got, want in zip(maps, (expected[0], expected[-1]), strict=True):
        np.testing.assert_allclose(numpy(got), numpy(want), atol=1e-6)
        np.testing.assert_allclose(numpy(got).sum(-1), 1.0, atol=1e-5)
    if name != "non_deep":
        # The plain ViT block: softmax(q k^T / sqrt(d)) of LN1(tokens).
        first = model.blocks[0]
        normed = reference.norm(numpy(model._embed(x)), first.norm1)
        np.testing.assert_allclose(
            numpy(maps[0]),
            reference.attention(normed, first.attention, return_maps=True),
            atol=1e-5,
        )


def test_forward_with_attention_maps_errors(rng):
    model = _models()["vit"]
    x = np.zeros((1, 16, 16, 3), "float32")
    with pytest.raises(ValueError, match="out of range"):
        model.forward_with_attention_maps(x, blocks=(2,))
    with pytest.raises(TypeError, match="blocks"):
        model.forward_with_attention_maps(x, blocks=("last",))
    with pytest.raises(ValueError, match="shape"):
        model.forward_with_attention_maps(np.zeros((1, 20, 20, 3)))


def test_attention_map_loss_is_squared_error_summed_over_keys(rng):
    a = rng.uniform(size=(2, 3, 4, 4)).astype("float32")
    b = rng.uniform(size=(2, 3, 4, 4)).astype("float32")
    c = rng.uniform(size=(2, 3, 4, 4)).astype("float32")
    expected = (
        ((a - b) ** 2).sum(-1).mean() + ((c - a) ** 2).sum(-1).mean()
    ) / 2
    got = losses.attention_map_loss([a, c], [b, a])
    np.testing.assert_allclose(float(got), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="one teacher map per student"):
        losses.attention_map_loss([a], [a, b])
    with pytest.raises(ValueError, match="same"):
        losses.attention_map_loss([a], [a[:, :2]])


def test_distiller_adds_the_weighted_map_loss_in_training_only(rng):
    teacher = _models()["vit"]  # class token: 17 tokens, 3 heads
    student = _models()["non_deep"]  # no class token: 16 tokens, 3 heads
    randomize_weights(teacher)
    randomize_weights(student, seed=1)
    distiller = losses.AttentionMapDistiller(
        student,
        teacher,
        student_blocks=(0, 1),
        teacher_blocks=(1, 0),
        weight=3.0,
    )
    x = rng.normal(size=(2, 16, 16, 3)).astype("float32")
    outputs = distiller(x, training=True)
    np.testing.assert_allclose(numpy(outputs), numpy(student(x)), atol=1e-6)
    _, teacher_maps = teacher.forward_with_attention_maps(x, (1, 0))
    _, student_maps = student.forward_with_attention_maps(x, (0, 1))
    # The teacher's class-token row and column are left out.
    expected = np.mean(
        [
            ((numpy(s) - numpy(t)[..., 1:, 1:]) ** 2).sum(-1).mean()
            for t, s in zip(teacher_maps, student_maps, strict=True)
        ]
    )
    assert len(distiller.losses) == 1
    np.testing.assert_allclose(
        float(numpy(distiller.losses[0])), 3.0 * expected, rtol=1e-4
    )
    distiller(x, training=False)
    assert not distiller.losses
    assert not teacher.trainable


def test_distiller_trains_saves_and_reloads(rng, tmp_path):
    teacher = _models()["vit"]
    randomize_weights(teacher)
    student = _models()["non_deep"]
    distiller = losses.AttentionMapDistiller(student, teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True),
    )
    x = rng.normal(size=(8, 16, 16, 3)).astype("float32")
    y = keras.utils.to_categorical(rng.integers(0, 5, 8), 5)
    _, before = distiller.distillation_loss(x)
    distiller.fit(x, y, epochs=15, batch_size=8, verbose=0)
    _, after = distiller.distillation_loss(x)
    assert float(numpy(after)) < float(numpy(before))
    path = str(tmp_path / "distiller.keras")
    distiller.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.student_blocks == [-1] and loaded.weight == 1.0
    np.testing.assert_allclose(
        numpy(loaded.predict(x, verbose=0)),
        numpy(distiller.predict(x, verbose=0)),
        atol=1e-5,
    )


def test_distiller_errors():
    ms = _models()
    with pytest.raises(TypeError, match="teacher"):
        losses.AttentionMapDistiller(ms["vit"], keras.Sequential())
    with pytest.raises(ValueError, match="heads"):
        losses.AttentionMapDistiller(
            models.NonDeepViT(2, 2, hidden_dim=16, num_heads=4, **SMALL),
            ms["vit"],
        )
    with pytest.raises(ValueError, match="patch grid"):
        losses.AttentionMapDistiller(
            ms["non_deep"],
            models.ViT(
                "pico", depth=2, image_size=32, patch_size=4, num_classes=5
            ),
        )
    with pytest.raises(ValueError, match="weight"):
        losses.AttentionMapDistiller(ms["non_deep"], ms["vit"], weight=0)
    with pytest.raises(ValueError, match="pair"):
        losses.AttentionMapDistiller(
            ms["non_deep"], ms["vit"], student_blocks=(0, 1)
        )
