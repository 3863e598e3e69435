"""`_keras_internals.call_sublayer`: a block's sublayer called without
`Layer.__call__` on eager PyTorch, only when that changes nothing."""

import keras
import numpy as np
import pytest

from keras_jumbo import _keras_internals
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import LayerNormalization
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights

ON_TORCH = keras.backend.backend() == "torch"
# A tiny ViT model class (16 px, two 8-px patches a side).
TINY_VIT = dict(
    image_size=16, patch_size=8, hidden_dim=8, depth=2, num_heads=2,
    num_classes=3,
)  # fmt: skip
DIRECT_CALL_OK = _keras_internals._direct_call_ok


def _x(shape=(2, 5, 8), dtype="float32"):
    rng = np.random.default_rng(0)
    return keras.ops.convert_to_tensor(rng.normal(size=shape).astype(dtype))


def _norm(**kwargs):
    norm = LayerNormalization(**kwargs)
    norm.build((2, 5, 8))
    randomize_weights(norm, seed=1)
    return norm


def test_direct_call_only_for_a_built_float_layer_on_torch():
    x = _x()
    norm = _norm()
    assert _keras_internals._direct_call_ok(norm, x) == ON_TORCH
    assert not _keras_internals._direct_call_ok(LayerNormalization(), x)
    # An input of another dtype: `__call__` casts it first.
    assert not _keras_internals._direct_call_ok(norm, _x(dtype="float16"))
    # Mixed precision outside an autocast scope: `__call__` opens one.
    mixed = _norm(dtype="mixed_float16")
    assert not _keras_internals._direct_call_ok(mixed, _x(dtype="float16"))
    # A float tensor argument of another dtype: `__call__` casts it.
    assert not _keras_internals._direct_call_ok(norm, x, (_x(dtype="float16"),))
    assert not _keras_internals._direct_call_ok(
        norm, x, (), {"extra": [np.ones(3)]}
    )
    assert (
        _keras_internals._direct_call_ok(
            norm, x, (_x(dtype="int32"),), {"training": True, "extra": [x]}
        )
        == ON_TORCH
    )
    # A quantised layer: `__call__` routes to `quantized_call`.
    dense = keras.layers.Dense(4)
    dense.build((2, 5, 8))
    dense.quantize("int8")
    assert not _keras_internals._direct_call_ok(dense, x)
    for layer, inputs in ((norm, x), (mixed, _x(dtype="float16")), (dense, x)):
        assert_allclose(
            _keras_internals.call_sublayer(layer, inputs),
            layer(inputs),
            atol=1e-6,
        )
    # `training` for a layer whose call takes none is dropped, as Keras
    # drops it.
    assert_allclose(
        _keras_internals.call_sublayer(norm, x, training=True), norm(x)
    )


def test_torch_module_hooks_still_run():
    norm = _norm()
    x = _x()
    seen = []
    if ON_TORCH:
        handle = norm.register_forward_hook(
            lambda module, args, output: seen.append(output)
        )
        assert not _keras_internals._direct_call_ok(norm, x)
        out = _keras_internals.call_sublayer(norm, x)
        handle.remove()
        assert len(seen) == 1 and seen[0] is out
        assert _keras_internals._direct_call_ok(norm, x)
    assert_allclose(_keras_internals.call_sublayer(norm, x), norm(x))


def _outputs_with_and_without_direct_calls(monkeypatch, block, call):
    direct = []

    def counting(layer, inputs, *rest):
        ok = DIRECT_CALL_OK(layer, inputs, *rest)
        direct.append(ok)
        return ok

    monkeypatch.setattr(_keras_internals, "_direct_call_ok", counting)
    fast = call(block)
    assert any(direct) == ON_TORCH
    monkeypatch.setattr(_keras_internals, "_direct_call_ok", lambda *a: False)
    slow = call(block)
    return fast, slow


