import keras
import numpy as np
import pytest

from keras_jumbo.callbacks import TokenDropSchedule
from keras_jumbo.callbacks import set_token_drop_rate
from keras_jumbo.callbacks import token_dropping_layers
from keras_jumbo.models import JumboViT


class RecordRates(keras.callbacks.Callback):
    """Reads the layer's rate inside each step (after the schedule set it)."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(token_dropping_layers(self.model)[0].rate)


def test_schedule_is_linear_from_start_to_end():
    schedule = TokenDropSchedule(0.9, 0.1)
    rates = [schedule.rate_at(step, 5) for step in range(5)]
    np.testing.assert_allclose(rates, [0.9, 0.7, 0.5, 0.3, 0.1])


def test_schedule_drives_token_dropping_in_fit():
    model = JumboViT(
        "pico",
        hidden_dim=16,
        num_heads=2,
        depth=1,
        image_size=16,
        patch_size=4,
        num_classes=3,
        jumbo_multiplier=2,
    )
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = np.random.default_rng(0).normal(size=(8, 16, 16, 3)).astype("float32")
    y = np.arange(8) % 3
    record = RecordRates()
    schedule = TokenDropSchedule(0.75, 0.25)
    history = model.fit(
        x, y, batch_size=2, epochs=2, verbose=0, callbacks=[schedule, record]
    )
    expected = [0.75 + (0.25 - 0.75) * step / 7 for step in range(8)]
    np.testing.assert_allclose(record.rates, expected)
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["token_drop_rate"][-1] == pytest.approx(0.25)
    # Inference never drops tokens, whatever the rate.
    assert model.predict(x, verbose=0).shape == (8, 3)


def test_set_token_drop_rate_and_errors():
    model = JumboViT(
        "pico",
        hidden_dim=8,
        num_heads=2,
        depth=1,
        image_size=8,
        patch_size=4,
        num_classes=2,
        jumbo_multiplier=1,
    )
    assert set_token_drop_rate(model, 0.5)  # 4 -> 2 kept tokens
    assert token_dropping_layers(model)[0].rate == 0.5
    with pytest.raises(ValueError, match="start"):
        TokenDropSchedule(1.5, 0.1)
    with pytest.raises(ValueError, match="total_steps"):
        TokenDropSchedule(0.9, 0.1, total_steps=0)


def test_token_drop_schedule_resumes_from_optimizer_step():
    import keras

    from keras_jumbo.callbacks import TokenDropSchedule
    from keras_jumbo.models import JumboViT

    model = JumboViT(
        "pico",
        num_classes=3,
        image_size=16,
        patch_size=4,
        depth=1,
        token_drop_rate=0.9,
    )
    model.compile(optimizer="adamw", loss="mse")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(5)
    schedule = TokenDropSchedule(0.9, 0.1, total_steps=11)
    schedule.set_model(model)
    schedule.on_train_begin()
    assert abs(schedule.rate - 0.5) < 1e-9  # step 5 of 0..10
    assert keras.ops.convert_to_numpy(model.optimizer.iterations) == 5
