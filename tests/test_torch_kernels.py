"""`keras_jumbo._torch_kernels`: each op equals its `keras.ops` formula on
every backend, and reaches the PyTorch kernel only on PyTorch tensors."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_jumbo import _torch_kernels
from keras_jumbo import optimizers
from keras_jumbo.testing import assert_allclose

ON_TORCH = keras.backend.backend() == "torch"


def _tensor(rng, shape, dtype="float32", scale=1.0):
    return ops.convert_to_tensor(
        (scale * rng.normal(size=shape)).astype("float32"), dtype=dtype
    )


def test_torch_tensors_only_for_backend_tensors(rng):
    x = _tensor(rng, (2, 3))
    assert _torch_kernels.torch_tensors(x, None) == ON_TORCH
    assert not _torch_kernels.torch_tensors(np.ones((2, 3)))
    assert not _torch_kernels.torch_tensors(x, keras.KerasTensor((2, 3)))


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8), (2, 3, 4, 8)])
def test_linear_equals_matmul_plus_bias(rng, shape, with_bias):
    x = _tensor(rng, shape, scale=2.0)
    kernel = _tensor(rng, (8, 6))
    bias = _tensor(rng, (6,), scale=3.0) if with_bias else None
    expected = np.matmul(ops.convert_to_numpy(x), ops.convert_to_numpy(kernel))
    if with_bias:
        expected = expected + ops.convert_to_numpy(bias)
    out = _torch_kernels.linear(x, kernel, bias)
    assert tuple(out.shape) == shape[:-1] + (6,)
    assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_linear_on_a_sliced_kernel_and_its_gradient(rng):
    """A branch's kernel is a slice of a stacked `(branches, in, out)`
    weight (`ParallelBranchBlock`); values and gradients equal the
    `keras.ops` formula's."""
    x = _tensor(rng, (2, 5, 8))
    stacked = keras.Variable(rng.normal(size=(3, 8, 6)).astype("float32"))
    bias = keras.Variable(rng.normal(size=(3, 6)).astype("float32"))
    for b in range(3):
        out = _torch_kernels.linear(x, stacked[b], bias[b])
        expected = ops.matmul(x, stacked[b]) + bias[b]
        assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
    if ON_TORCH:
        import torch

        xt = torch.tensor(ops.convert_to_numpy(x), requires_grad=True)
        kt = torch.tensor(ops.convert_to_numpy(stacked[1]), requires_grad=True)
        bt = torch.tensor(ops.convert_to_numpy(bias[1]), requires_grad=True)
        weights = torch.tensor(rng.normal(size=(2, 5, 6)).astype("float32"))
        grads = torch.autograd.grad(
            (_torch_kernels.linear(xt, kt, bt) * weights).sum(), (xt, kt, bt)
        )
        reference = torch.autograd.grad(
            ((xt @ kt + bt) * weights).sum(), (xt, kt, bt)
        )
        for got, want in zip(grads, reference, strict=True):
            assert_allclose(got, want, atol=1e-5, rtol=1e-5)


class _Linear(keras.layers.Layer):
    """`linear` with its own kernel and bias, for a training step."""

    def build(self, input_shape):
        self.kernel = self.add_weight((input_shape[-1], 6), name="kernel")
        self.bias = self.add_weight((6,), name="bias")

    def call(self, x):
        return _torch_kernels.linear(x, self.kernel, self.bias)


@pytest.mark.parametrize("shape", [(4, 8), (4, 3, 8), (2, 3, 5, 8)])
def test_linear_gradient_equals_the_formula(rng, shape):
    """One SGD step (lr 1, mean squared error) through `linear`: the new
    kernel and bias are the analytic ones, `xᵀ·dy` and `sum(dy)` over all
    rows, whether `x` is 2-D or flattened to 2-D from more axes."""
    x = rng.normal(size=shape).astype("float32")
    target = rng.normal(size=shape[:-1] + (6,)).astype("float32")
    kernel = rng.normal(size=(8, 6)).astype("float32")
    bias = rng.normal(size=(6,)).astype("float32")
    layer = _Linear()
    inputs = keras.Input(shape[1:])
    model = keras.Model(inputs, layer(inputs))
    layer.set_weights([kernel, bias])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    model.train_on_batch(x, target)
    rows = x.reshape(-1, 8)
    upstream = 2.0 * (rows @ kernel + bias - target.reshape(-1, 6))
    upstream /= upstream.size
    new_kernel, new_bias = layer.get_weights()
    assert_allclose(new_kernel, kernel - rows.T @ upstream, 1e-5, 1e-5)
    assert_allclose(new_bias, bias - upstream.sum(0), 1e-5, 1e-5)


def test_linear_flattens_static_inner_axes_only(rng, monkeypatch):
    """Off PyTorch tensors, an input with static inner axes is multiplied
    as 2-D rows (one plain kernel-gradient matmul for XLA); unknown inner
    axes keep the broadcasting matmul; shapes come back either way,
    symbolic and empty batches included."""
    kernel, bias = _tensor(rng, (8, 6)), _tensor(rng, (6,))
    symbolic = _torch_kernels.linear(keras.KerasTensor((None, 5, 8)), kernel)
    assert tuple(symbolic.shape) == (None, 5, 6)
    dynamic = _torch_kernels.linear(keras.KerasTensor((2, None, 8)), kernel)
    assert tuple(dynamic.shape) == (2, None, 6)
    empty = _torch_kernels.linear(_tensor(rng, (0, 5, 8)), kernel, bias)
    assert tuple(empty.shape) == (0, 5, 6)
    ranks = []
    original = _torch_kernels.ops.matmul

    def spy(a, b):
        ranks.append(len(a.shape))
        return original(a, b)

    monkeypatch.setattr(_torch_kernels.ops, "matmul", spy)
    x = _tensor(rng, (2, 3, 5, 8))
    out = _torch_kernels.linear(x, kernel, bias)
    want = np.matmul(ops.convert_to_numpy(x), ops.convert_to_numpy(kernel))
    assert_allclose(out, want + ops.convert_to_numpy(bias), 1e-5, 1e-5)
    assert ranks == ([] if ON_TORCH else [2])


def test_reshape_equals_ops_reshape(rng):
    x = _tensor(rng, (2, 3, 12))
    for shape in ((2, 3, 4, 3), (-1, 12), (6, -1, 2)):
        assert_allclose(
            _torch_kernels.reshape(x, shape), ops.reshape(x, shape), atol=0
        )
    symbolic = keras.KerasTensor((None, 3, 12))
    symbolic = _torch_kernels.reshape(symbolic, (-1, 36))
    assert isinstance(symbolic, keras.KerasTensor)
    assert symbolic.shape == (None, 36)


def test_value_as_is_the_cast_of_the_variable(rng):
    """`value_as(variable, x)` equals `ops.cast(variable, x.dtype)` for
    every dtype pair, inside a mixed-precision layer (Keras' autocast
    scope) and for a symbolic `x` (a functional model being built) too;
    on PyTorch, where the dtype is already `x`'s, it is the variable's
    value tensor itself (no copy, so a gradient reaches the variable)."""
    values = rng.normal(size=(3, 4)).astype("float32")
    variable = keras.Variable(values)

    def check(got, dtype):
        assert keras.backend.standardize_dtype(got.dtype) == dtype
        assert_allclose(
            ops.cast(got, "float32"),
            ops.cast(ops.cast(values, dtype), "float32"),
            atol=0,
        )

    for dtype in ("float32", "float16", "bfloat16"):
        x = ops.convert_to_tensor(rng.normal(size=(2, 3)), dtype=dtype)
        check(_torch_kernels.value_as(variable, x), dtype)
    if ON_TORCH:
        x = ops.convert_to_tensor(values[:2, :3])
        assert _torch_kernels.value_as(variable, x) is variable.value

    class _Reads(keras.layers.Layer):
        def call(self, x):
            return _torch_kernels.value_as(variable, x)

    half = ops.convert_to_tensor(values[:2, :3], dtype="float16")
    check(_Reads(dtype="mixed_float16")(half), "float16")
    symbolic = keras.KerasTensor((None, 3), dtype="float16")
    check(_torch_kernels.value_as(variable, symbolic), "float16")