def test_blocks_give_the_same_outputs_either_way(monkeypatch):
    """A Jumbo block (attention, two norms, patch and Jumbo FFNs, all with
    random weights), a pre-norm PatchTST block with LayerNorm (which takes
    no `training`) and a PatchTST block with BatchNorm in training mode
    (its moving statistics update through the direct call too)."""
    x = _x((2, 6, 8))
    jumbo = JumboBlock(
        num_heads=2, mlp_dim=16, jumbo_multiplier=2, jumbo_mlp_dim=24
    )
    jumbo.build(x.shape)
    randomize_weights(jumbo, seed=2)
    fast, slow = _outputs_with_and_without_direct_calls(
        monkeypatch, jumbo, lambda block: block(x, training=False)
    )
    assert_allclose(fast, slow, atol=1e-6)

    layer_norm = PatchTSTEncoderBlock(
        num_heads=2, mlp_dim=16, normalization="layer_norm", norm_first=True
    )
    layer_norm.build(x.shape)
    randomize_weights(layer_norm, seed=4)
    fast, slow = _outputs_with_and_without_direct_calls(
        monkeypatch, layer_norm, lambda block: block(x, training=True)
    )
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a, b, atol=1e-6)

    patchtst = PatchTSTEncoderBlock(
        num_heads=2, mlp_dim=16, normalization="batch_norm"
    )
    patchtst.build(x.shape)
    randomize_weights(patchtst, seed=3)
    start = [v.numpy() for v in patchtst.non_trainable_weights]

    def train_call(block):
        for v, value in zip(block.non_trainable_weights, start, strict=True):
            v.assign(value)
        out, scores = block(x, training=True)
        return [out, scores] + [v.numpy() for v in block.non_trainable_weights]

    fast, slow = _outputs_with_and_without_direct_calls(
        monkeypatch, patchtst, train_call
    )
    assert not np.allclose(fast[2], start[0])  # the statistics moved
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("use_bias", [True, False])
def test_dense_weights_are_the_layers_kernel_and_bias(use_bias):
    """For a built float `Dense` (no quantisation, no LoRA), the variables
    its `kernel` / `bias` properties give, and the layer's output is
    `x @ kernel + bias` with them."""
    layer = keras.layers.Dense(5, use_bias=use_bias)
    x = _x((2, 3, 4))
    layer.build(x.shape)
    randomize_weights(layer, seed=5)
    kernel, bias = _keras_internals.dense_weights(layer)
    assert kernel is layer.kernel
    assert bias is layer.bias
    expected = keras.ops.matmul(x, kernel)
    if use_bias:
        expected = expected + bias
    assert_allclose(layer(x), expected, atol=1e-6)


def test_models_call_their_layers_directly(monkeypatch):
    """A model class's call on PyTorch runs the layers of its graph
    through `call_sublayer` (`CallsLayersDirectly`): the same outputs as
    Keras' own functional call, at inference and in training (dropout,
    drop path, token dropping and the head's dropout drawn alike from the
    same seed: the model's `training` reaches every layer), and with
    `predict_on_batch`. Elsewhere Keras' own call runs (the same
    outputs, trivially)."""
    from keras_jumbo import models

    model = models.JumboViT(
        **TINY_VIT, jumbo_multiplier=2, dropout_rate=0.2,
        drop_path_rate=0.3, head_dropout_rate=0.5, token_drop_rate=0.25,
    )  # fmt: skip
    randomize_weights(model, seed=6)
    x = _x((3, 16, 16, 3))
    direct = []
    ok = _keras_internals._direct_call_ok

    def counting(layer, inputs, *rest):
        result = ok(layer, inputs, *rest)
        direct.append((layer, result))
        return result

    def outputs():
        results = [model(x, training=False), model.predict_on_batch(x)]
        if ON_TORCH:  # unseeded dropout draws from torch's generator
            keras.utils.set_random_seed(7)
            results.append(model(x, training=True))
        return [keras.ops.convert_to_numpy(r) for r in results]

    # The seed generators' states too: both runs draw the same numbers.
    start = [keras.ops.convert_to_numpy(v) for v in model.variables]
    monkeypatch.setattr(_keras_internals, "_direct_call_ok", counting)
    fast = outputs()
    for variable, value in zip(model.variables, start, strict=True):
        variable.assign(value)
    called = {layer for layer, result in direct if result}
    assert (model.patch_embedding in called) == ON_TORCH
    assert (model.classifier in called) == ON_TORCH
    # Keras' own call: its functional graph run, `Layer.__call__` for each.
    monkeypatch.setattr(_keras_internals, "_eager_torch", lambda x: False)
    monkeypatch.setattr(_keras_internals, "_direct_call_ok", lambda *a: False)
    slow = outputs()
    if ON_TORCH:  # training differs from inference: the dropouts ran
        assert not np.allclose(fast[2], fast[0], atol=1e-3)
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a, b, atol=1e-6)


