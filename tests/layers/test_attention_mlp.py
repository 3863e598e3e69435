import keras
import numpy as np
import pytest

from keras_jumbo.layers import MLP
from keras_jumbo.layers import LayerScale
from keras_jumbo.layers import MultiHeadSelfAttention
from keras_jumbo.layers import StochasticDepth
from keras_jumbo.layers import attention
from keras_jumbo.layers._utils import dense
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers._utils import gelu
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers import reference
from tests.layers.reference import assert_same_sgd_step
from tests.layers.reference import value


def test_attention_layer_checks():
    run_layer_test(
        MultiHeadSelfAttention,
        {"num_heads": 2},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=4,
    )


@pytest.mark.parametrize("key_dim", [None, 6])
def test_attention_equals_keras_multi_head_attention(rng, key_dim):
    # key_dim=6 != head_dim=4: a reparameterised Non-Deep ViT's attention
    # (queries and keys wider than values), Keras' value_dim case.
    d, heads, head_dim = 12, 3, 4
    ours = MultiHeadSelfAttention(num_heads=heads, key_dim=key_dim)
    x = rng.normal(size=(2, 7, d)).astype("float32")
    ours(x)
    randomize_weights(ours)
    kd = key_dim or head_dim
    assert ours.key_dim == kd and ours.head_dim == head_dim
    core = keras.layers.MultiHeadAttention(
        num_heads=heads, key_dim=kd, value_dim=head_dim
    )
    core.build(x.shape, x.shape)
    splits = [heads * kd, 2 * heads * kd]
    kernels = np.split(value(ours.qkv.kernel), splits, axis=-1)
    biases = np.split(value(ours.qkv.bias), splits)
    for projection, kernel, bias in zip(
        (core._query_dense, core._key_dense, core._value_dense),
        kernels,
        biases,
        strict=True,
    ):
        projection.kernel.assign(kernel.reshape(d, heads, -1))
        projection.bias.assign(bias.reshape(heads, -1))
    core._output_dense.kernel.assign(
        value(ours.proj.kernel).reshape(heads, head_dim, d)
    )
    core._output_dense.bias.assign(value(ours.proj.bias))
    # Keras' einsum path (its JAX fused path needs key_dim == value_dim).
    core_out, core_maps = core(x, x, return_attention_scores=True)
    assert_allclose(ours(x), core_out, atol=1e-5)
    assert_allclose(ours(x), reference.attention(x, ours), atol=1e-5)
    # The maps `call` uses, readable for attention-map distillation.
    assert_allclose(ours.attention_probabilities(x), core_maps, atol=1e-6)
    assert_allclose(
        ours.attention_probabilities(x),
        reference.attention(x, ours, return_maps=True),
        atol=1e-6,
    )
    config = ours.get_config()
    assert config["key_dim"] == key_dim
    assert MultiHeadSelfAttention.from_config(config).get_config() == config


@pytest.mark.parametrize("mode", ["int8", "int4", "float8", "lora"])
@pytest.mark.parametrize("key_dim", [None, 6])
def test_quantized_or_lora_projections_use_their_own_call(rng, mode, key_dim):
    # A quantised Dense stores integer kernels whose scales only its call
    # applies: the attention must not read `qkv.kernel` / `proj.kernel`
    # (it did, silently: outputs off by ~100%).
    layer = MultiHeadSelfAttention(num_heads=3, key_dim=key_dim)
    x = rng.normal(size=(2, 7, 12)).astype("float32")
    layer(x)
    randomize_weights(layer)
    float_out = keras.ops.convert_to_numpy(layer(x))
    for projection in (layer.qkv, layer.proj):
        if mode == "lora":
            projection.enable_lora(2)
            projection.lora_kernel_b.assign(
                rng.normal(size=projection.lora_kernel_b.shape) * 0.3
            )
        else:
            projection.quantize(mode)
    expected = reference.attention(x, layer, linear=reference.layer_call)
    assert_allclose(layer(x), expected, atol=1e-4, rtol=1e-4)
    assert_allclose(
        layer.attention_probabilities(x),
        reference.attention(
            x, layer, return_maps=True, linear=reference.layer_call
        ),
        atol=1e-5,
    )
    changed = np.abs(expected - float_out).max() / np.abs(float_out).max()
    if mode == "lora":
        assert changed > 0.05  # the adapters are in use
    else:
        assert 0 < changed < 0.1  # quantisation error, not garbage