def test_value_as_keeps_a_half_cast_while_the_values_last(rng, monkeypatch):
    """On PyTorch, the half-precision cast of a weight for a call without
    gradient is made once per set of values and then reused (the same
    tensor), inside a mixed-precision layer too; a write (`assign`) is
    seen at the next call; a call whose gradient is needed casts anew
    (and its gradient reaches the variable); with `CAST_WEIGHTS` off
    nothing is kept; a copy past `CAST_WEIGHTS_MAX_BYTES` is not kept
    (until its values change); an entry leaves with its variable. Inside
    a `StatelessScope` the scope's value is cast. The values equal
    `ops.cast` of the current values throughout, bit for bit."""
    monkeypatch.setattr(_torch_kernels, "_CAST", {})
    values = rng.normal(size=(3, 4)).astype("float32")
    variable = keras.Variable(values)
    x = ops.convert_to_tensor(rng.normal(size=(2, 3)), dtype="bfloat16")

    def check(got, current):
        assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
        assert_allclose(
            ops.cast(got, "float32"),
            ops.cast(ops.cast(current, "bfloat16"), "float32"),
            atol=0,
        )

    with keras.StatelessScope(state_mapping=[(variable, values + 1.0)]):
        check(_torch_kernels.value_as(variable, x), values + 1.0)
    if not ON_TORCH:
        check(_torch_kernels.value_as(variable, x), values)
        return
    import gc

    import torch

    table = _torch_kernels._CAST
    with torch.no_grad():
        first = _torch_kernels.value_as(variable, x)
        check(first, values)
        assert _torch_kernels.value_as(variable, x) is first
    assert len(table) == 1

    class _Reads(keras.layers.Layer):
        def __init__(self, read, **kwargs):
            super().__init__(**kwargs)
            self.read = read

        def call(self, x):
            return _torch_kernels.value_as(self.read, x)

    with torch.no_grad():
        assert _Reads(variable, dtype="mixed_bfloat16")(x) is first
    new = 2.0 * values + 1.0
    variable.assign(new)
    with torch.no_grad():
        third = _torch_kernels.value_as(variable, x)
    assert third is not first
    check(third, new)
    cast = _torch_kernels.value_as(variable, x)  # a gradient is needed
    assert cast is not third and cast.grad_fn is not None
    check(cast, new)
    cast.float().sum().backward()
    assert_allclose(variable.value.grad, np.ones((3, 4)), atol=0)
    monkeypatch.setattr(_torch_kernels, "CAST_WEIGHTS", False)
    with torch.no_grad():
        fresh = _torch_kernels.value_as(variable, x)
    assert fresh is not third
    check(fresh, new)
    monkeypatch.setattr(_torch_kernels, "CAST_WEIGHTS", True)
    size = values.size * 2  # one bfloat16 copy
    monkeypatch.setattr(_torch_kernels, "CAST_WEIGHTS_MAX_BYTES", size)
    other = keras.Variable(values + 3.0)
    with torch.no_grad():
        once = _torch_kernels.value_as(other, x)
        assert _torch_kernels.value_as(other, x) is not once
    check(once, values + 3.0)
    assert _torch_kernels._kept_bytes(table) == size
    del variable, first, third, cast, fresh
    gc.collect()
    assert _torch_kernels._kept_bytes(table) == 0
    with torch.no_grad():  # refused until its values change
        assert _torch_kernels.value_as(other, x) is not once
        other.assign(values + 4.0)
        kept = _torch_kernels.value_as(other, x)
        assert _torch_kernels.value_as(other, x) is kept
    check(kept, values + 4.0)


def test_mixed_precision_predictions_follow_every_training_step(rng):
    """A `mixed_bfloat16` JumboViT trained with the library's AdamW (on
    PyTorch a fused kernel, whose writes the kept casts must see) and
    Keras' SGD: every prediction between steps equals, bit for bit, the
    same model's prediction with `CAST_WEIGHTS` off (each weight cast at
    the call)."""
    from keras_jumbo import models
    from keras_jumbo.testing import randomize_weights

    x = rng.normal(size=(3, 16, 16, 3)).astype("float32")
    y = np.array([0, 2, 1])
    for optimizer in (optimizers.AdamW(0.05), keras.optimizers.SGD(0.1)):
        model = models.JumboViT(
            image_size=16, patch_size=8, hidden_dim=8, depth=2, num_heads=2,
            num_classes=3, jumbo_multiplier=2, dtype="mixed_bfloat16",
        )  # fmt: skip
        randomize_weights(model, seed=3)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        previous = None
        for _ in range(3):
            kept = [model.predict_on_batch(x) for _ in range(2)]
            _torch_kernels.CAST_WEIGHTS = False
            try:
                plain = model.predict_on_batch(x)
            finally:
                _torch_kernels.CAST_WEIGHTS = True
            for out in kept:
                assert_allclose(out, plain, atol=0)
            if previous is not None:  # the step changed the predictions
                assert np.abs(plain - previous).max() > 0
            previous = plain
            model.train_on_batch(x, y)


def test_exact_gelu_equals_the_erf_formula(rng):
    """`exact_gelu` is `0.5 x (1 + erf(x / sqrt 2))`, on tensors and on
    numpy input, symbolic inputs giving a symbolic result."""
    from scipy.special import erf

    x_np = (3.0 * rng.normal(size=(4, 7))).astype("float32")
    expected = 0.5 * x_np * (1.0 + erf(x_np / np.sqrt(2.0)))
    for x in (ops.convert_to_tensor(x_np), x_np):
        assert_allclose(
            _torch_kernels.exact_gelu(x), expected, atol=1e-6, rtol=1e-6
        )
    symbolic = _torch_kernels.exact_gelu(keras.KerasTensor((None, 7)))
    assert isinstance(symbolic, keras.KerasTensor)
    assert symbolic.shape == (None, 7)


def test_concatenate_equals_ops_concatenate(rng):
    """The same values and dtype as `ops.concatenate`, along any axis,
    with the dtypes of its inputs promoted as Keras does when they
    differ; symbolic inputs give a symbolic result."""
    a = _tensor(rng, (2, 3, 4))
    b = _tensor(rng, (2, 3, 4))
    for axis in (0, 1, -1):
        assert_allclose(
            _torch_kernels.concatenate([a, b], axis),
            ops.concatenate([a, b], axis=axis),
            atol=0,
        )
    half = ops.cast(b, "float16")
    mixed = _torch_kernels.concatenate([a, half], 1)
    expected = ops.concatenate([a, half], axis=1)
    assert keras.backend.standardize_dtype(mixed.dtype) == (
        keras.backend.standardize_dtype(expected.dtype)
    )
    assert_allclose(mixed, expected, atol=0)
    symbolic = _torch_kernels.concatenate(
        [keras.KerasTensor((None, 3, 4)), keras.KerasTensor((None, 2, 4))], 1
    )
    assert isinstance(symbolic, keras.KerasTensor)
    assert symbolic.shape == (None, 5, 4)


def test_unstack_equals_the_slices(rng):
    x = _tensor(rng, (2, 5, 3, 4))
    for axis in (0, 2, 3):
        parts = _torch_kernels.unstack(x, axis)
        expected = np.moveaxis(ops.convert_to_numpy(x), axis, 0)
        assert len(parts) == x.shape[axis]
        for part, want in zip(parts, expected, strict=True):
            assert_allclose(part, want, atol=0)
    symbolic = _torch_kernels.unstack(keras.KerasTensor((None, 5, 3, 4)), 2)
    assert [tuple(t.shape) for t in symbolic] == [(None, 5, 4)] * 3