def test_mixed_precision_blocks_call_their_layers_directly(monkeypatch):
    """Under a mixed-precision model's autocast scope, a sublayer of the
    scope's compute dtype (and the library's LayerNormalization, whose
    call no scope changes) is called directly on PyTorch; a float32 layer
    inside (Keras opens a float32 scope for it) or a layer with
    `autocast=False` is not. A `mixed_bfloat16` JumboViT (random weights)
    gives the same outputs, bit for bit, as through
    `Layer.__call__` for every layer, at inference and with
    `predict_on_batch`."""
    from keras.src.backend import AutocastScope

    from keras_jumbo import models

    norm = _norm(dtype="mixed_bfloat16")
    half = _x(dtype="float32")
    half = keras.ops.cast(half, "bfloat16")
    dense = keras.layers.Dense(4, dtype="mixed_bfloat16")
    dense.build(half.shape)
    wide = keras.layers.Dense(4, dtype="float32")
    wide.build(half.shape)
    plain = keras.layers.Dense(4, dtype="mixed_bfloat16", autocast=False)
    plain.build(half.shape)
    with AutocastScope("bfloat16"):
        assert DIRECT_CALL_OK(norm, half) == ON_TORCH
        assert DIRECT_CALL_OK(dense, half) == ON_TORCH
        assert not DIRECT_CALL_OK(wide, keras.ops.cast(half, "float32"))
        assert not DIRECT_CALL_OK(plain, half)
    with AutocastScope("float16"):
        assert not DIRECT_CALL_OK(dense, half)
    with AutocastScope(None):
        assert not DIRECT_CALL_OK(dense, half)

    model = models.JumboViT(
        **TINY_VIT, jumbo_multiplier=2, dtype="mixed_bfloat16",
    )  # fmt: skip
    randomize_weights(model, seed=8)
    x = _x((3, 16, 16, 3))
    direct = []

    def counting(layer, inputs, *rest):
        result = DIRECT_CALL_OK(layer, inputs, *rest)
        direct.append(result)
        return result

    def outputs():
        results = [model(x, training=False), model.predict_on_batch(x)]
        return [
            keras.ops.convert_to_numpy(keras.ops.cast(r, "float32"))
            for r in results
        ]

    monkeypatch.setattr(_keras_internals, "_direct_call_ok", counting)
    fast = outputs()
    assert any(direct) == ON_TORCH
    monkeypatch.setattr(_keras_internals, "_direct_call_ok", lambda *a: False)
    slow = outputs()
    assert np.abs(fast[0]).max() > 0
    for a, b in zip(fast, slow, strict=True):
        assert_allclose(a, b, atol=0)


def test_model_quantize_collects_garbage_once(monkeypatch):
    """`model.quantize` on a model class runs one `gc.collect()` (Keras
    runs one per quantised layer, 0.15-1 s each) and quantises exactly as
    Keras' own `Model.quantize`."""
    import gc

    from keras_jumbo import models

    model = models.ViT(**TINY_VIT)
    randomize_weights(model, seed=2)
    reference = models.ViT(**TINY_VIT)
    reference.set_weights(model.get_weights())
    calls = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    model.quantize("int8")
    assert len(calls) == 1
    assert gc.collect is not collect  # the patched one is back
    monkeypatch.setattr(gc, "collect", collect)
    keras.Model.quantize(reference, "int8")
    x = _x((2, 16, 16, 3))
    assert_allclose(model(x), reference(x), atol=0, rtol=0)
    # Nested blocks collect once, at the end of the outermost.
    calls.clear()
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    with _keras_internals.collect_garbage_once():
        with _keras_internals.collect_garbage_once():
            gc.collect()
        assert not calls
    assert len(calls) == 1


