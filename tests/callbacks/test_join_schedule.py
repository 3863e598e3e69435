import math

import keras
import numpy as np
import pytest

from keras_jumbo.callbacks import JoinSchedule
from keras_jumbo.callbacks import join_lambda_at
from keras_jumbo.convert import join_layers
from keras_jumbo.models import NonDeepViT


@pytest.mark.parametrize(
    "schedule,fn",
    [
        ("linear", lambda t: t),
        ("cosine", lambda t: 0.5 * (1 - math.cos(math.pi * t))),
        ("exponential", lambda t: 1 - math.exp(-5 * t)),
        ("sqrt", math.sqrt),
    ],
)
def test_schedules_follow_appendix_b2(schedule, fn):
    for step in (0, 250, 500, 999):
        assert join_lambda_at(schedule, step, 1000) == pytest.approx(
            fn(step / 1000)
        )
    assert join_lambda_at(schedule, 1000, 1000) == 1.0
    assert join_lambda_at(schedule, 5000, 1000) == 1.0  # adjustment phase


def test_instant_and_no_joining():
    assert join_lambda_at("instant", 0, 1000) == 1.0
    assert join_lambda_at("none", 10**6, 1000) == 0.0


class Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        layer = join_layers(self.model)[0]
        self.model.jax_state_sync() if hasattr(
            self.model, "jax_state_sync"
        ) else None
        self.seen.append(float(keras.ops.convert_to_numpy(layer.join_lambda)))


def test_callback_sets_lambda_each_step_and_resumes_from_iterations():
    model = NonDeepViT(
        1,
        2,
        hidden_dim=8,
        num_heads=2,
        image_size=8,
        patch_size=4,
        num_classes=2,
        diversity_weight=0.0,
    )
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x = np.zeros((8, 8, 8, 3), "float32")
    y = np.zeros((8,), "int32")
    record = Record()
    model.fit(
        x,
        y,
        batch_size=2,
        epochs=1,
        verbose=0,
        callbacks=[JoinSchedule("linear", 8), record],
    )
    np.testing.assert_allclose(record.seen, [0.0, 0.125, 0.25, 0.375])
    # A second fit continues from optimizer.iterations (= 4).
    record2 = Record()
    model.fit(
        x,
        y,
        batch_size=2,
        epochs=1,
        verbose=0,
        callbacks=[JoinSchedule("linear", 8), record2],
    )
    np.testing.assert_allclose(record2.seen, [0.5, 0.625, 0.75, 0.875])


def test_join_schedule_errors():
    with pytest.raises(ValueError, match="schedule"):
        JoinSchedule("quadratic")
    with pytest.raises(ValueError, match="warmup_steps"):
        JoinSchedule("linear", -1)
    with pytest.raises(ValueError, match="update_every"):
        JoinSchedule("linear", 10, update_every=0)