class _WeightedSlices(keras.layers.Layer):
    """`x * sum_i (i + 1) * w[:, i]` for a `(4, 3, 6)` weight `w`, its
    slices taken with `_torch_kernels.unstack` along axis 1."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(4, 3, 6), initializer="zeros")

    def call(self, x):
        parts = _torch_kernels.unstack(ops.convert_to_tensor(self.w), 1)
        return x * (parts[0] + 2.0 * parts[1] + 3.0 * parts[2])


def test_unstack_gradient_reaches_each_slice(rng):
    """One SGD step (lr 1, mean squared error to zero): slice `i` of the
    weight moves by `(i + 1)` times the output's gradient, the other
    slices' gradients not mixed in (torch's `unbind` backward stacks
    them)."""
    x = rng.normal(size=(2, 4, 6)).astype("float32")
    w = rng.normal(size=(4, 3, 6)).astype("float32")
    layer = _WeightedSlices()
    inputs = keras.Input((4, 6))
    model = keras.Model(inputs, layer(inputs))
    layer.set_weights([w])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    model.train_on_batch(x, np.zeros_like(x))
    coefficients = np.array([1.0, 2.0, 3.0], "float32")
    y = x * np.einsum("aib,i->ab", w, coefficients)
    # d loss / d w[:, i] = (i + 1) * sum over the batch of x * d loss / d y.
    shared = (2.0 * y / y.size * x).sum(0)
    grad = coefficients[None, :, None] * shared[:, None, :]
    assert_allclose(layer.get_weights()[0], w - grad, 1e-5, 1e-5)


def _layer_norm_reference(x, gamma, beta, epsilon):
    x = np.asarray(x, dtype="float64")
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + epsilon) * gamma + beta


@pytest.mark.parametrize("epsilon", [1e-6, 1e-3])
def test_layer_norm_equals_the_formula(rng, epsilon):
    x = _tensor(rng, (2, 5, 16), scale=3.0) + 1.5
    gamma = _tensor(rng, (16,)) + 1.0
    beta = _tensor(rng, (16,))
    out = _torch_kernels.layer_norm(x, gamma, beta, epsilon)
    expected = _layer_norm_reference(
        *(ops.convert_to_numpy(t) for t in (x, gamma, beta)), epsilon
    )
    assert_allclose(out, expected, atol=2e-5, rtol=2e-5)
    assert_allclose(
        out,
        ops.layer_normalization(x, gamma, beta, epsilon=epsilon),
        atol=2e-6,
        rtol=2e-6,
    )


def test_layer_norm_of_another_dtype_is_the_keras_op(rng):
    """Half precision goes through `ops.layer_normalization` (float32
    statistics), as the Keras layer does."""
    x = _tensor(rng, (2, 5, 16), dtype="bfloat16", scale=3.0)
    gamma = _tensor(rng, (16,), dtype="bfloat16") + 1.0
    beta = _tensor(rng, (16,), dtype="bfloat16")
    out = _torch_kernels.layer_norm(x, gamma, beta, 1e-6)
    expected = ops.layer_normalization(x, gamma, beta, epsilon=1e-6)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert_allclose(
        ops.cast(out, "float32"), ops.cast(expected, "float32"), atol=0
    )


def _numpy32(t):
    return ops.convert_to_numpy(ops.cast(t, "float32"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_layer_norm_with_float32_weights(rng, dtype):
    """A half-precision input with float32 gamma and beta (what Keras'
    normalisation layers pass under a mixed policy): without gradient each
    value is within one rounding of the float64 result and equals
    `ops.layer_normalization` (float32, then cast) except for a few
    values one rounding apart; where a gradient is needed, values and
    gradients are `ops.layer_normalization`'s exactly."""
    x = _tensor(rng, (4, 40, 32), dtype=dtype, scale=3.0) + 1.0
    gamma = _tensor(rng, (32,)) + 1.0
    beta = _tensor(rng, (32,))
    keras_op = ops.layer_normalization(x, gamma, beta, epsilon=1e-6)
    reference = _layer_norm_reference(
        *(_numpy32(t) for t in (x, gamma, beta)),
        1e-6,
    )
    spacing = 2.0 ** (-8 if dtype == "bfloat16" else -11)
    if ON_TORCH:
        import torch

        with torch.no_grad():
            out = _torch_kernels.layer_norm(x, gamma, beta, 1e-6)
    else:
        out = _torch_kernels.layer_norm(x, gamma, beta, 1e-6)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    got = ops.convert_to_numpy(ops.cast(out, "float32")).astype("float64")
    error = np.abs(got - reference) / np.maximum(np.abs(reference), 1e-3)
    assert error.max() <= spacing
    apart = got != ops.convert_to_numpy(ops.cast(keras_op, "float32"))
    assert apart.mean() <= 1e-3
    if not ON_TORCH:
        assert not apart.any()
        return
    import torch

    def grads(function):
        xt = x.detach().clone().requires_grad_()
        gt, bt = (t.detach().clone().requires_grad_() for t in (gamma, beta))
        y = function(xt, gt, bt)
        y.float().square().sum().backward()
        return [y.detach(), xt.grad, gt.grad, bt.grad]

    ours = grads(lambda a, g, b: _torch_kernels.layer_norm(a, g, b, 1e-6))
    theirs = grads(
        lambda a, g, b: ops.layer_normalization(a, g, b, epsilon=1e-6)
    )
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("short_length", [192, 0], ids=["matmuls", "fused"])
def test_dot_product_attention_equals_the_written_out_attention(
    rng, monkeypatch, short_length
):
    """Both PyTorch forms (two matmuls and a softmax for short sequences,
    `F.scaled_dot_product_attention` otherwise) and the `keras.ops`
    fallback compute the written-out attention."""
    monkeypatch.setattr(_torch_kernels, "SHORT_ATTENTION_LENGTH", short_length)
    batch, length, heads, head_dim = 2, 7, 3, 4
    # Strided views of one fused q/k/v tensor, as `MultiHeadSelfAttention`
    # passes them.
    qkv = _tensor(rng, (batch, length, 3, heads, head_dim), scale=2.0)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scale = 1.0 / math.sqrt(5.0)  # not 1 / sqrt(head_dim): scale is used
    out = _torch_kernels.dot_product_attention(q, k, v, scale=scale)
    qn, kn, vn = (
        np.transpose(ops.convert_to_numpy(t), (0, 2, 1, 3)) for t in (q, k, v)
    )
    scores = np.einsum("bhqd,bhkd->bhqk", qn, kn) * scale
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = probs / probs.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bhkd->bqhd", probs, vn)
    assert tuple(out.shape) == (batch, length, heads, head_dim)
    assert_allclose(out, expected, atol=1e-5, rtol=1e-5)


def test_short_sequences_skip_the_fused_kernel_with_equal_gradients(
    rng, monkeypatch
):
    """On PyTorch, eager on a CPU, fewer than `SHORT_ATTENTION_LENGTH`
    queries run as matmuls (no `scaled_dot_product_attention` call); from
    that length on, the fused kernel runs. Both give the same values and
    gradients. Elsewhere the limit changes nothing: the `keras.ops`
    fallback runs either way."""
    kernels = []
    if ON_TORCH:
        import torch

        fused = torch.nn.functional.scaled_dot_product_attention

        def spy(*args, **kwargs):
            kernels.append(args[0].shape[-2])
            return fused(*args, **kwargs)

        monkeypatch.setattr(
            torch.nn.functional, "scaled_dot_product_attention", spy
        )
    else:
        fallback = _torch_kernels.ops.dot_product_attention

        def spy(*args, **kwargs):
            kernels.append("ops")
            return fallback(*args, **kwargs)

        monkeypatch.setattr(_torch_kernels.ops, "dot_product_attention", spy)
    values = _tensor(rng, (2, 7, 3, 3, 4), scale=2.0)
    upstream = _tensor(rng, (2, 7, 3, 4))
    results = []
    for short_length in (8, 7):
        monkeypatch.setattr(
            _torch_kernels, "SHORT_ATTENTION_LENGTH", short_length
        )
        if not ON_TORCH:
            results.append(
                _torch_kernels.dot_product_attention(
                    values[:, :, 0], values[:, :, 1], values[:, :, 2], 0.5
                )
            )
            continue
        qkv = values.clone().requires_grad_()
        out = _torch_kernels.dot_product_attention(
            qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], scale=0.5
        )
        out.backward(upstream)
        results.append((out.detach(), qkv.grad))
    if not ON_TORCH:
        assert kernels == ["ops", "ops"]
        assert_allclose(results[0], results[1], atol=0, rtol=0)
        return
    assert kernels == [7]  # only with 7 queries and a limit of 7
    assert_allclose(results[0][0], results[1][0], atol=1e-6)
    assert_allclose(results[0][1], results[1][1], atol=1e-5)