def _attention_in_mode(rng, mode, key_dim=None):
    """A 3-head attention on width 12 with randomised weights, its
    projections LoRA-enabled (`"lora"`, random adapters) or quantised
    (`"int8"`) or plain (None); an input `(2, 7, 12)`; and the written-out
    attention of that input through the projections' own calls."""
    layer = MultiHeadSelfAttention(num_heads=3, key_dim=key_dim)
    x = rng.normal(size=(2, 7, 12)).astype("float32")
    layer(x)
    randomize_weights(layer)
    kwargs = {}
    if mode == "lora":
        for projection in (layer.qkv, layer.proj):
            projection.enable_lora(2)
            projection.lora_kernel_b.assign(
                rng.normal(size=projection.lora_kernel_b.shape) * 0.3
            )
        kwargs = {"linear": reference.layer_call}
    elif mode == "int8":
        layer.qkv.quantize(mode)
        layer.proj.quantize(mode)
        kwargs = {"linear": reference.layer_call}
    return layer, x, reference.attention(x, layer, **kwargs)


@pytest.mark.parametrize("mode", [None, "int8", "lora"])
def test_fused_attention_call_equals_the_einsum_form(rng, mode):
    # The PyTorch backend's plain call (one q/k/v matmul and
    # `ops.dot_product_attention`), run here on every backend, against the
    # written-out attention and against the einsum form `call` uses with a
    # head mask of ones.
    layer, x, expected = _attention_in_mode(rng, mode)
    assert_allclose(layer._fused_call(x), expected, atol=1e-5, rtol=1e-5)
    ones = np.ones((2, 1, 12), "float32")
    assert_allclose(
        layer._fused_call(x), layer(x, head_mask=ones), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("mode", [None, "int8", "lora"])
def test_fused_scores_call_equals_the_einsum_form(rng, mode):
    """The call that returns or adds scores on PyTorch and JAX (PatchTST's
    blocks; one q/k/v matmul, the scores written out), run here on every
    backend, against the einsum form `call` uses with a head mask of
    ones: the same output and the same scores, with and without residual
    scores."""
    layer, x, _ = _attention_in_mode(rng, mode)
    ones = np.ones((2, 1, 12), "float32")
    previous = rng.normal(size=(2, 3, 7, 7)).astype("float32")
    for residual in (None, previous):
        out, scores = layer._fused_scores_call(x, False, residual)
        expected, expected_scores = layer(
            x, head_mask=ones, previous_scores=residual, return_scores=True
        )
        assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
        assert_allclose(scores, expected_scores, atol=1e-5, rtol=1e-5)
    # `call` routes there on PyTorch and JAX: the same values without a
    # head mask.
    out, scores = layer(x, previous_scores=previous, return_scores=True)
    assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    assert_allclose(scores, expected_scores, atol=1e-5, rtol=1e-5)


def test_fused_attention_calls_by_backend():
    layer = MultiHeadSelfAttention(num_heads=2)
    layer.build((1, 4, 8))
    on_torch = keras.backend.backend() == "torch"
    assert layer._uses_fused_call(None, None, None, False) == on_torch
    # In training on TensorFlow too (`FUSED_TRAINING_BACKENDS`).
    in_training = keras.backend.backend() in ("torch", "tensorflow")
    assert layer._uses_fused_call(True, None, None, False) == in_training
    assert not layer._uses_fused_call(None, np.ones((1, 1, 8)), None, False)
    assert not layer._uses_fused_call(None, None, np.zeros((1, 2, 4, 4)), False)
    assert not layer._uses_fused_call(None, None, None, True)
    wide_keys = MultiHeadSelfAttention(num_heads=2, key_dim=6)
    wide_keys.build((1, 4, 8))
    assert not wide_keys._uses_fused_call(None, None, None, False)
    dropping = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.1)
    dropping.build((1, 4, 8))
    assert not dropping._uses_fused_call(True, None, None, False)
    assert dropping._uses_fused_call(False, None, None, False) == on_torch
    # Every other call takes the fused q/k/v matmul on PyTorch; on JAX a
    # call that returns or adds scores does too (PatchTST); a head mask or
    # wider keys keep the einsum form.
    with_scores = keras.backend.backend() in ("torch", "jax")
    previous = np.zeros((1, 2, 4, 4))
    assert layer._uses_fused_scores_call(None, None, False) == on_torch
    assert layer._uses_fused_scores_call(None, previous, False) == with_scores
    assert layer._uses_fused_scores_call(None, None, True) == with_scores
    assert not layer._uses_fused_scores_call(np.ones((1, 1, 8)), None, True)
    assert not wide_keys._uses_fused_scores_call(None, previous, True)