def test_jax_jit_options_binds_arguments_the_jit_takes(monkeypatch):
    from keras.src.backend.jax import trainer

    from keras_jumbo._keras_internals import jax_jit_options

    def takes_options(function, compiler_options=None):
        return compiler_options

    def takes_nothing(function):
        return "plain"

    monkeypatch.setattr(trainer, "jit", takes_options)
    with jax_jit_options(compiler_options={"a": 1}):
        bound = trainer.jit(None)
    # Other backends: Keras' JAX trainer is left alone.
    assert bound == ({"a": 1} if keras.backend.backend() == "jax" else None)
    assert trainer.jit is takes_options
    # A `jit` without the argument (e.g. another library's) is left alone.
    monkeypatch.setattr(trainer, "jit", takes_nothing)
    with jax_jit_options(compiler_options={"a": 1}):
        assert trainer.jit is takes_nothing


def _fit_and_count_traces(model, x, y):
    """Fit then evaluate `model` (2 equal batches; SGD with momentum and a
    metric, i.e. optimizer and metric variables); how many times its
    train and test steps ran in Python, and its weights after `fit`."""
    counts = {"train": 0, "test": 0}
    train_step, test_step = model.train_step, model.test_step

    def counted(kind, step):
        def run(*args):  # JAX: (state, data); other backends: (data,)
            counts[kind] += 1
            return step(*args)

        return run

    model.train_step = counted("train", train_step)
    model.test_step = counted("test", test_step)
    model.compile(
        optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
    weights = model.get_weights()
    model.evaluate(x, y, batch_size=2, verbose=0)
    return counts, weights


def _tiny_vit_or_distiller(kind):
    from keras_jumbo import losses
    from keras_jumbo import models

    overrides = dict(TINY_VIT, depth=1)
    student = models.ViT(**overrides)
    randomize_weights(student, seed=3)
    if kind == "model_class":
        return student
    teacher = models.ViT(**overrides)
    randomize_weights(teacher, seed=4)
    return losses.Distiller(student, teacher)


@pytest.mark.parametrize("kind", ["model_class", "distiller"])
def test_models_trace_their_steps_once(monkeypatch, kind):
    """On TensorFlow Keras 3.15 creates the optimizer's and metrics'
    variables inside the first trace of a step, and `tf.function` then
    traces that step twice; the model classes and the distillers build
    them first (`BuildsStateBeforeTracing`), so each step is traced once,
    and `fit` trains exactly as Keras' own path does."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 16, 16, 3)).astype("float32")
    y = np.array([0, 1, 2, 1])
    model = _tiny_vit_or_distiller(kind)
    start = model.get_weights()
    counts, weights = _fit_and_count_traces(model, x, y)
    if keras.backend.backend() != "torch":  # PyTorch steps are eager
        assert counts == {"train": 1, "test": 1}
    # Keras' own path (state created inside the first trace).
    monkeypatch.setattr(
        _keras_internals.BuildsStateBeforeTracing,
        "_maybe_symbolic_build",
        keras.Model._maybe_symbolic_build
        if hasattr(keras.Model, "_maybe_symbolic_build")
        else lambda self, iterator=None, data_batch=None: None,
    )
    reference = _tiny_vit_or_distiller(kind)
    reference.set_weights(start)
    ref_counts, ref_weights = _fit_and_count_traces(reference, x, y)
    if keras.backend.backend() == "tensorflow":
        assert ref_counts["train"] == 2  # what this saves
    for got, want in zip(weights, ref_weights, strict=True):
        assert_allclose(got, want, atol=1e-6, rtol=1e-6)
    assert any(
        not np.allclose(a, b) for a, b in zip(weights, start, strict=True)
    )


ON_JAX = keras.backend.backend() == "jax"


def _recording_step(drawn):
    """A step function as Keras' JAX trainer makes them, `(state,
    iterator) -> (outputs, state)`, that draws two batches and records
    them."""

    def step(state, iterator):
        drawn.append(next(iterator))
        drawn.append(next(iterator))
        return "outputs", state

    return step


def test_jax_waits_for_batches_puts_each_batch_on_the_device(monkeypatch):
    """With synchronous dispatch, a step gets each batch as device arrays
    that are ready (so XLA runs it on the calling thread), with the same
    values, drawn one at a time; otherwise the iterator itself."""
    drawn = []
    step = _keras_internals.jax_waits_for_batches(_recording_step(drawn))
    if not ON_JAX:
        assert not hasattr(step, "_waits_for_batches")  # left alone
        return
    import jax

    assert _keras_internals.jax_waits_for_batches(step) is step  # once
    assert _keras_internals.jax_waits_for_batches(None) is None
    rng = np.random.default_rng(0)
    batches = [
        (
            {"images": rng.normal(size=(4, 8, 8, 3)).astype("float32")},
            rng.integers(0, 3, size=(4,)),
            None,
        )
        for _ in range(3)
    ]
    source = iter(batches)
    monkeypatch.setattr(
        _keras_internals, "_dispatch_is_synchronous", lambda: True
    )
    assert step("state", source) == ("outputs", "state")
    assert len(drawn) == 2
    assert len(list(source)) == 1  # the third batch was not drawn early
    for (inputs, labels, weights), (x, y, _) in zip(
        drawn, batches[:2], strict=True
    ):
        assert isinstance(inputs["images"], jax.Array)
        assert isinstance(labels, jax.Array)
        assert inputs["images"].is_ready() and labels.is_ready()
        assert weights is None
        np.testing.assert_array_equal(np.asarray(inputs["images"]), x["images"])
        np.testing.assert_array_equal(np.asarray(labels), y)
    # A device array passes as it is; the end of the data ends the step.
    array = jax.numpy.ones((2, 3))
    drawn.clear()
    with pytest.raises(StopIteration):
        step("state", iter([array]))
    assert drawn == [array] and drawn[0] is array
    # Asynchronous dispatch (JAX's default): the batches untouched.
    monkeypatch.setattr(
        _keras_internals, "_dispatch_is_synchronous", lambda: False
    )
    drawn.clear()
    step("state", iter(batches[:2]))
    assert drawn[0] is batches[0] and drawn[1] is batches[1]


@pytest.mark.parametrize("kind", ["model_class", "distiller"])
def test_models_train_alike_waiting_for_their_batches(monkeypatch, kind):
    """The model classes' and distillers' steps wait for their batches on
    JAX (`WaitsForBatches`); `fit`, `evaluate` and `predict` give the same
    numbers as without the wait, with `steps_per_execution` 2 too (not on
    PyTorch)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 16, 16, 3)).astype("float32")
    y = np.array([0, 1, 2, 1, 0, 2])

    def run(synchronous, steps_per_execution):
        monkeypatch.setattr(
            _keras_internals, "_dispatch_is_synchronous", lambda: synchronous
        )
        model = _tiny_vit_or_distiller(kind)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False)
        assert (
            getattr(model.train_function, "_waits_for_batches", False) == ON_JAX
        )
        return (
            model.get_weights(),
            model.evaluate(x, y, batch_size=2, verbose=0),
            model.predict(x, batch_size=4, verbose=0),
        )

    # Keras' PyTorch trainer takes `steps_per_execution` 1 only.
    for steps_per_execution in (1,) if ON_TORCH else (1, 2):
        waited = run(True, steps_per_execution)
        plain = run(False, steps_per_execution)
        for got, want in zip(waited[0], plain[0], strict=True):
            assert_allclose(got, want, atol=1e-6, rtol=1e-6)
        assert_allclose(waited[1], plain[1], atol=1e-6)
        assert_allclose(waited[2], plain[2], atol=1e-6)
    start = _tiny_vit_or_distiller(kind).get_weights()
    assert any(
        not np.allclose(a, b) for a, b in zip(waited[0], start, strict=True)
    )
