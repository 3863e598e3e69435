"""LayerNorm and softmax with written-out gradients (JAX).

Autodiff of `ops.layer_normalization` and `ops.softmax` gives XLA:CPU a
chain of broadcasts that it fuses badly: the LayerNorm backward was fused
through the residual stream of every earlier block (recomputed per block),
the softmax materialised its broadcast denominators. The functions here
compute the same values with the textbook gradients, in a few elementwise
passes, through `keras.ops.custom_gradient`. A 12-layer ViT-Tiny training
step at 224 px, batch 16, went from 1.46 s to 0.78 s on 2 CPU cores
(`benchmarks/profile_train_step.py`; benchmarks/README.md).

They are used on the backends in `CLOSED_FORM_BACKENDS` (JAX); elsewhere
the stock ops run (PyTorch: `F.layer_norm` / `softmax` with their fused
backward already; TensorFlow measured no gain).
"""

import keras
from keras import ops

from keras_jumbo._half_precision import in_float32

CLOSED_FORM_BACKENDS = ("jax",)


def closed_form_gradients():
    """True when the running backend uses the written-out gradients."""
    return keras.backend.backend() in CLOSED_FORM_BACKENDS


def closed_form_layer_norm(x, gamma, beta, epsilon):
    """LayerNorm over the last axis whose gradient is written out.

    Forward: `(x - mean) / sqrt(var + epsilon) * gamma + beta`, statistics
    in float32 at least, result in `x`'s dtype. Backward, with `x̂` the
    normalised input, `r` the reciprocal standard deviation and
    `ĝ = dy * gamma`: `dx = r * (ĝ - mean(ĝ) - x̂ * mean(ĝ * x̂))`,
    `dgamma = sum(dy * x̂)`, `dbeta = sum(dy)` (sums over every axis but
    the last) — what autodiff gives. Needs `keras.ops.custom_gradient`
    (JAX, TensorFlow).
    """
    dtype = keras.backend.standardize_dtype(x.dtype)
    compute = keras.backend.result_type(dtype, "float32")
    x = ops.cast(x, compute)
    gamma = ops.cast(gamma, compute)
    beta = ops.cast(beta, compute)
    batch_axes = tuple(range(len(x.shape) - 1))

    @ops.custom_gradient
    def normalize(x, gamma, beta):
        mean = ops.mean(x, axis=-1, keepdims=True)
        centered = x - mean
        variance = ops.mean(ops.square(centered), axis=-1, keepdims=True)
        inverse = ops.rsqrt(variance + epsilon)
        normalized = centered * inverse

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            scaled = upstream * gamma
            dx = inverse * (
                scaled
                - ops.mean(scaled, axis=-1, keepdims=True)
                - normalized
                * ops.mean(scaled * normalized, axis=-1, keepdims=True)
            )
            return (
                dx,
                ops.sum(upstream * normalized, axis=batch_axes),
                ops.sum(upstream, axis=batch_axes),
            )

        return normalized * gamma + beta, grad

    return ops.cast(normalize(x, gamma, beta), dtype)


def shifted_exp(x, axis=-1):
    """`exp(x - max(x))` over `axis`: a softmax's numerators, none above 1
    (for a bfloat16 / float16 `x`, computed in float32 and rounded once:
    `keras_jumbo._half_precision.in_float32`)."""
    return in_float32(
        lambda x: ops.exp(x - ops.max(x, axis=axis, keepdims=True)), x
    )


def softmax(x, axis=-1):
    """`ops.softmax(x, axis)`; on `CLOSED_FORM_BACKENDS` with the gradient
    written out: `dx = p * (dp - sum(dp * p))` over `axis`. A bfloat16 /
    float16 `x` (and its gradient) is computed in float32 and rounded once
    (`keras_jumbo._half_precision.in_float32`)."""
    if not closed_form_gradients():
        return in_float32(lambda x: ops.softmax(x, axis=axis), x)

    def normalised(x):
        exp = ops.exp(x - ops.max(x, axis=axis, keepdims=True))
        return exp / ops.sum(exp, axis=axis, keepdims=True)

    @ops.custom_gradient
    def probabilities(x):
        p = in_float32(normalised, x)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            return in_float32(
                lambda p, dp: p * (dp - ops.sum(dp * p, axis, keepdims=True)),
                p,
                upstream,
            )

        return p, grad

    return probabilities(x)