def test_kernels_take_the_torch_path_only_on_torch_tensors(rng, monkeypatch):
    """On PyTorch the torch kernels run (the `keras.ops` fallbacks are not
    called); elsewhere the fallbacks are what runs."""
    calls = []
    for name in ("matmul", "reshape", "layer_normalization", "unstack"):
        original = getattr(_torch_kernels.ops, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(_torch_kernels.ops, name, spy)
    x = _tensor(rng, (2, 5, 8))
    _torch_kernels.linear(x, _tensor(rng, (8, 8)), _tensor(rng, (8,)))
    _torch_kernels.reshape(x, (10, 8))
    _torch_kernels.layer_norm(x, _tensor(rng, (8,)), _tensor(rng, (8,)), 1e-6)
    _torch_kernels.unstack(x, 1)
    if ON_TORCH:
        assert calls == []
    else:
        # `linear` multiplies the (2, 5, 8) input as 10 rows of 8.
        assert calls == [
            "reshape",
            "matmul",
            "reshape",
            "reshape",
            "layer_normalization",
            "unstack",
        ]


def _onednn_spy(monkeypatch, preferred=True, min_macs=None):
    """Force `onednn_preferred()` (and optionally the size threshold) and
    record the oneDNN calls `linear` makes (PyTorch only)."""
    calls = []
    monkeypatch.setattr(_torch_kernels, "_PACKED", {})
    monkeypatch.setitem(_torch_kernels._ONEDNN, "preferred", preferred)
    monkeypatch.setitem(_torch_kernels._ONEDNN, "inference", preferred)
    if min_macs is not None:
        monkeypatch.setitem(_torch_kernels._ONEDNN, "minimum", min_macs)
    if ON_TORCH:
        import torch

        original = torch.ops.mkldnn._linear_pointwise

        def spy(*args):
            calls.append(tuple(args[0].shape))
            return original(*args)

        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    return calls


@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8), (0, 8)])
def test_linear_on_onednn_equals_the_formula(rng, monkeypatch, shape):
    """Where oneDNN is preferred (AMD CPUs), an inference call of at least
    the size threshold runs oneDNN's matmul (no autograd function), with
    the formula's values; the other backends never reach it."""
    calls = _onednn_spy(monkeypatch, min_macs=0)
    x = _tensor(rng, shape, scale=2.0)
    kernel = _tensor(rng, (8, 6))
    bias = _tensor(rng, (6,), scale=3.0)
    expected = np.matmul(
        ops.convert_to_numpy(x), ops.convert_to_numpy(kernel)
    ) + ops.convert_to_numpy(bias)
    if ON_TORCH:
        import torch

        with torch.no_grad():
            out = _torch_kernels.linear(x, kernel, bias)
        assert calls == [shape]
    else:
        out = _torch_kernels.linear(x, kernel, bias)
        assert calls == []
    assert tuple(out.shape) == shape[:-1] + (6,)
    assert_allclose(out, expected, atol=1e-5)


def _linear_case(rng):
    """A `(2, 5, 8)` input, `(8, 6)` kernel and `(6,)` bias (NumPy), and
    `x @ kernel + bias`."""
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    kernel = rng.normal(size=(8, 6)).astype("float32")
    bias = rng.normal(size=(6,)).astype("float32")
    return x, kernel, bias, x @ kernel + bias


def _formula_off_torch(calls, x, kernel, bias, expected):
    """Off the PyTorch backend, check that `linear` gives the formula's
    values and never reaches oneDNN, and return True; on it, False."""
    if ON_TORCH:
        return False
    out = _torch_kernels.linear(ops.convert_to_tensor(x), kernel, bias)
    assert_allclose(out, expected, atol=1e-5)
    assert calls == []
    return True


@pytest.mark.parametrize("input_grad", [True, False])
def test_linear_gradient_on_onednn_equals_the_formula(
    rng, monkeypatch, input_grad
):
    """A training call runs forward and backward on oneDNN (its own
    autograd function): input, kernel and bias gradients equal the
    formula's, and a product whose gradient is not needed is skipped."""
    calls = _onednn_spy(monkeypatch, min_macs=0)
    x_np, k_np, b_np, expected = _linear_case(rng)
    g_np = rng.normal(size=(2, 5, 6)).astype("float32")
    rows_x, rows_g = x_np.reshape(10, 8), g_np.reshape(10, 6)
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import torch

    x = torch.tensor(x_np, requires_grad=input_grad)
    kernel = torch.tensor(k_np, requires_grad=True)
    bias = torch.tensor(b_np, requires_grad=True)
    out = _torch_kernels.linear(x, kernel, bias)
    out.backward(torch.tensor(g_np))
    assert_allclose(out.detach(), expected, atol=1e-5)
    assert_allclose(kernel.grad, rows_x.T @ rows_g, atol=1e-5)
    assert_allclose(bias.grad, rows_g.sum(0), atol=1e-5)
    if input_grad:
        assert_allclose(x.grad, g_np @ k_np.T, atol=1e-5)
    # Forward (2, 5, 8) @ kernel; backward g @ kernelᵀ (10 rows) where the
    # input needs it, and xᵀ @ g (8 rows of 10) for the kernel.
    assert calls == [(2, 5, 8)] + [(10, 6)] * input_grad + [(8, 10)]


@pytest.mark.parametrize(
    "width_in, width_out, transposed",
    [(12, 3, (3, 40)), (3, 12, (3, 40)), (12, 12, (12, 40))],
)
def test_onednn_kernel_gradient_transposes_the_narrower_operand(
    rng, monkeypatch, width_in, width_out, transposed
):
    """The kernel gradient `xᵀ·g` over 40 rows takes oneDNN's product in
    the orientation whose transposed first operand is the narrower one
    (`gᵀ` when out < in, the `(out, in)` result transposed back): the
    formula's values either way, contiguous, in the kernel's shape."""
    calls = _onednn_spy(monkeypatch, min_macs=0)
    x_np = rng.normal(size=(4, 10, width_in)).astype("float32")
    k_np = rng.normal(size=(width_in, width_out)).astype("float32")
    b_np = rng.normal(size=(width_out,)).astype("float32")
    g_np = rng.normal(size=(4, 10, width_out)).astype("float32")
    expected = x_np @ k_np + b_np
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import torch

    kernel = torch.tensor(k_np, requires_grad=True)
    bias = torch.tensor(b_np, requires_grad=True)
    out = _torch_kernels.linear(torch.tensor(x_np), kernel, bias)
    out.backward(torch.tensor(g_np))
    rows_x, rows_g = x_np.reshape(40, -1), g_np.reshape(40, -1)
    assert_allclose(out.detach(), expected, atol=1e-5)
    assert_allclose(kernel.grad, rows_x.T @ rows_g, atol=1e-5)
    assert_allclose(bias.grad, rows_g.sum(0), atol=1e-5)
    assert kernel.grad.is_contiguous()
    assert calls == [(4, 10, width_in), transposed]


def test_linear_on_onednn_with_strided_views(rng, monkeypatch):
    """The Jumbo FFN's case: the input is the first tokens of each
    sequence (a strided view) and its output is concatenated back, so
    the upstream gradient arrives as a strided view too; values and
    gradients equal the formula's."""
    calls = _onednn_spy(monkeypatch, min_macs=0)
    t_np = rng.normal(size=(3, 5, 8)).astype("float32")
    k_np = rng.normal(size=(8, 8)).astype("float32")
    g_np = rng.normal(size=(3, 5, 8)).astype("float32")
    # Token 0 through the layer, tokens 1-4 as they are.
    expected = np.concatenate([t_np[:, :1] @ k_np, t_np[:, 1:]], axis=1)
    grad_t = g_np.copy()
    grad_t[:, :1] = g_np[:, :1] @ k_np.T
    grad_k = t_np[:, 0].T @ g_np[:, 0]
    if not ON_TORCH:
        tokens = ops.convert_to_tensor(t_np)
        out = ops.concatenate(
            [_torch_kernels.linear(tokens[:, :1], k_np), tokens[:, 1:]], 1
        )
        assert_allclose(out, expected, atol=1e-5)
        assert calls == []
        return
    import torch

    tokens = torch.tensor(t_np, requires_grad=True)
    kernel = torch.tensor(k_np, requires_grad=True)
    out = torch.cat(
        [_torch_kernels.linear(tokens[:, :1], kernel), tokens[:, 1:]], 1
    )
    out.backward(torch.tensor(g_np))
    assert len(calls) == 3
    assert_allclose(out.detach(), expected, atol=1e-5)
    assert_allclose(tokens.grad, grad_t, atol=1e-5)
    assert_allclose(kernel.grad, grad_k, atol=1e-5)


