"""`keras_jumbo._half_precision`: float32 inputs give exactly the
`keras.ops` result; bfloat16 ones on JAX (and TensorFlow under XLA) the
float64 function of the bfloat16 values rounded once to bfloat16
(float32 round-off apart), values and gradients. Elsewhere the products
are `keras.ops`' own (a product, then its bias, each rounded)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_jumbo import _half_precision
from keras_jumbo.layers._utils import gelu
from keras_jumbo.layers.closed_form import shifted_exp
from keras_jumbo.layers.closed_form import softmax
from keras_jumbo.testing import assert_allclose

BACKEND = keras.backend.backend()
# Where the module's own products and gradients run (the tests run on
# CPU): one rounding of each result; elsewhere one per `keras.ops` step.
ONCE_OR_TWICE = 1 if BACKEND == "jax" else 2
# One bfloat16 rounding (half an ulp, 2**-9 of the value) with room for
# the float32 sums' order, plus float32 round-off of a sum that cancels.
RELATIVE, ABSOLUTE = 2.0**-8, 1e-5


def _bf16(rng, shape, scale=1.0):
    """A bfloat16 tensor and its values as float64."""
    x = ops.convert_to_tensor(
        (scale * rng.normal(size=shape)).astype("float32"), dtype="bfloat16"
    )
    return x, _f64(x)


def _f64(x):
    return ops.convert_to_numpy(ops.cast(x, "float32")).astype("float64")


def _assert_rounded_once(got, expected, times=1):
    """`got` (bfloat16) is `expected` (float64) rounded to bfloat16 (at
    most `times` roundings away)."""
    assert keras.backend.standardize_dtype(got.dtype) == "bfloat16"
    error = np.abs(_f64(got) - expected)
    bound = times * RELATIVE * np.abs(expected)
    bound = bound + ABSOLUTE * np.abs(expected).max()
    assert (error <= bound).all(), (error - bound).max()


def _vjp(function, args, cotangent):
    """The gradients of `sum(cotangent * function(*args))` with respect to
    every one of `args`, on the running backend."""
    if BACKEND == "jax":
        import jax

        _, pullback = jax.vjp(function, *args)
        return pullback(cotangent)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            for arg in args:
                tape.watch(arg)
            y = function(*args)
        return tape.gradient(y, args, output_gradients=cotangent)
    args = [arg.detach().requires_grad_(True) for arg in args]
    function(*args).backward(cotangent)
    return [arg.grad for arg in args]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("shape", [(33, 24), (2, 9, 24)])
def test_matmul_of_bfloat16_is_the_product_rounded_once(rng, shape, with_bias):
    x, x64 = _bf16(rng, shape)
    kernel, kernel64 = _bf16(rng, (24, 40))
    bias, bias64 = _bf16(rng, (40,), scale=3.0)
    given = (x, kernel, bias) if with_bias else (x, kernel)
    out = _half_precision.matmul(*given)
    if BACKEND == "jax":
        _assert_rounded_once(out, x64 @ kernel64 + (bias64 if with_bias else 0))
    else:  # `keras.ops`' product, then its bias in bfloat16
        expected = ops.matmul(x, kernel)
        expected = expected + bias if with_bias else expected
        assert_allclose(out, expected, atol=0, rtol=0)
    g, g64 = _bf16(rng, (*shape[:-1], 40))
    grads = _vjp(_half_precision.matmul, given, g)
    rows64, g_rows64 = x64.reshape(-1, 24), g64.reshape(-1, 40)
    _assert_rounded_once(grads[0], g64 @ kernel64.T)
    _assert_rounded_once(grads[1], rows64.T @ g_rows64)
    if with_bias:
        _assert_rounded_once(grads[2], g_rows64.sum(axis=0))


@pytest.mark.parametrize(
    "subscripts",
    ["bhqk,bhsk->bhqs", "bhqs,bhsk->bhqk", "bsd,dhk->bhsk", "bhqk,hkd->bqd"],
)
def test_einsum_of_bfloat16_is_the_product_rounded_once(rng, subscripts):
    sizes = dict(b=2, h=3, q=5, s=6, k=8, d=7)
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    a, a64 = _bf16(rng, [sizes[c] for c in first])
    b, b64 = _bf16(rng, [sizes[c] for c in second])
    out = _half_precision.einsum(subscripts, a, b)
    _assert_rounded_once(out, np.einsum(subscripts, a64, b64))
    g, g64 = _bf16(rng, [sizes[c] for c in output])
    da, db = _vjp(
        lambda a, b: _half_precision.einsum(subscripts, a, b), [a, b], g
    )
    _assert_rounded_once(da, np.einsum(f"{output},{second}->{first}", g64, b64))
    _assert_rounded_once(db, np.einsum(f"{first},{output}->{second}", a64, g64))


@pytest.mark.parametrize(
    "subscripts, bias_shape",
    [("bsd,dhk->bhsk", (1, 3, 1, 8)), ("bhqk,hkd->bqd", (7,))],
)
def test_einsum_with_a_broadcast_bias(rng, subscripts, bias_shape):
    sizes = dict(b=2, h=3, q=5, s=6, k=8, d=7)
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    a, a64 = _bf16(rng, [sizes[c] for c in first])
    b, b64 = _bf16(rng, [sizes[c] for c in second])
    bias, bias64 = _bf16(rng, bias_shape, scale=3.0)
    out = _half_precision.einsum(subscripts, a, b, bias=bias)
    if BACKEND == "jax":
        _assert_rounded_once(out, np.einsum(subscripts, a64, b64) + bias64)
    else:  # `keras.ops`' product, then its bias in bfloat16
        expected = ops.einsum(subscripts, a, b) + bias
        assert_allclose(out, expected, atol=0, rtol=0)
    g, g64 = _bf16(rng, [sizes[c] for c in output])
    grads = _vjp(
        lambda a, b, bias: _half_precision.einsum(subscripts, a, b, bias=bias),
        [a, b, bias],
        g,
    )
    _assert_rounded_once(
        grads[0], np.einsum(f"{output},{second}->{first}", g64, b64)
    )
    _assert_rounded_once(
        grads[1], np.einsum(f"{first},{output}->{second}", a64, g64)
    )
    lead = g64.ndim - len(bias_shape)
    summed = g64.sum(axis=tuple(range(lead)))
    summed = summed.sum(
        axis=tuple(i for i, n in enumerate(bias_shape) if n == 1),
        keepdims=True,
    )
    _assert_rounded_once(
        grads[2], summed.reshape(bias_shape), times=ONCE_OR_TWICE
    )


def test_einsum_that_is_not_a_plain_product(rng):
    """An index summed within one operand (`k`, only in the first): no
    written-out gradient, the forward product still rounded once."""
    a, a64 = _bf16(rng, (4, 5, 6))
    b, b64 = _bf16(rng, (4,))
    assert not _half_precision._is_product("ijk,i->ij")
    out = _half_precision.einsum("ijk,i->ij", a, b)
    _assert_rounded_once(
        out, np.einsum("ijk,i->ij", a64, b64), times=ONCE_OR_TWICE
    )


def test_float32_is_exactly_keras_ops(rng):
    x = ops.convert_to_tensor(rng.normal(size=(2, 7, 12)).astype("float32"))
    kernel = ops.convert_to_tensor(rng.normal(size=(12, 5)).astype("float32"))
    bias = ops.convert_to_tensor(rng.normal(size=(5,)).astype("float32"))
    assert_allclose(
        _half_precision.matmul(x, kernel, bias),
        ops.matmul(x, kernel) + bias,
        atol=0,
        rtol=0,
    )
    assert_allclose(
        _half_precision.einsum("bsd,dk->bks", x, kernel),
        ops.einsum("bsd,dk->bks", x, kernel),
        atol=0,
        rtol=0,
    )
    assert_allclose(
        _half_precision.in_float32(ops.exp, x), ops.exp(x), atol=0, rtol=0
    )


def test_gelu_and_softmax_of_bfloat16_are_rounded_once(rng):
    from scipy.special import erf

    x, x64 = _bf16(rng, (3, 5, 16), scale=3.0)
    _assert_rounded_once(gelu(x), 0.5 * x64 * (1.0 + erf(x64 / np.sqrt(2))))
    shifted = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    if BACKEND == "torch":  # `keras.ops`' formula, each op rounded
        expected = ops.exp(x - ops.max(x, axis=-1, keepdims=True))
        assert_allclose(shifted_exp(x), expected, atol=0, rtol=0)
    else:
        _assert_rounded_once(shifted_exp(x), shifted)
    p64 = shifted / shifted.sum(axis=-1, keepdims=True)
    _assert_rounded_once(softmax(x), p64)
    g, g64 = _bf16(rng, (3, 5, 16))
    (dx,) = _vjp(softmax, [x], g)
    # The gradient of the rounded probabilities `p` (JAX's written-out
    # one, PyTorch's kernel), of the unrounded ones on TensorFlow (autodiff
    # through the float32 softmax); rounded once.
    p = p64 if BACKEND == "tensorflow" else _f64(softmax(x))
    expected = p * (g64 - (g64 * p).sum(axis=-1, keepdims=True))
    _assert_rounded_once(dx, expected)


def test_mixed_bfloat16_dense_layer_on_the_library_path(rng):
    """A `keras_jumbo` MLP under `mixed_bfloat16`: bfloat16 out, the
    float64 FFN of the same (bfloat16-rounded) weights and input within
    bfloat16 rounding of each step."""
    from keras_jumbo.layers import MLP

    layer = MLP(hidden_dim=32, dtype="mixed_bfloat16")
    x, x64 = _bf16(rng, (2, 9, 16))
    layer.build((2, 9, 16))
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype("float32") * 0.3)
    out = layer(x)
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    w1, b1, w2, b2 = (_f64(ops.cast(w, "bfloat16")) for w in layer.weights)
    from scipy.special import erf

    h = x64 @ w1 + b1
    h = 0.5 * h * (1.0 + erf(h / np.sqrt(2)))
    expected = h @ w2 + b2
    error = np.abs(_f64(out) - expected).max() / np.abs(expected).max()
    assert error < 2.0**-6, error


def _xla_vjp(function, args, cotangent):
    """`function(*args)` and its gradients (`_vjp`'s) traced and run by
    TensorFlow under XLA (`jit_compile=True`, as Keras compiles a step),
    and the op types of the traced graph."""
    import tensorflow as tf

    def run(*args):
        return function(*args), _vjp(function, args, cotangent)

    compiled = tf.function(run, jit_compile=True)
    out, grads = compiled(*args)
    graph = compiled.get_concrete_function(*args).graph
    return out, grads, {op.type for op in graph.get_operations()}


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA path")
@pytest.mark.parametrize(
    "subscripts, bias_shape",
    [
        ("mk,kn->mn", None),
        ("mk,kn->mn", (7,)),
        ("bhqk,bhsk->bhqs", None),
        ("bhqs,bhsk->bhqk", None),
        ("bsd,dhk->bhsk", (1, 3, 1, 8)),
        ("bhqk,hkd->bqd", (7,)),
    ],
)
def test_tensorflow_under_xla_rounds_once(rng, subscripts, bias_shape):
    """Traced for XLA on TensorFlow, the products are XLA dots asked for
    a float32 result (`XlaDotV2`), forward and gradients: each rounded
    once, as on JAX (`keras.ops`' products, each step rounded, outside
    XLA: the tests above)."""
    sizes = dict(b=2, h=3, q=5, s=6, k=8, d=7, m=9, n=7)
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    a, a64 = _bf16(rng, [sizes[c] for c in first])
    b, b64 = _bf16(rng, [sizes[c] for c in second])
    args, bias64 = [a, b], 0.0
    if bias_shape is not None:
        bias, bias64 = _bf16(rng, bias_shape, scale=3.0)
        args.append(bias)
    g, g64 = _bf16(rng, [sizes[c] for c in output])
    if subscripts == "mk,kn->mn":
        function = _half_precision.matmul
    else:

        def function(a, b, bias=None):
            return _half_precision.einsum(subscripts, a, b, bias=bias)

    out, grads, op_types = _xla_vjp(function, args, g)
    assert "XlaDotV2" in op_types and not op_types & {"MatMul", "Einsum"}
    _assert_rounded_once(out, np.einsum(subscripts, a64, b64) + bias64)
    _assert_rounded_once(
        grads[0], np.einsum(f"{output},{second}->{first}", g64, b64)
    )
    _assert_rounded_once(
        grads[1], np.einsum(f"{first},{output}->{second}", a64, g64)
    )
    if bias_shape is not None:
        lead = g64.ndim - len(bias_shape)
        summed = g64.sum(axis=tuple(range(lead)))
        summed = summed.sum(
            axis=tuple(i for i, n in enumerate(bias_shape) if n == 1),
            keepdims=True,
        )
        _assert_rounded_once(grads[2], summed.reshape(bias_shape))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's XLA path")
def test_tensorflow_under_xla_other_products_keep_keras_ops(rng):
    """Under XLA, a batched `matmul` (not 2-D) and einsums whose form
    TensorFlow's XLA:CPU may not run asked for a float32 result
    (`_tf_runs_wide`: batch axes not leading, two own axes of one
    operand) keep `keras.ops`' products (no `XlaDotV2`; a product, then
    its rounding); float32 operands too."""
    import tensorflow as tf

    x, x64 = _bf16(rng, (2, 9, 24))
    kernel, kernel64 = _bf16(rng, (2, 24, 5))
    p, p64 = _bf16(rng, (2, 3, 7, 7))
    v, v64 = _bf16(rng, (2, 7, 3, 8))
    rows, rows64 = _bf16(rng, (2, 6, 7))
    images, images64 = _bf16(rng, (2, 7, 5, 3))
    x32, kernel32 = ops.cast(x, "float32"), ops.cast(kernel, "float32")
    assert not _half_precision._tf_runs_wide("bhqs,bshk->bqhk")
    assert not _half_precision._tf_runs_wide("bij,bjwc->biwc")
    assert _half_precision._tf_runs_wide("bhqs,bhsk->bhqk")
    assert _half_precision._tf_runs_wide("bsd,dhk->bhsk")
    # Two summed indices: a gradient with two own axes of one operand.
    assert not _half_precision._tf_runs_wide("bqkj,bkjl->bql")

    def run(x, kernel, p, v, rows, images, x32, kernel32):
        return (
            _half_precision.matmul(x, kernel),
            _half_precision.einsum("bhqs,bshk->bqhk", p, v),
            _half_precision.einsum("bij,bjwc->biwc", rows, images),
            _half_precision.matmul(x32, kernel32),
        )

    args = (x, kernel, p, v, rows, images, x32, kernel32)
    compiled = tf.function(run, jit_compile=True)
    batched, attended, mixed, wide = compiled(*args)
    graph = compiled.get_concrete_function(*args).graph
    assert "XlaDotV2" not in {op.type for op in graph.get_operations()}
    _assert_rounded_once(batched, x64 @ kernel64, times=2)
    _assert_rounded_once(
        attended, np.einsum("bhqs,bshk->bqhk", p64, v64), times=2
    )
    _assert_rounded_once(
        mixed, np.einsum("bij,bjwc->biwc", rows64, images64), times=2
    )
    assert_allclose(wide, x64 @ kernel64, atol=1e-5, rtol=1e-5)