def test_short_narrow_calls_take_the_fused_call_on_jax():
    # On JAX a plain call with heads of width <= 8 over a short sequence
    # takes the fused call too: up to 9 tokens in training, 25 at
    # inference (PatchTST's classifier at 8 patches); PyTorch always.
    on_torch = keras.backend.backend() == "torch"
    short = keras.backend.backend() in ("torch", "jax")
    # TensorFlow: every plain call in training (`FUSED_TRAINING_BACKENDS`).
    in_training = keras.backend.backend() in ("torch", "tensorflow")
    layer = MultiHeadSelfAttention(num_heads=2)
    layer.build((1, 4, 16))
    assert layer.head_dim == attention.NARROW_HEAD_DIM == 8
    assert attention.SHORT_SEQUENCE_MAX_LENGTH == {True: 9, False: 25}
    assert layer._uses_fused_call(True, None, None, False, 9) == (
        short or in_training
    )
    assert layer._uses_fused_call(True, None, None, False, 10) == in_training
    for training in (False, None):
        assert layer._uses_fused_call(training, None, None, False, 25) == short
        assert layer._uses_fused_call(training, None, None, False, 26) == (
            on_torch
        )
    # An unknown length, wider heads, scores, a head mask or attention
    # dropout in training keep the other forms on JAX.
    assert layer._uses_fused_call(False, None, None, False, None) == on_torch
    wide = MultiHeadSelfAttention(num_heads=1)
    wide.build((1, 4, 16))
    assert wide._uses_fused_call(True, None, None, False, 4) == in_training
    assert not layer._uses_fused_call(True, None, None, True, 4)
    assert not layer._uses_fused_call(True, np.ones((1, 1, 16)), None, False, 4)
    dropping = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.1)
    dropping.build((1, 4, 16))
    assert not dropping._uses_fused_call(True, None, None, False, 4)
    assert dropping._uses_fused_call(False, None, None, False, 4) == short


class _AttentionWithScores(keras.layers.Layer):
    """A 3-head attention given residual scores and returning its own, as
    one output: `out * (1 + the scores' mean over heads and keys)`; with
    `scores=False` the plain call's output alone. `einsum=True` passes a
    head mask of ones (the einsum form)."""

    def __init__(self, einsum, scores=True, **kwargs):
        super().__init__(**kwargs)
        self.einsum = einsum
        self.scores = scores
        self.attention = MultiHeadSelfAttention(num_heads=3)

    def build(self, input_shape):
        self.attention.build(input_shape)

    def call(self, x, training=None):
        if not self.scores:
            mask = keras.ops.ones_like(x[:, :1]) if self.einsum else None
            return self.attention(x, training=training, head_mask=mask)
        length = x.shape[1]
        previous = keras.ops.reshape(
            keras.ops.sin(keras.ops.arange(3 * length * length)),
            (1, 3, length, length),
        )
        mask = keras.ops.ones_like(x[:, :1]) if self.einsum else None
        out, scores = self.attention(
            x,
            training=training,
            head_mask=mask,
            previous_scores=keras.ops.cast(previous, x.dtype),
            return_scores=True,
        )
        return out * (1.0 + keras.ops.mean(scores, axis=(1, 3))[..., None])