def test_linear_keeps_f_linear_below_the_threshold(rng, monkeypatch):
    """A product below the size threshold, and every product where oneDNN
    is not preferred, runs `F.linear` (forward and gradient)."""
    calls = _onednn_spy(monkeypatch)
    x_np = rng.normal(size=(4, 8)).astype("float32")
    k_np = rng.normal(size=(8, 6)).astype("float32")
    g_np = rng.normal(size=(4, 6)).astype("float32")
    if ON_TORCH:
        import torch

        kernel = torch.tensor(k_np, requires_grad=True)
        out = _torch_kernels.linear(torch.tensor(x_np), kernel)
        out.backward(torch.tensor(g_np))
        assert_allclose(out.detach(), x_np @ k_np, atol=1e-5)
        assert_allclose(kernel.grad, x_np.T @ g_np, atol=1e-5)
        monkeypatch.setitem(_torch_kernels._ONEDNN, "minimum", 0)
        monkeypatch.setitem(_torch_kernels._ONEDNN, "inference", False)
        with torch.no_grad():
            out = _torch_kernels.linear(torch.tensor(x_np), kernel)
        assert_allclose(out, x_np @ k_np, atol=1e-5)
    else:
        monkeypatch.setitem(_torch_kernels._ONEDNN, "minimum", 0)
        out = _torch_kernels.linear(ops.convert_to_tensor(x_np), k_np)
        assert_allclose(out, x_np @ k_np, atol=1e-5)
    assert calls == []


@pytest.mark.parametrize(
    "vendor, training, inference",
    [
        ("AuthenticAMD", True, True),
        ("GenuineIntel", False, True),
        ("ARM", False, False),
        ("", False, False),
    ],
)
def test_onednn_preferred_by_cpu_vendor(
    monkeypatch, vendor, training, inference
):
    """Decided once per process, for calls with and without a gradient:
    AMD CPUs (MKL runs its AVX2 kernels there) for both, Intel CPUs for
    inference only, and only with a PyTorch that has oneDNN's linear op."""
    monkeypatch.setattr(_torch_kernels, "_ONEDNN", {})
    monkeypatch.setattr(_torch_kernels, "_cpu_vendor", lambda: vendor)
    if not ON_TORCH:
        # No PyTorch kernels to prefer off the PyTorch backend.
        monkeypatch.setattr(_torch_kernels, "_has_onednn_linear", lambda: False)
        training = inference = False
    assert _torch_kernels.onednn_preferred() is training
    assert _torch_kernels.onednn_preferred(training=False) is inference
    minimum = _torch_kernels._onednn_minimum()
    assert minimum == (
        _torch_kernels.ONEDNN_MIN_MACS_INTEL
        if vendor == "GenuineIntel"
        else _torch_kernels.ONEDNN_MIN_MACS
    )
    assert _torch_kernels._ONEDNN == {
        "preferred": training,
        "inference": inference,
        "minimum": minimum,
    }
    monkeypatch.setattr(_torch_kernels, "_cpu_vendor", lambda: "changed")
    assert _torch_kernels.onednn_preferred() is training
    assert _torch_kernels._onednn_minimum() == minimum


def test_onednn_on_intel_for_inference_only(rng, monkeypatch):
    """On an Intel CPU (its inference-only setting), a call whose gradient
    is needed runs `F.linear`, the same call under `torch.no_grad()`
    oneDNN's matmul; values equal the formula's either way."""
    calls = _onednn_spy(monkeypatch, min_macs=0)
    monkeypatch.setitem(_torch_kernels._ONEDNN, "preferred", False)
    x_np, k_np, b_np, expected = _linear_case(rng)
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import torch

    kernel = torch.tensor(k_np, requires_grad=True)
    bias = torch.tensor(b_np, requires_grad=True)
    out = _torch_kernels.linear(torch.tensor(x_np), kernel, bias)
    assert calls == []
    assert_allclose(out.detach(), expected, atol=1e-5)
    with torch.no_grad():
        out = _torch_kernels.linear(torch.tensor(x_np), kernel, bias)
    assert calls == [(2, 5, 8)]
    assert_allclose(out, expected, atol=1e-5)


def _packing_spy(monkeypatch):
    """Force oneDNN for every inference call (the Intel setting) and
    record each oneDNN call as `(input shape, packed
    weight?)` (PyTorch only)."""
    calls = []
    monkeypatch.setattr(_torch_kernels, "_PACKED", {})
    monkeypatch.setattr(_torch_kernels, "PACKED_WEIGHTS", True)
    monkeypatch.setitem(_torch_kernels._ONEDNN, "preferred", False)
    monkeypatch.setitem(_torch_kernels._ONEDNN, "inference", True)
    monkeypatch.setitem(_torch_kernels._ONEDNN, "minimum", 0)
    if ON_TORCH:
        import torch

        original = torch.ops.mkldnn._linear_pointwise

        def spy(*args):
            calls.append((tuple(args[0].shape), args[1].is_mkldnn))
            return original(*args)

        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    return calls


def test_inference_packs_the_kernel_once_its_values_repeat(rng, monkeypatch):
    """Inference calls run on oneDNN's packed layout of the kernel from
    the second call that sees the same values, whatever the rows; an
    `assign` between calls is seen at the next one (the plain weight, the
    new values), which packs again only when they repeat; a call with
    gradient never uses the packed layout. Values equal the formula's at
    every call, and the packed weight's equal the plain one's bit for
    bit."""
    calls = _packing_spy(monkeypatch)
    x_np, k_np, b_np, _ = _linear_case(rng)
    kernel = keras.Variable(k_np)
    bias = keras.Variable(b_np)
    if not ON_TORCH:
        out = _torch_kernels.linear(ops.convert_to_tensor(x_np), kernel, bias)
        assert_allclose(out, x_np @ k_np + b_np, atol=1e-5)
        assert calls == []
        return
    import torch

    def call(x_np, k_np):
        with torch.no_grad():
            out = _torch_kernels.linear(
                torch.tensor(x_np), kernel.value, bias.value
            )
        assert_allclose(out, x_np @ k_np + b_np, atol=1e-5, rtol=1e-5)
        return ops.convert_to_numpy(out)

    outputs = [call(x_np[:1], k_np) for _ in range(3)]
    call(x_np, k_np)
    assert calls == [((1, 5, 8), False)] + [((1, 5, 8), True)] * 2 + [
        ((2, 5, 8), True)
    ]
    np.testing.assert_array_equal(outputs[0], outputs[1])
    new_k = rng.normal(size=(8, 6)).astype("float32")
    kernel.assign(new_k)
    del calls[:]
    call(x_np, new_k)
    call(x_np, new_k)
    assert calls == [((2, 5, 8), False), ((2, 5, 8), True)]
    del calls[:]
    x = torch.tensor(x_np, requires_grad=True)
    out = _torch_kernels.linear(x, kernel.value, bias.value)
    assert_allclose(out.detach(), x_np @ new_k + b_np, atol=1e-5, rtol=1e-5)
    assert calls == []  # Intel setting: F.linear where a gradient is needed
    monkeypatch.setitem(_torch_kernels._ONEDNN, "preferred", True)
    _torch_kernels.linear(x, kernel.value, bias.value).sum().backward()
    assert calls[0] == ((2, 5, 8), False)
    assert_allclose(x.grad, np.tile(new_k.sum(1), (2, 5, 1)), atol=1e-5)


