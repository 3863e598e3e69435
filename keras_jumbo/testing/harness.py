import os
import tempfile

import keras
import numpy as np


def _numpy(x):
    return keras.ops.convert_to_numpy(x)


def assert_allclose(actual, expected, atol=1e-5, rtol=1e-5, msg=""):
    """`np.testing.assert_allclose` for backend tensors and numpy arrays."""
    np.testing.assert_allclose(
        _numpy(actual), _numpy(expected), atol=atol, rtol=rtol, err_msg=msg
    )


def randomize_weights(model_or_layer, seed=0, scale=0.5):
    """Give every weight random values, so equivalence tests mean something.

    Identity-like initial weights (LayerNorm gamma=1/beta=0, zero heads,
    zero LoRA up-projections, LayerScale constants) hide bugs: a test that
    passes with them may fail with trained weights. Scales (gamma-like
    weights) become `1 + N(0, scale)`, BatchNorm moving variances
    `|1 + N(0, scale)|`, everything else `N(0, scale)` divided by
    sqrt(fan-in) for kernels.
    """
    rng = np.random.default_rng(seed)
    for variable in model_or_layer.weights:
        shape = tuple(variable.shape)
        name = variable.path.split("/")[-1]
        values = rng.normal(0.0, scale, size=shape)
        if name in ("gamma", "scale"):
            values = 1.0 + values
        elif name == "moving_variance":  # must stay positive
            values = np.abs(1.0 + values)
        elif len(shape) >= 2:
            values = values / np.sqrt(max(1, int(np.prod(shape[:-1]))))
        variable.assign(values.astype(variable.dtype))
    return model_or_layer


def _is_multi(input_shape):
    return isinstance(input_shape, list)


def _symbolic(input_shape):
    if _is_multi(input_shape):
        return [keras.KerasTensor(s) for s in input_shape]
    return keras.KerasTensor(input_shape)


def _random(rng, input_shape):
    if _is_multi(input_shape):
        return [rng.normal(size=s).astype("float32") for s in input_shape]
    return rng.normal(size=input_shape).astype("float32")


def _wrap(layer, input_shape, call_kwargs=None):
    if _is_multi(input_shape):
        inputs = [keras.Input(batch_shape=s) for s in input_shape]
    else:
        inputs = keras.Input(batch_shape=input_shape)
    outputs = layer(inputs, **(call_kwargs or {}))
    return keras.Model(inputs, outputs)


def _save_and_reload(model):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        return keras.saving.load_model(path)


def trainable_weight_changes(model, x, y, loss="mse", steps=1):
    """Paths of trainable weights that did / did not change in a fit step.

    A weight changes under Adam exactly when it received a non-zero
    gradient, so this checks "every weight gets a gradient" on every
    backend without backend-specific autodiff code.
    """
    before = [_numpy(v).copy() for v in model.trainable_weights]
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=loss)
    model.fit(x, y, batch_size=len(x), epochs=steps, verbose=0)
    changed, unchanged = [], []
    for variable, old in zip(model.trainable_weights, before, strict=True):
        moved = not np.array_equal(_numpy(variable), old)
        (changed if moved else unchanged).append(variable.path)
    return changed, unchanged


