import os

import keras
import numpy as np
import pytest

from keras_jumbo import optimizers
from keras_jumbo import schedules


def _variables(seed):
    rng = np.random.default_rng(seed)
    shapes = {"kernel": (5, 3), "bias": (3,), "embed": (2, 4)}
    return [
        keras.Variable(rng.normal(size=shape).astype("float32"), name=name)
        for name, shape in shapes.items()
    ]


def _grads(rng, variables):
    # Mixed magnitudes, so epsilon and the bias corrections matter.
    return [
        keras.ops.convert_to_tensor(
            (rng.normal(size=v.shape) * 10.0 ** rng.integers(-6, 1)).astype(
                "float32"
            )
        )
        for v in variables
    ]


def _run(optimizer, steps=6):
    variables = _variables(0)
    optimizer.exclude_from_weight_decay(var_names=["bias"])
    optimizer.build(variables)
    rng = np.random.default_rng(1)
    for _ in range(steps):
        optimizer.apply(_grads(rng, variables), variables)
    return [keras.ops.convert_to_numpy(v) for v in variables] + [
        keras.ops.convert_to_numpy(v) for v in optimizer.variables
    ]


def _pair(amsgrad, scheduled):
    def make(cls):
        learning_rate = 3e-2
        if scheduled:
            learning_rate = schedules.warmup_cosine(
                3e-2, total_steps=10, warmup_fraction=0.2
            )
        return cls(
            learning_rate,
            weight_decay=0.1,
            beta_1=0.8,
            beta_2=0.95,
            epsilon=1e-4,
            amsgrad=amsgrad,
        )

    return make(optimizers.AdamW), make(keras.optimizers.AdamW)


@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("scheduled", [False, True])
def test_adamw_equals_keras_adamw(amsgrad, scheduled):
    """Variables and every slot (momenta, velocities, AMSGrad maxima,
    iterations) after six steps; the bias is excluded from the decay."""
    ours, reference = _pair(amsgrad, scheduled)
    got, want = _run(ours), _run(reference)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)
    # The decay changed the kernel: not an identity-like comparison.
    assert not np.allclose(got[0], _variables(0)[0].numpy(), atol=1e-2)


def test_adamw_fused_kernel_only_on_eager_torch(monkeypatch):
    calls = []
    fused = optimizers._torch_fused_adamw

    def counting():
        calls.append(1)
        return fused()

    monkeypatch.setattr(optimizers, "_torch_fused_adamw", counting)
    ours, reference = _pair(amsgrad=False, scheduled=False)
    got, want = _run(ours, steps=3), _run(reference, steps=3)
    on_torch = keras.backend.backend() == "torch"
    assert len(calls) == (3 if on_torch else 0)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)
    if on_torch:
        # Inside torch.compile: Keras' own update, same numbers.
        monkeypatch.setattr(optimizers, "_torch_compiling", lambda: True)
        calls.clear()
        ours, _ = _pair(amsgrad=False, scheduled=False)
        got = _run(ours, steps=3)
        assert not calls
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-7)


def _model():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.LayerNormalization(),
            keras.layers.Dense(8, activation="gelu"),
            keras.layers.Dense(3),
        ]
    )


def test_adamw_fit_equals_keras_adamw_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype("float32")
    y = rng.integers(0, 3, size=(40,))
    models = []
    for cls in (optimizers.AdamW, keras.optimizers.AdamW):
        model = _model()
        model.compile(
            optimizer=cls(1e-2, weight_decay=0.05, global_clipnorm=1.0),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(x, y, batch_size=8, epochs=2, verbose=0)
        models.append(model)
    for a, b in zip(models[0].weights, models[1].weights, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)

    path = os.path.join(tmp_path, "model.keras")
    models[0].save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.optimizer) is optimizers.AdamW
    assert loaded.optimizer.get_config() == models[0].optimizer.get_config()
    assert int(loaded.optimizer.iterations.numpy()) == 10
    for a, b in zip(
        loaded.optimizer.variables, models[0].optimizer.variables, strict=True
    ):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    config = keras.optimizers.serialize(models[0].optimizer)
    assert config["registered_name"] == "keras_jumbo>AdamW"
    assert type(keras.optimizers.deserialize(config)) is optimizers.AdamW