def test_packed_weights_follow_the_kernel(rng, monkeypatch):
    """A packed layout lives as long as its kernel; with `PACKED_WEIGHTS`
    off nothing is packed; a kernel made under `torch.inference_mode()`
    (no version counter to notice writes by) is never packed. Values
    equal the formula's throughout."""
    calls = _packing_spy(monkeypatch)
    x_np, k_np, b_np, expected = _linear_case(rng)
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import gc

    import torch

    def calls_on(kernel):
        with torch.no_grad():
            for _ in range(3):
                out = _torch_kernels.linear(
                    torch.tensor(x_np), kernel, torch.tensor(b_np)
                )
                assert_allclose(out, expected, atol=1e-5, rtol=1e-5)
        packed = [p for _, p in calls]
        del calls[:]
        return packed

    kernel = torch.tensor(k_np)
    assert calls_on(kernel) == [False, True, True]
    assert list(_torch_kernels._PACKED) == [id(kernel)]
    del kernel
    gc.collect()
    assert _torch_kernels._PACKED == {}
    monkeypatch.setattr(_torch_kernels, "PACKED_WEIGHTS", False)
    assert calls_on(torch.tensor(k_np)) == [False] * 3
    monkeypatch.setattr(_torch_kernels, "PACKED_WEIGHTS", True)
    with torch.inference_mode():
        kernel = torch.tensor(k_np)
    assert calls_on(kernel) == [False] * 3
    assert _torch_kernels._PACKED == {}


def test_packed_entry_leaves_after_the_module_globals(rng, monkeypatch):
    """A packed kernel freed after `_torch_kernels`' globals are cleared
    (a script's global tensor at interpreter exit) still removes its entry
    from the table it was made in, without an error from the weak
    reference's callback."""
    calls = _packing_spy(monkeypatch)
    x_np, k_np, b_np, expected = _linear_case(rng)
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import gc
    import sys

    import torch

    table = _torch_kernels._PACKED
    kernel = torch.tensor(k_np)
    with torch.no_grad():
        for _ in range(2):
            out = _torch_kernels.linear(torch.tensor(x_np), kernel)
            assert_allclose(out, x_np @ k_np, atol=1e-5, rtol=1e-5)
    assert [p for _, p in calls] == [False, True]
    assert list(table) == [id(kernel)]
    errors = []
    monkeypatch.setattr(sys, "unraisablehook", errors.append)
    monkeypatch.setattr(_torch_kernels, "_PACKED", None)
    del kernel
    gc.collect()
    assert errors == []
    assert table == {}


class _CastLinear(_Linear):
    """`_Linear` on its variables' values, as the library's layers call
    `linear` (`layers._utils.dense`: `ops.cast` of the kernel)."""

    def call(self, x):
        return _torch_kernels.linear(
            x, ops.cast(self.kernel, x.dtype), ops.cast(self.bias, x.dtype)
        )


def test_packed_weights_stay_within_their_budget(rng, monkeypatch):
    """Kernels are packed while all packed copies fit in
    `PACKED_WEIGHTS_MAX_BYTES`; the one that would exceed it runs on its
    plain weight (the same values), and is packed once a packed kernel's
    death makes room and its values change."""
    calls = _packing_spy(monkeypatch)
    x_np, k_np, b_np, expected = _linear_case(rng)
    if _formula_off_torch(calls, x_np, k_np, b_np, expected):
        return
    import gc

    import torch

    size = k_np.size * 4
    monkeypatch.setattr(_torch_kernels, "PACKED_WEIGHTS_MAX_BYTES", 2 * size)
    kernels = [torch.tensor(k_np) for _ in range(3)]

    def packed_calls(kernel):
        del calls[:]
        with torch.no_grad():
            for _ in range(2):
                out = _torch_kernels.linear(torch.tensor(x_np), kernel)
                assert_allclose(out, x_np @ k_np, atol=1e-5, rtol=1e-5)
        return [packed for _, packed in calls]

    assert [packed_calls(k) for k in kernels] == [[False, True]] * 2 + [
        [False, False]
    ]
    assert _torch_kernels._kept_bytes(_torch_kernels._PACKED) == 2 * size
    del kernels[0]
    gc.collect()
    assert _torch_kernels._kept_bytes(_torch_kernels._PACKED) == size
    assert packed_calls(kernels[1]) == [False, False]  # no retry as is
    kernels[1].mul_(1.0)  # a write: its next values may be packed
    assert packed_calls(kernels[1]) == [False, True]


def test_packed_weights_see_every_training_step(rng, monkeypatch):
    """Packed inference weights between training steps of the library's
    AdamW (on PyTorch its fused kernel, whose writes torch's version
    counter would not see) and Keras' SGD: each prediction equals the
    formula on the weights of that moment."""
    calls = _packing_spy(monkeypatch)
    x = rng.normal(size=(4, 3, 8)).astype("float32")
    y = rng.normal(size=(4, 3, 6)).astype("float32")
    for optimizer in (optimizers.AdamW(0.1), keras.optimizers.SGD(0.1)):
        layer = _CastLinear()
        inputs = keras.Input((3, 8))
        model = keras.Model(inputs, layer(inputs))
        model.compile(optimizer=optimizer, loss="mse")
        for _ in range(3):
            for _ in range(2):
                kernel, bias = layer.get_weights()
                assert_allclose(
                    model.predict_on_batch(x), x @ kernel + bias, 1e-5, 1e-5
                )
            model.train_on_batch(x, y)
    assert [packed for _, packed in calls] == (
        [False, True] * 6 if ON_TORCH else []
    )


# --- summed_gradients: a shared kernel's gradient in one product ----------


def _shared_dense(rng, trainable=True):
    kernel = keras.Variable(
        (rng.normal(size=(8, 8)) / 3).astype("float32"), trainable=trainable
    )
    bias = keras.Variable(rng.normal(size=(8,)).astype("float32"))
    return kernel, bias


def _chain(x, kernel, bias):
    """Four uses of one kernel (the variables' values, as `dense` passes
    them): 3-D rows, a strided slice of them, no bias, 2-D rows; returns
    every use's output."""
    kernel, bias = kernel.value, bias.value
    h1 = ops.tanh(_torch_kernels.linear(x, kernel, bias))
    h2 = ops.tanh(_torch_kernels.linear(h1[:, ::2], kernel, bias))
    h3 = ops.tanh(_torch_kernels.linear(h2, kernel))
    h4 = _torch_kernels.linear(ops.reshape(h3, (-1, 8)), kernel, bias)
    return h1, h2, h3, h4


def _chain_gradients(x_np, kernel, bias, summed, upstream=None):
    """Input, kernel and bias gradients of `sum(_chain(...)[-1] *
    upstream)` (default: of its squares' sum), with `summed_gradients`
    over the kernel and bias or over nothing (PyTorch)."""
    import torch

    x = torch.tensor(x_np, requires_grad=True)
    for variable in (kernel, bias):
        variable.value.grad = None
    out = _torch_kernels.summed_gradients(
        [kernel, bias] if summed else [], lambda: _chain(x, kernel, bias)
    )[-1]
    upstream = out.detach() * 2 if upstream is None else upstream
    (out * torch.as_tensor(upstream)).sum().backward()
    return x.grad, kernel.value.grad.clone(), bias.value.grad.clone()


def _spy_entries(monkeypatch):
    """The `_Uses` entries each `summed_gradients` call makes."""
    made = []
    original = _torch_kernels._summed_entries

    def spy(variables):
        entries = original(variables)
        made.append(entries)
        return entries

    monkeypatch.setattr(_torch_kernels, "_summed_entries", spy)
    return made


def _off_torch_does_nothing(rng, monkeypatch):
    """False on PyTorch; elsewhere checks that `summed_gradients` sets
    nothing up (JAX and TensorFlow differentiate the traced step whole),
    and is True: the PyTorch autograd checks that follow do not apply."""
    if ON_TORCH:
        return False
    made = _spy_entries(monkeypatch)
    kernel, bias = _shared_dense(rng)
    _torch_kernels.summed_gradients(
        [kernel, bias], lambda: _torch_kernels._SUMMED.get() is None
    )
    assert _torch_kernels.summed_gradients([kernel, bias], lambda: 7) == 7
    assert _torch_kernels._SUMMED.get() is None
    assert made == [None, None]
    return True


def test_summed_gradients_keeps_values_on_every_backend(rng):
    kernel, bias = _shared_dense(rng)
    x = _tensor(rng, (2, 6, 8))
    expected = _chain(x, kernel, bias)[-1]
    out = _torch_kernels.summed_gradients(
        [kernel, bias], lambda: _chain(x, kernel, bias)
    )[-1]
    assert_allclose(out, expected, atol=1e-6)