def test_fused_scores_call_gradients_equal_the_einsum_form(rng):
    # One SGD step through the attention with residual scores in and its
    # scores out (PatchTST's call), the fused q/k/v matmul (PyTorch, JAX)
    # against the einsum form: the same weights after it.
    x = rng.normal(size=(2, 7, 12)).astype("float32")
    target = rng.normal(size=(2, 7, 12)).astype("float32")
    fused, einsum = _AttentionWithScores(False), _AttentionWithScores(True)
    fused.build(x.shape)
    randomize_weights(fused)
    einsum.build(x.shape)
    einsum.set_weights(fused.get_weights())
    assert_same_sgd_step(fused, einsum, x, target)


def test_short_plain_call_gradients_equal_the_einsum_form(rng):
    # One SGD step through a plain call over 7 tokens with heads of width
    # 4: the fused call (PyTorch, TensorFlow in training, JAX short and
    # narrow), against the einsum form: the same weights after it.
    x = rng.normal(size=(2, 7, 12)).astype("float32")
    target = rng.normal(size=(2, 7, 12)).astype("float32")
    fused = _AttentionWithScores(False, scores=False)
    einsum = _AttentionWithScores(True, scores=False)
    fused.build(x.shape)
    randomize_weights(fused)
    einsum.build(x.shape)
    einsum.set_weights(fused.get_weights())
    assert fused.attention._uses_fused_call(True, None, None, False, 7)
    assert_same_sgd_step(fused, einsum, x, target)


@pytest.mark.parametrize("key_dim", [None, 6])
@pytest.mark.parametrize("mode", [None, "int8", "lora"])
def test_per_head_call_equals_the_einsum_form(rng, mode, key_dim):
    # JAX's plain inference call (one q/k/v matmul, attention head by head
    # on column slices of it), run here on every backend, against the
    # written-out attention and against the einsum form `call` uses with a
    # head mask of ones; key_dim=6 != head_dim=4 (a reparameterised
    # Non-Deep ViT's wider queries and keys).
    layer, x, expected = _attention_in_mode(rng, mode, key_dim)
    assert_allclose(layer._per_head_call(x), expected, atol=1e-5, rtol=1e-5)
    ones = np.ones((2, 1, 12), "float32")
    assert_allclose(
        layer._per_head_call(x),
        layer(x, head_mask=ones),
        atol=1e-5,
        rtol=1e-5,
    )
    # `call` at inference (on JAX the per-head call over more tokens than
    # these 7, which take the fused call: `SHORT_SEQUENCE_MAX_LENGTH`): the
    # same values.
    assert_allclose(layer(x, training=False), expected, atol=1e-5, rtol=1e-5)


def test_per_head_call_only_for_plain_inference_on_jax():
    layer = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.1)
    layer.build((1, 4, 8))
    on_jax = keras.backend.backend() == "jax"
    assert layer._uses_per_head_call(None, None, None, False) == on_jax
    assert layer._uses_per_head_call(False, None, None, False) == on_jax
    # Training keeps the einsum form (its gradient is faster), and so do a
    # head mask and residual or returned scores.
    assert not layer._uses_per_head_call(True, None, None, False)
    assert not layer._uses_per_head_call(None, np.ones((1, 1, 8)), None, False)
    assert not layer._uses_per_head_call(
        None, None, np.zeros((1, 2, 4, 4)), False
    )
    assert not layer._uses_per_head_call(None, None, None, True)


def test_attention_dropout_only_in_training(rng):
    layer = MultiHeadSelfAttention(num_heads=2, attention_dropout_rate=0.5)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    assert_allclose(layer(x), reference.attention(x, layer), atol=1e-5)
    trained = keras.ops.convert_to_numpy(layer(x, training=True))
    assert not np.allclose(trained, reference.attention(x, layer), atol=1e-4)


def test_attention_errors():
    with pytest.raises(ValueError, match="num_heads"):
        MultiHeadSelfAttention(num_heads=3).build((1, 4, 8))
    with pytest.raises(ValueError, match="attention_dropout_rate"):
        MultiHeadSelfAttention(2, attention_dropout_rate=1.0)
    with pytest.raises(ValueError, match="key_dim.*0"):
        MultiHeadSelfAttention(2, key_dim=0)


