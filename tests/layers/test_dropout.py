"""`keras_jumbo.layers.Dropout`: Keras' dropout, with a counter-hash mask
on JAX (`COUNTER_HASH_BACKENDS`)."""

import math

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo._keras_internals import sublayers
from keras_jumbo.layers import MLP
from keras_jumbo.layers import Dropout
from keras_jumbo.layers.dropout import COUNTER_HASH_BACKENDS
from keras_jumbo.layers.dropout import counter_hash_bits
from keras_jumbo.layers.dropout import counter_hash_dropout
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test

_U32 = 0xFFFFFFFF
HASHED = keras.backend.backend() in COUNTER_HASH_BACKENDS


def _lowbias32(h):
    """C. Wellons' lowbias32, in unsigned 32-bit arithmetic (uint64 here,
    reduced modulo 2**32): the reference for the int32 version."""
    h = h.astype(np.uint64) & _U32
    h ^= h >> 16
    h = (h * 0x7FEB352D) & _U32
    h ^= h >> 15
    h = (h * 0x846CA68B) & _U32
    h ^= h >> 16
    return h


def reference_bits(shape, seed):
    """`counter_hash_bits` written out in numpy, as uint32."""
    one = lambda v: _lowbias32(np.array([v], np.uint64))[0]  # noqa: E731
    key_1 = one(int(seed[0]) ^ 0x3C6EF372)
    key_2 = one(((int(seed[1]) ^ int(key_1)) + 0x1B873593) & _U32)
    index = np.arange(math.prod(shape), dtype=np.uint64).reshape(shape)
    bits = _lowbias32((_lowbias32(index ^ key_1) + key_2) & _U32)
    return bits.astype(np.uint32)


def _bits(shape, seed):
    out = keras.ops.convert_to_numpy(
        counter_hash_bits(shape, np.array(seed, "int32"))
    )
    return out.astype(np.int32).view(np.uint32)


@pytest.mark.parametrize(
    "seed", [(0, 1), (12345, 987654321), (2**31 - 1, 7), (5, 0)]
)
def test_counter_hash_bits_equal_the_uint32_hash(seed):
    np.testing.assert_array_equal(
        _bits((3, 5, 7), seed), reference_bits((3, 5, 7), seed)
    )


def test_counter_hash_dropout_keeps_1_minus_rate_and_scales(rng):
    rate, shape = 0.3, (400, 500)
    n, keep = math.prod(shape), 1.0 - rate
    x = rng.normal(size=shape).astype("float32")
    seed = np.array([0, 42], "int32")
    y = keras.ops.convert_to_numpy(counter_hash_dropout(x, rate, seed))
    kept = reference_bits(shape, (0, 42)) < round(keep * 2**32)
    np.testing.assert_array_equal(y != 0, kept)
    np.testing.assert_array_equal(y[~kept], 0.0)
    assert_allclose(y[kept], x[kept] / np.float32(keep), atol=0, rtol=3e-7)
    sigma = math.sqrt(keep * rate / n)
    assert abs(kept.mean() - keep) < 5 * sigma, kept.mean()
    # Consecutive seeds (what `SeedGenerator.next()` gives step after
    # step) and neighbouring elements give uncorrelated masks.
    following = reference_bits(shape, (0, 43)) < round(keep * 2**32)
    bound = 5 / math.sqrt(n)
    assert abs(np.corrcoef(kept.ravel(), following.ravel())[0, 1]) < bound
    assert abs(np.corrcoef(kept[:, 1:].ravel(), kept[:, :-1].ravel())[0, 1]) < (
        bound * 1.01
    )
    assert abs(np.corrcoef(kept[1:].ravel(), kept[:-1].ravel())[0, 1]) < (
        bound * 1.01
    )


def test_dropout_layer():
    run_layer_test(
        Dropout,
        {"rate": 0.25, "seed": 3},
        input_shape=(4, 3, 2),
        expected_output_shape=(4, 3, 2),
        expected_num_trainable_weights=0,
    )


def _state(layer):
    return keras.ops.convert_to_numpy(layer.seed_generator.state.value)


def test_dropout_masks_on_each_backend(rng):
    """On JAX the mask is the counter hash of the layer's seed state; on
    the other backends the layer is Keras' `Dropout` (same seed, same
    output). Inference is the identity; each call draws a new mask."""
    x = rng.normal(size=(16, 24)).astype("float32")
    layer = Dropout(0.4, seed=3)
    state = _state(layer)
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    if HASHED:
        kept = reference_bits(x.shape, state) < round(0.6 * 2**32)
        expected = np.where(kept, x / np.float32(0.6), 0.0)
    else:
        expected = keras.layers.Dropout(0.4, seed=3)(x, training=True)
    assert_allclose(y, expected, atol=0, rtol=3e-7)
    assert 0 < (y == 0).mean() < 1
    assert not np.array_equal(
        keras.ops.convert_to_numpy(layer(x, training=True)) == 0, y == 0
    )
    assert_allclose(layer(x, training=False), x, atol=0)
    assert_allclose(Dropout(1.0)(x, training=True), np.zeros_like(x), atol=0)


