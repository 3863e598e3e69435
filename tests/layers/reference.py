"""Independent numpy references for the layer tests."""

import math

import keras
import numpy as np

_erf = np.vectorize(math.erf)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def layer_norm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def dense(x, layer):
    w = value(layer.kernel)
    out = x @ w
    if layer.bias is not None:
        out = out + value(layer.bias)
    return out


def mlp(x, layer):
    return dense(gelu(dense(x, layer.fc1)), layer.fc2)


def layer_call(x, layer):
    """A sublayer applied through its own Keras call (e.g. a quantised
    Dense, whose stored kernel holds integers)."""
    return value(layer(np.asarray(x, "float32")))


def attention(x, layer, return_maps=False, linear=dense):
    """`linear(x, dense_layer)` computes the q/k/v and output projections."""
    b, n, d = x.shape
    h, hd, kd = layer.num_heads, layer.head_dim, layer.key_dim
    # Fused columns [q (h, kd) | k (h, kd) | v (h, hd)].
    q, k, v = np.split(linear(x, layer.qkv), [h * kd, 2 * h * kd], axis=-1)
    q, k = q.reshape(b, n, h, kd), k.reshape(b, n, h, kd)
    v = v.reshape(b, n, h, hd)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(kd)
    scores = scores - scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(-1, keepdims=True)
    if return_maps:
        return probs
    out = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, n, h * hd)
    return linear(out, layer.proj)


def norm(x, layer):
    return layer_norm(x, value(layer.gamma), value(layer.beta), layer.epsilon)


def value(variable):
    return keras.ops.convert_to_numpy(variable).astype("float64")


def weights_after_one_sgd_step(norm, x, target):
    """Every weight after one SGD step (lr 1, MSE) of Dense -> `norm` ->
    tanh on `x`: the Dense kernel's update carries `norm`'s input gradient,
    `norm`'s own weights their gradients (and any statistics it updates)."""
    units = x.shape[-1]
    dense = keras.layers.Dense(units, name="dense")
    inputs = keras.Input(x.shape[1:])
    outputs = keras.layers.Activation("tanh")(norm(dense(inputs)))
    model = keras.Model(inputs, outputs)
    dense.set_weights(
        [
            np.random.default_rng(5).normal(size=(units, units)),
            np.linspace(-1, 1, units),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    model.train_on_batch(x, target)
    return [np.asarray(w) for w in model.get_weights()]


def assert_same_sgd_step(ours, stock, x, target):
    """`ours` and `stock` (built, with equal weights) give the same weights
    after `weights_after_one_sgd_step`, and every weight of theirs moved
    (so no gradient is trivially zero). Returns ours."""
    from keras_jumbo.testing import assert_allclose

    before = [np.asarray(w) for w in stock.get_weights()]
    got = weights_after_one_sgd_step(ours, x, target)
    want = weights_after_one_sgd_step(stock, x, target)
    for g, w in zip(got, want, strict=True):
        assert_allclose(g, w, atol=1e-5, rtol=1e-4)
    moved = [np.abs(a - b).max() for a, b in zip(got[2:], before, strict=True)]
    assert min(moved) > 1e-4
    return got