def run_layer_test(
    layer_cls,
    init_kwargs,
    input_shape,
    expected_output_shape,
    expected_num_trainable_weights=None,
    expected_num_non_trainable_weights=0,
    call_kwargs=None,
    run_training_check=True,
    run_mixed_precision_check=True,
    run_save_check=True,
    seed=0,
):
    """The checks every public keras_jumbo layer passes.

    `input_shape` is a shape tuple, or a list of them for layers taking a
    list of inputs.

    1. Config round trip: `from_config(get_config())` has the same config,
       and the layer survives `keras.saving.serialize/deserialize`.
    2. Weight counts after `build`.
    3. Symbolic call and `compute_output_shape` give `expected_output_shape`
       (the batch axis as given in `input_shape`).
    4. Eager call on random data gives that shape and finite values.
    5. One `fit` step on a model wrapping the layer runs and is finite.
    6. Mixed precision (`mixed_bfloat16`): runs, outputs bfloat16, finite.
    7. `.keras` save/load of the wrapping model gives identical outputs.
    """
    rng = np.random.default_rng(seed)
    call_kwargs = call_kwargs or {}
    # One output shape, or a tuple of them for a layer returning a tuple.
    multi_output = isinstance(expected_output_shape[0], (tuple, list))
    if multi_output:
        expected_output_shape = tuple(tuple(s) for s in expected_output_shape)
    else:
        expected_output_shape = tuple(expected_output_shape)

    def shapes(outputs):
        if multi_output:
            return tuple(tuple(o.shape) for o in outputs)
        return tuple(outputs.shape)

    def each(outputs):
        return list(outputs) if multi_output else [outputs]

    layer = layer_cls(**init_kwargs)
    config = layer.get_config()
    rebuilt = layer_cls.from_config(config)
    assert rebuilt.get_config() == config, (config, rebuilt.get_config())
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(layer)
    )
    assert type(restored) is layer_cls
    assert restored.get_config() == config

    layer = layer_cls(**init_kwargs)
    layer.build(input_shape)
    if expected_num_trainable_weights is not None:
        got = len(layer.trainable_weights)
        assert got == expected_num_trainable_weights, (
            f"{layer_cls.__name__}: {got} trainable weights, expected "
            f"{expected_num_trainable_weights}"
        )
    got = len(layer.non_trainable_weights)
    assert got == expected_num_non_trainable_weights, (
        f"{layer_cls.__name__}: {got} non-trainable weights, expected "
        f"{expected_num_non_trainable_weights}"
    )

    symbolic = layer_cls(**init_kwargs)
    out = symbolic(_symbolic(input_shape), **call_kwargs)
    assert shapes(out) == expected_output_shape, shapes(out)
    computed = symbolic.compute_output_shape(input_shape)
    if multi_output:
        computed = tuple(tuple(s) for s in computed)
    assert tuple(computed) == expected_output_shape, computed

    x = _random(rng, input_shape)
    eager = layer_cls(**init_kwargs)
    y = eager(x, **call_kwargs)
    assert shapes(y) == expected_output_shape, shapes(y)
    for value in each(y):
        assert np.all(np.isfinite(_numpy(value)))

    model = _wrap(layer_cls(**init_kwargs), input_shape, call_kwargs)
    if run_training_check:
        model.compile(optimizer="sgd", loss="mse")
        targets = [
            rng.normal(size=s).astype("float32")
            for s in (
                expected_output_shape
                if multi_output
                else [expected_output_shape]
            )
        ]
        target = tuple(targets) if multi_output else targets[0]
        batch = targets[0].shape[0]
        history = model.fit(x, target, batch_size=batch, verbose=0)
        assert np.isfinite(history.history["loss"][-1])

    if run_mixed_precision_check:
        mixed = layer_cls(**init_kwargs, dtype="mixed_bfloat16")
        for value in each(mixed(x, **call_kwargs)):
            assert keras.backend.standardize_dtype(value.dtype) == "bfloat16"
            assert np.all(np.isfinite(_numpy(keras.ops.cast(value, "float32"))))

    if run_save_check:
        reloaded = _save_and_reload(model)
        for got, want in zip(each(reloaded(x)), each(model(x)), strict=True):
            assert_allclose(got, want, atol=0, rtol=0)
    return model


def run_model_test(model, inputs, loss="mse", check_gradients=True):
    """The checks every registered model passes (tiny configs).

    Randomises every weight first (zero heads would stop gradients), then:
    forward is finite; `.keras` save/load gives the same class back and
    reproduces the outputs exactly; one training step moves every trainable
    weight (every weight gets a gradient).
    """
    randomize_weights(model)
    outputs = model(inputs)
    values = _numpy(outputs)
    assert np.all(np.isfinite(values)), "non-finite forward output"
    reloaded = _save_and_reload(model)
    assert type(reloaded) is type(model), (type(reloaded), type(model))
    assert_allclose(reloaded(inputs), outputs, atol=0, rtol=0)
    if check_gradients:
        target = np.random.default_rng(1).normal(size=values.shape)
        changed, unchanged = trainable_weight_changes(
            model, inputs, target.astype("float32"), loss=loss
        )
        assert not unchanged, f"weights with no gradient: {unchanged}"
        assert np.all(np.isfinite(_numpy(model(inputs))))
    return model
