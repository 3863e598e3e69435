import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_jumbo import schedules

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def _values(schedule, steps):
    return np.array(
        [float(keras.ops.convert_to_numpy(schedule(step))) for step in steps]
    )


@pytest.mark.parametrize(
    "config",
    [
        dict(initial_learning_rate=0.0, decay_steps=900, warmup_steps=100),
        dict(initial_learning_rate=1e-5, decay_steps=37, warmup_steps=3),
        dict(initial_learning_rate=0.0, decay_steps=50, warmup_steps=0),
    ],
)
def test_warmup_cosine_decay_equals_keras_cosine_decay(config):
    """Every step, including the warm-up boundary and past the end."""
    config = dict(config, alpha=0.013, warmup_target=2e-3)
    ours = schedules.WarmupCosineDecay(**config)
    keras_version = keras.optimizers.schedules.CosineDecay(**config)
    total = config["decay_steps"] + config["warmup_steps"]
    steps = sorted(set(range(0, total + 5, 7)) | {0, 1, 99, 100, 101, total})
    np.testing.assert_allclose(
        _values(ours, steps), _values(keras_version, steps), rtol=1e-6
    )
    # Also for the step as a tensor, as the optimizer passes it.
    step = keras.ops.convert_to_tensor(config["warmup_steps"] + 1, "int64")
    np.testing.assert_allclose(
        float(keras.ops.convert_to_numpy(ours(step))),
        float(keras.ops.convert_to_numpy(keras_version(step))),
        rtol=1e-6,
    )


def test_warmup_cosine_returns_the_where_form_and_round_trips():
    schedule = schedules.warmup_cosine(1e-3, 1000, 0.1, 1e-5)
    assert isinstance(schedule, schedules.WarmupCosineDecay)
    optimizer = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(keras.optimizers.AdamW(schedule))
    )
    restored = keras.saving.deserialize_keras_object(
        optimizer.get_config()["learning_rate"]
    )
    assert isinstance(restored, schedules.WarmupCosineDecay)
    steps = [0, 50, 100, 550, 1000, 1200]
    np.testing.assert_allclose(
        _values(restored, steps), _values(schedule, steps)
    )


def test_warmup_cosine_decay_needs_a_warmup_target():
    with pytest.raises(ValueError, match="warmup_target=None"):
        schedules.WarmupCosineDecay(1e-3, decay_steps=10)


_TRACE = """
import torch
from keras_jumbo import schedules
schedule = schedules.warmup_cosine(1e-3, 1000, 0.1, 1e-5)
explained = torch._dynamo.explain(schedule)(torch.tensor(150))
print(explained.graph_count, explained.graph_break_count)
"""


@pytest.mark.once
def test_warmup_cosine_decay_traces_to_one_graph_under_torch_compile():
    """The reason for the class: Keras' `ops.cond` version breaks the graph
    under `torch.compile` (it creates a `Cond` operation while traced)."""
    env = dict(os.environ, KERAS_BACKEND="torch", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-c", _TRACE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["1", "0"]