def test_summed_gradients_equal_the_per_use_gradients(rng, monkeypatch):
    """Input, kernel and bias gradients through four uses (one without
    the bias, one on a strided view) equal autograd's per-use sum; the
    kernel and bias each took four uses and their rows were consumed by
    one backward computation."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return

    kernel, bias = _shared_dense(rng)
    x_np = rng.normal(size=(2, 6, 8)).astype("float32")
    g_np = rng.normal(size=(6, 8)).astype("float32")

    made = _spy_entries(monkeypatch)
    expected = _chain_gradients(x_np, kernel, bias, False, g_np)
    actual = _chain_gradients(x_np, kernel, bias, True, g_np)
    for a, e in zip(actual, expected, strict=True):
        assert_allclose(a, e, atol=1e-5, rtol=1e-5)
    entries = made[-1]
    uses = [entries[id(v.value)] for v in (kernel, bias)]
    assert [u.count for u in uses] == [4, 3]
    assert [u.rows for u in uses] == [{}, {}]


def test_summed_gradients_count_only_the_rows_of_their_own_pass(
    rng, monkeypatch
):
    """A pass that computes an input's gradient only leaves rows behind
    (the parameter's node is not run); a later pass on the same graph
    that reaches fewer uses must not count them."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return
    import torch

    kernel, bias = _shared_dense(rng)
    x = torch.tensor(rng.normal(size=(2, 6, 8)).astype("float32"))
    x.requires_grad_(True)
    h1, h2, h3, h4 = _torch_kernels.summed_gradients(
        [kernel, bias], lambda: _chain(x, kernel, bias)
    )
    torch.autograd.grad(h4.sum(), [x], retain_graph=True)
    h1.sum().backward()
    rows = x.detach().numpy().reshape(-1, 8)
    k_np, b_np = (v.value.detach().numpy() for v in (kernel, bias))
    d = 1 - np.tanh(rows @ k_np + b_np) ** 2  # d h1.sum() / d pre-activation
    assert_allclose(kernel.value.grad, rows.T @ d, atol=1e-5, rtol=1e-5)
    assert_allclose(bias.value.grad, d.sum(0), atol=1e-5, rtol=1e-5)


def test_summed_gradients_apply_only_where_autograd_runs_eagerly(
    rng, monkeypatch
):
    """No entries (the usual `linear`) without gradients, for a frozen
    variable, under `torch.compile`, or with no variables."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return
    import torch

    kernel, bias = _shared_dense(rng)
    frozen, _ = _shared_dense(rng, trainable=False)
    made = _spy_entries(monkeypatch)
    x = _tensor(rng, (3, 8))

    def uses():
        _torch_kernels.linear(x, kernel.value, bias.value)
        return _torch_kernels._summed_uses(kernel.value, bias.value)

    with torch.no_grad():
        assert _torch_kernels.summed_gradients([kernel, bias], uses) is None
    assert _torch_kernels.summed_gradients([frozen], uses) is None
    assert _torch_kernels.summed_gradients([], uses) is None
    # Under torch.compile nothing is set up, and `linear` does not read
    # the entries of an eager caller (Dynamo cannot trace a ContextVar).
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert _torch_kernels.summed_gradients([kernel, bias], uses) is None
    assert not any(made)
    monkeypatch.undo()
    entries = _torch_kernels._summed_entries([kernel, bias])
    token = _torch_kernels._SUMMED.set(entries)
    try:
        assert _torch_kernels._summed_uses(kernel.value, bias.value)
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        assert _torch_kernels._summed_uses(kernel.value, bias.value) is None
    finally:
        _torch_kernels._SUMMED.reset(token)


def test_summed_gradients_on_onednn_use_one_kernel_product(rng, monkeypatch):
    """Where oneDNN is preferred: the same gradients, with the kernel's
    computed by one oneDNN product over the rows of all its uses."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return

    kernel, bias = _shared_dense(rng)
    x_np = rng.normal(size=(2, 6, 8)).astype("float32")

    expected = _chain_gradients(x_np, kernel, bias, summed=False)
    calls = _onednn_spy(monkeypatch, min_macs=0)
    actual = _chain_gradients(x_np, kernel, bias, summed=True)
    for a, e in zip(actual, expected, strict=True):
        assert_allclose(a, e, atol=1e-5, rtol=1e-5)
    # Forward: 4 products; backward: 4 input gradients and one kernel
    # gradient over 12 + 6 + 6 + 6 rows.
    assert calls.count((8, 30)) == 1
    assert len(calls) == 9


def test_summed_gradients_on_onednn_of_a_narrowing_kernel(rng, monkeypatch):
    """A shared kernel whose output is narrower than its input (12 -> 3),
    used twice: its summed gradient is one oneDNN product with `gᵀ` (3 x
    40 rows of both uses) first, and equals the formula's."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return
    import torch

    kernel = keras.Variable((rng.normal(size=(12, 3)) / 3).astype("float32"))
    bias = keras.Variable(rng.normal(size=(3,)).astype("float32"))
    a_np = rng.normal(size=(4, 5, 12)).astype("float32")
    b_np = rng.normal(size=(20, 12)).astype("float32")
    ga_np = rng.normal(size=(4, 5, 3)).astype("float32")
    gb_np = rng.normal(size=(20, 3)).astype("float32")
    calls = _onednn_spy(monkeypatch, min_macs=0)

    def uses():
        return (
            _torch_kernels.linear(torch.tensor(a_np), kernel.value, bias.value),
            _torch_kernels.linear(torch.tensor(b_np), kernel.value, bias.value),
        )

    ya, yb = _torch_kernels.summed_gradients([kernel, bias], uses)
    loss = (ya * torch.tensor(ga_np)).sum() + (yb * torch.tensor(gb_np)).sum()
    loss.backward()
    rows_a, rows_ga = a_np.reshape(20, 12), ga_np.reshape(20, 3)
    assert_allclose(
        kernel.value.grad, rows_a.T @ rows_ga + b_np.T @ gb_np, atol=1e-5
    )
    assert_allclose(bias.value.grad, rows_ga.sum(0) + gb_np.sum(0), atol=1e-5)
    assert kernel.value.grad.is_contiguous()
    assert calls == [(4, 5, 12), (20, 12), (3, 40)]


def test_transformer_encoder_sums_its_shared_jumbo_ffn_gradients(
    rng, monkeypatch
):
    """An encoder whose blocks share one Jumbo FFN (official release):
    same outputs on every backend and, on PyTorch, the same gradients for
    every weight as without the summation, which ran on the shared
    FFN's four weights."""
    from keras_jumbo.layers import MLP
    from keras_jumbo.layers import JumboBlock
    from keras_jumbo.layers import TransformerEncoder
    from keras_jumbo.layers import transformer_encoder
    from keras_jumbo.testing import randomize_weights

    encoder = TransformerEncoder(
        [
            JumboBlock(2, 16, jumbo_multiplier=2, share_jumbo_mlp=True)
            for _ in range(3)
        ],
        shared_jumbo_mlp=MLP(24),
    )
    x_np = rng.normal(size=(3, 2 + 5, 8)).astype("float32")
    encoder.build(x_np.shape)
    randomize_weights(encoder)
    made = _spy_entries(monkeypatch)

    def run(summed):
        if not summed:
            monkeypatch.setattr(
                transformer_encoder,
                "summed_gradients",
                lambda variables, function: function(),
            )
        if not ON_TORCH:
            return [encoder(ops.convert_to_tensor(x_np), training=True)]
        for variable in encoder.trainable_variables:
            variable.value.grad = None
        out = encoder(ops.convert_to_tensor(x_np), training=True)
        out.square().sum().backward()
        return [out.detach()] + [
            v.value.grad.clone() for v in encoder.trainable_variables
        ]

    actual = run(summed=True)
    entries = made[-1]
    expected = run(summed=False)
    for a, e in zip(actual, expected, strict=True):
        assert_allclose(a, e, atol=1e-5, rtol=1e-5)
    if ON_TORCH:
        shared = encoder.shared_jumbo_mlp.trainable_variables
        assert [entries[id(v.value)].count for v in shared] == [3] * 4


def _assert_one_graph(encoder, x):
    """Dynamo makes one graph, without breaks, of `encoder`'s forward on
    `x` at inference and of a loss on it in training."""
    import torch

    def inference(x):
        with torch.no_grad():
            return encoder(x, training=False)

    def training(x):
        return encoder(x, training=True).square().sum()

    for function in (inference, training):
        explained = torch._dynamo.explain(function)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_shared_jumbo_ffn_encoder_compiles_without_graph_breaks(
    rng, monkeypatch
):
    """Under `torch.compile` the encoder's summation is not traced: Dynamo
    makes one graph of a shared-FFN encoder's forward, in training and at
    inference (a `ContextVar` read in every `linear` once broke it into
    one graph per product)."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return

    from keras_jumbo.layers import MLP
    from keras_jumbo.layers import JumboBlock
    from keras_jumbo.layers import TransformerEncoder

    encoder = TransformerEncoder(
        [
            JumboBlock(2, 16, jumbo_multiplier=2, share_jumbo_mlp=True)
            for _ in range(2)
        ],
        shared_jumbo_mlp=MLP(24),
    )
    x = _tensor(rng, (3, 2 + 5, 8))
    encoder(x)
    _assert_one_graph(encoder, x)


def test_patchtst_encoder_compiles_without_graph_breaks(rng, monkeypatch):
    """Dynamo makes one graph of a PatchTST encoder's forward (scores
    passed between blocks; the slice count read from its blocks), in
    training and at inference (`max(..., default=0)` there once broke
    it)."""
    if _off_torch_does_nothing(rng, monkeypatch):
        return

    from keras_jumbo.layers import PatchTSTEncoderBlock
    from keras_jumbo.layers import TransformerEncoder

    encoder = TransformerEncoder(
        [PatchTSTEncoderBlock(2, 16, name=f"block_{i}") for i in range(2)]
    )
    x = _tensor(rng, (3, 7, 8))
    encoder(x)
    _assert_one_graph(encoder, x)


def _post_op_spy(monkeypatch):
    """`_onednn_spy` (oneDNN forced at every size), recording the post-op
    of each oneDNN call ("none" or "gelu") instead of its shape."""
    _onednn_spy(monkeypatch, min_macs=0)
    post_ops = []
    if ON_TORCH:
        import torch

        recorded = torch.ops.mkldnn._linear_pointwise

        def spy(*args):
            post_ops.append(args[3])
            return recorded(*args)

        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", spy)
    return post_ops


def _erf_gelu(x):
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_gelu_on_onednn_equals_the_formula(rng, monkeypatch, with_bias):
    """An inference call runs the exact GELU as oneDNN's post-op, one
    call, with the erf formula's values; elsewhere (other backends) the
    two ops give them."""
    post_ops = _post_op_spy(monkeypatch)
    x_np = rng.normal(size=(2, 5, 8)).astype("float32") * 2.0
    k_np = rng.normal(size=(8, 6)).astype("float32")
    b_np = rng.normal(size=(6,)).astype("float32") if with_bias else None
    pre = x_np @ k_np + (0.0 if b_np is None else b_np)
    x, kernel = ops.convert_to_tensor(x_np), ops.convert_to_tensor(k_np)
    bias = None if b_np is None else ops.convert_to_tensor(b_np)
    if ON_TORCH:
        import torch

        with torch.no_grad():
            out = _torch_kernels.linear_gelu(x, kernel, bias)
    else:
        out = _torch_kernels.linear_gelu(x, kernel, bias)
    assert_allclose(out, _erf_gelu(pre), atol=1e-5)
    assert post_ops == (["gelu"] if ON_TORCH else [])


def test_linear_gelu_with_a_gradient_keeps_the_two_ops(rng, monkeypatch):
    """A call that needs a gradient (the backward pass reads the GELU's
    input) runs the product without post-op and `F.gelu` after it: the
    formula's values and kernel gradient."""
    post_ops = _post_op_spy(monkeypatch)
    x_np = rng.normal(size=(4, 8)).astype("float32")
    k_np = rng.normal(size=(8, 6)).astype("float32")
    g_np = rng.normal(size=(4, 6)).astype("float32")
    pre = x_np @ k_np
    if not ON_TORCH:
        out = _torch_kernels.linear_gelu(ops.convert_to_tensor(x_np), k_np)
        assert_allclose(out, _erf_gelu(pre), atol=1e-5)
        assert post_ops == []
        return
    import torch

    kernel = torch.tensor(k_np, requires_grad=True)
    out = _torch_kernels.linear_gelu(torch.tensor(x_np), kernel)
    out.backward(torch.tensor(g_np))
    density = np.exp(-0.5 * pre**2) / math.sqrt(2.0 * math.pi)
    derivative = 0.5 * (1.0 + np.vectorize(math.erf)(pre / math.sqrt(2.0)))
    derivative += pre * density
    assert_allclose(out.detach(), _erf_gelu(pre), atol=1e-5)
    assert_allclose(kernel.grad, x_np.T @ (g_np * derivative), atol=1e-5)
    assert "gelu" not in post_ops
    assert post_ops