def test_dropout_helper_skips_zero_rate_and_keeps_dropout(rng):
    x = keras.ops.convert_to_tensor(rng.normal(size=(4, 64)).astype("float32"))
    # rate 0: the input itself, no layer call (an identity)
    for zero in (keras.layers.Dropout(0.0), StochasticDepth(0.0)):
        assert dropout(zero, x, training=True) is x
        assert zero.built  # else Keras re-runs a build pass every step
    # rate > 0: the layer runs — zeros where dropped, x / (1 - rate) kept
    layer = keras.layers.Dropout(0.5, seed=1)
    out = keras.ops.convert_to_numpy(dropout(layer, x, training=True))
    kept = out != 0
    assert 0 < kept.mean() < 1
    assert_allclose(out[kept], keras.ops.convert_to_numpy(x)[kept] * 2.0)
    assert_allclose(dropout(layer, x, training=False), x)


def test_dense_helper_equals_the_dense_layer(rng):
    x = rng.normal(size=(2, 5, 6)).astype("float32")

    def fresh(**kwargs):
        layer = keras.layers.Dense(4, **kwargs)
        layer.build(x.shape)
        randomize_weights(layer)
        return layer

    # A plain float layer: computed from its weights, the same numbers.
    for layer in (fresh(), fresh(use_bias=False)):
        assert_allclose(dense(layer, x), layer(x), atol=1e-6)
        assert_allclose(
            dense(layer, x),
            x @ value(layer.kernel)
            + (0 if layer.bias is None else value(layer.bias)),
            atol=1e-5,
        )
    # Anything else goes through the layer's own call: an activation,
    # Keras LoRA (non-zero adapters), int8 quantisation (its scales).
    activated = fresh(activation="relu")
    assert_allclose(dense(activated, x), activated(x), atol=1e-6)
    assert float(np.min(keras.ops.convert_to_numpy(dense(activated, x)))) >= 0
    lora = fresh()
    lora.enable_lora(2)
    lora.lora_kernel_b.assign(rng.normal(size=(2, 4)).astype("float32"))
    plain = x @ value(lora._kernel) + value(lora.bias)
    assert not np.allclose(keras.ops.convert_to_numpy(lora(x)), plain)
    assert_allclose(dense(lora, x), lora(x), atol=1e-6)
    quantized = fresh()
    quantized.quantize("int8")
    assert_allclose(dense(quantized, x), quantized(x), atol=1e-6)


def test_gelu_is_exact_gelu(rng):
    x = rng.normal(size=(100,)).astype("float32") * 3
    assert_allclose(gelu(x), reference.gelu(x.astype("float64")), atol=1e-6)
    assert_allclose(
        gelu(x), keras.activations.gelu(x, approximate=False), atol=1e-6
    )


def test_mlp_layer_checks():
    run_layer_test(
        MLP,
        {"hidden_dim": 16, "dropout_rate": 0.1},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=4,
    )


def test_mlp_numbers(rng):
    layer = MLP(hidden_dim=10, output_dim=3)
    x = rng.normal(size=(4, 6)).astype("float32")
    layer(x)
    randomize_weights(layer)
    assert_allclose(layer(x), reference.mlp(x, layer), atol=1e-5)


def test_stochastic_depth(rng):
    run_layer_test(
        StochasticDepth,
        {"rate": 0.25},
        input_shape=(4, 3, 2),
        expected_output_shape=(4, 3, 2),
        expected_num_trainable_weights=0,
    )
    layer = StochasticDepth(0.5, seed=1)
    x = np.ones((256, 3), "float32")
    assert_allclose(layer(x), x, atol=0)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    rows = y[:, 0]
    assert set(np.unique(rows)) <= {0.0, 2.0}
    assert np.all(y == y[:, :1])  # whole examples are kept or dropped
    assert 0.3 < (rows == 0).mean() < 0.7
    with pytest.raises(ValueError, match="rate"):
        StochasticDepth(1.5)


def test_layer_scale(rng):
    run_layer_test(
        LayerScale,
        {"init_value": 0.1},
        input_shape=(2, 3, 4),
        expected_output_shape=(2, 3, 4),
        expected_num_trainable_weights=1,
    )
    layer = LayerScale(0.1)
    x = rng.normal(size=(2, 4)).astype("float32")
    assert_allclose(layer(x), 0.1 * x, atol=1e-7)
    with pytest.raises(TypeError, match="init_value"):
        LayerScale("big")