def test_dropout_with_noise_shape_is_keras_dropout(rng):
    x = rng.normal(size=(32, 5)).astype("float32")
    ours = Dropout(0.5, noise_shape=(32, 1), seed=4)(x, training=True)
    keras_out = keras.layers.Dropout(0.5, noise_shape=(32, 1), seed=4)(
        x, training=True
    )
    assert_allclose(ours, keras_out, atol=0)
    ours = keras.ops.convert_to_numpy(ours)
    assert np.all((ours == 0) == (ours[:, :1] == 0))  # whole rows


def _reseed_torch():
    """On PyTorch, an unseeded layer draws from torch's global generator:
    the same torch seed replays its mask."""
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed(11)


@pytest.mark.parametrize("seed", [2, None])
def test_dropout_gradient_is_the_mask(rng, seed):
    """One SGD step (lr 1, MSE) through Dense -> Dropout: the kernel update
    is the analytic one with the layer's mask (read back by replaying the
    layer's seed state, and torch's global seed)."""
    x = rng.normal(size=(8, 5)).astype("float32")
    target = rng.normal(size=(8, 6)).astype("float32")
    kernel = rng.normal(size=(5, 6)).astype("float32")
    dense = keras.layers.Dense(6, use_bias=False)
    drop = Dropout(0.5, seed=seed)
    inputs = keras.Input((5,))
    model = keras.Model(inputs, drop(dense(inputs)))
    dense.set_weights([kernel])
    state = _state(drop)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    _reseed_torch()
    model.train_on_batch(x, target)
    drop.seed_generator.state.assign(state)
    _reseed_torch()
    ones = np.ones((8, 6), "float32")
    scale = keras.ops.convert_to_numpy(drop(ones, training=True))
    assert set(np.unique(scale)) == {0.0, 2.0}
    y = (x @ kernel) * scale
    upstream = 2.0 * (y - target) / target.size
    expected = kernel - x.T @ (upstream * scale)
    assert_allclose(dense.get_weights()[0], expected, atol=1e-5, rtol=1e-5)


def test_unseeded_dropout_on_each_backend(rng):
    """A layer without a seed: on JAX the hash of its seed state; on
    PyTorch 32 bits per element from torch's global generator (what
    `F.dropout` draws from), two elements per full-range 64-bit draw, kept
    where the signed word is below `round(0.7 * 2**32) - 2**31`; on
    TensorFlow Keras' dropout.
    The kept fraction is 1 - rate within 5 sigma on every backend."""
    x = rng.normal(size=(400, 500)).astype("float32")
    keras.utils.set_random_seed(5)
    layer = Dropout(0.3)
    state = _state(layer)
    _reseed_torch()
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    if HASHED:
        kept = reference_bits(x.shape, state) < round(0.7 * 2**32)
        expected = np.where(kept, x / np.float32(0.7), 0.0)
    elif keras.backend.backend() == "torch":
        import torch

        _reseed_torch()
        draws = torch.empty((x.size // 2,), dtype=torch.int64)
        words = draws.random_(-(2**63), None).numpy().view(np.int32)
        kept = words.reshape(x.shape) < round(0.7 * 2**32) - 2**31
        expected = np.where(kept, x * np.float32(1 / 0.7), 0.0)
    else:
        keras.utils.set_random_seed(5)
        expected = keras.layers.Dropout(0.3)(x, training=True)
    assert_allclose(y, expected, atol=0, rtol=3e-7)
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 5 * math.sqrt(0.21 / kept.size)
    assert_allclose(y[kept], x[kept] / np.float32(0.7), atol=0, rtol=3e-7)


def test_library_layers_use_it():
    assert type(MLP(8, dropout_rate=0.1).dropout) is Dropout
    model = models.PatchTSTClassifier(
        sequence_length=32,
        num_channels=2,
        num_classes=3,
        num_patches=4,
        hidden_dim=8,
        num_heads=2,
        depth=1,
        mlp_dim=16,
        dropout_rate=0.2,
        head_dropout_rate=0.1,
    )
    dropouts = [
        layer
        for layer in sublayers(model)
        if isinstance(layer, keras.layers.Dropout)
    ]
    assert dropouts and all(type(d) is Dropout for d in dropouts)


def test_unseeded_dropout_in_a_compiled_training_step():
    """`jit_compile=True` (PyTorch: `torch.compile`, where the mask is
    `torch.rand(...) < 1 - rate` generated inside the compiled kernel; JAX
    and TensorFlow: XLA). One SGD step (lr 1, MSE) of a zero kernel into
    Dropout(0.3), with input 1 and target 2000 over 4000 units, moves each
    kernel entry by exactly its mask value: 0 or 1 / 0.7, kept in 1 - rate
    of the entries within 5 sigma."""
    units = 4000
    drop = Dropout(0.3)
    dense = keras.layers.Dense(
        units, use_bias=False, kernel_initializer="zeros"
    )
    inputs = keras.Input((1,))
    model = keras.Model(inputs, drop(dense(inputs)))
    model.compile(
        optimizer=keras.optimizers.SGD(1.0), loss="mse", jit_compile=True
    )
    model.train_on_batch(
        np.ones((1, 1), "float32"), np.full((1, units), units / 2, "float32")
    )
    mask = dense.get_weights()[0][0]
    kept = mask != 0
    assert abs(kept.mean() - 0.7) < 5 * math.sqrt(0.21 / units)
    assert_allclose(mask[kept], np.full(kept.sum(), 1 / 0.7), atol=0, rtol=3e-7)
