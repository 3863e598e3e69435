"""`keras_jumbo._torch_kernels`: each op equals its `keras.ops` formula on
every backend, and reaches the PyTorch kernel only on PyTorch tensors."""

import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_jumbo import _torch_kernels
from keras_jumbo.testing import assert_allclose

ON_TORCH = keras.backend.backend() == "torch"


def _tensor(rng, shape, dtype="float32", scale=1.0):
    return ops.convert_to_tensor(
        (scale * rng.normal(size=shape)).astype("float32"), dtype=dtype
    )


def test_torch_tensors_only_for_backend_tensors(rng):
    x = _tensor(rng, (2, 3))
    assert _torch_kernels._torch_tensors(x, None) == ON_TORCH
    assert not _torch_kernels._torch_tensors(np.ones((2, 3)))
    assert not _torch_kernels._torch_tensors(x, keras.KerasTensor((2, 3)))


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


def test_dot_product_attention_equals_the_written_out_attention(rng):
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


def test_kernels_take_the_torch_path_only_on_torch_tensors(rng, monkeypatch):
    """On PyTorch the torch kernels run (the `keras.ops` fallbacks are not
    called); elsewhere the fallbacks are what runs."""
    calls = []
    for name in ("matmul", "reshape", "layer_normalization"):
        original = getattr(_torch_kernels.ops, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(_torch_kernels.ops, name, spy)
    x = _tensor(rng, (2, 5, 8))
    _torch_kernels.linear(x, _tensor(rng, (8, 8)), _tensor(rng, (8,)))
    _torch_kernels.reshape(x, (10, 8))
    _torch_kernels.layer_norm(x, _tensor(rng, (8,)), _tensor(rng, (8,)), 1e-6)
    if ON_TORCH:
        assert calls == []
    else:
        assert calls == ["matmul", "reshape", "layer_normalization"]