def test_mlp_inference_on_onednn_applies_the_gelu_inside_the_matmul(
    rng, monkeypatch
):
    """`MLP` with the exact GELU at inference: fc1 with oneDNN's GELU
    post-op where oneDNN runs it (PyTorch), the formula's values on
    every backend, randomised weights; a training call the same values
    without the post-op."""
    from keras_jumbo.layers import MLP

    post_ops = _post_op_spy(monkeypatch)
    layer = MLP(hidden_dim=12, output_dim=5)
    x_np = rng.normal(size=(3, 4, 7)).astype("float32")
    layer.build(x_np.shape)
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    w1, b1, w2, b2 = (
        ops.convert_to_numpy(w)
        for w in (layer.fc1.kernel, layer.fc1.bias)
        + (layer.fc2.kernel, layer.fc2.bias)
    )
    expected = _erf_gelu(x_np @ w1 + b1) @ w2 + b2
    if not ON_TORCH:
        out = layer(ops.convert_to_tensor(x_np), training=False)
        assert_allclose(out, expected, atol=1e-4)
        assert post_ops == []
        return
    import torch

    with torch.no_grad():
        assert_allclose(layer(torch.tensor(x_np)), expected, atol=1e-4)
    assert post_ops == ["gelu", "none"]
    post_ops.clear()
    out = layer(torch.tensor(x_np), training=True)
    assert_allclose(out.detach(), expected, atol=1e-4)
    assert post_ops == ["none", "none"]


def test_parallel_branch_ffn_applies_the_gelu_inside_the_matmul(
    rng, monkeypatch
):
    """`ParallelBranchBlock`'s FFN branches at inference, λ = 0.3:
    each branch's fc1 with oneDNN's GELU post-op where oneDNN runs it
    (PyTorch), the paper's formula on every backend (h_b = x W1_b + b1_b,
    GELU(h_b + λ Σ_{b'≠b} h_b') W2_b + b2_b), randomised weights; a
    training call the same values without the post-op."""
    from keras_jumbo.layers import ParallelBranchBlock

    post_ops = _post_op_spy(monkeypatch)
    lam, n = 0.3, 3
    block = ParallelBranchBlock(
        num_heads=2, mlp_dim=12, num_branches=n, initial_lambda=lam
    )
    x_np = rng.normal(size=(2, 4, 8)).astype("float32")
    block.build(x_np.shape)
    for weight in block.trainable_weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32"))
    w1, b1, w2, b2 = (
        ops.convert_to_numpy(w).astype("float64")
        for w in (block.fc1_kernel, block.fc1_bias)
        + (block.fc2_kernel, block.fc2_bias)
    )
    h = [x_np @ w1[b] + b1[b] for b in range(n)]
    expected = [
        _erf_gelu(h[b] + lam * sum(h[c] for c in range(n) if c != b)) @ w2[b]
        + b2[b]
        for b in range(n)
    ]
    expected = np.stack(expected, axis=2)
    if not ON_TORCH:
        out = block.mlp_branch_outputs(ops.convert_to_tensor(x_np))
        assert_allclose(out, expected, atol=1e-4)
        assert post_ops == []
        return
    import torch

    with torch.no_grad():
        out = block.mlp_branch_outputs(torch.tensor(x_np))
    assert_allclose(out, expected, atol=1e-4)
    assert post_ops == ["gelu", "none"] * n
    post_ops.clear()
    out = block.mlp_branch_outputs(torch.tensor(x_np), training=True)
    assert_allclose(out.detach(), expected, atol=1e-4)
    assert post_ops == ["none", "none"] * n
