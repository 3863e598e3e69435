"""Shared helpers for keras_jumbo layers: argument checks and activations."""

import math

import keras
from keras import ops

from keras_jumbo._half_precision import in_float32
from keras_jumbo._keras_internals import dense_weights
from keras_jumbo._torch_kernels import exact_gelu
from keras_jumbo._torch_kernels import linear
from keras_jumbo._torch_kernels import linear_gelu
from keras_jumbo._torch_kernels import value_as

_SQRT_HALF = 1.0 / math.sqrt(2.0)


@keras.saving.register_keras_serializable(package="keras_jumbo")
def gelu(x):
    """Exact GELU written with `erf`: 0.5 * x * (1 + erf(x / sqrt(2))).

    Same values as `keras.activations.gelu(x, approximate=False)` and
    PyTorch's `nn.GELU()`, but expressed with `erf` so that exported graphs
    need no `Erfc` kernel (onnxruntime has none). On the PyTorch backend it
    is `torch.nn.functional.gelu`, the same function, as one kernel
    (`_torch_kernels.exact_gelu`): eager PyTorch runs the erf form as
    five element-wise kernels and one fused kernel is 10-20% of a pico
    ViT's inference there; exports always trace the TensorFlow backend,
    so they keep the erf form. A bfloat16 / float16 input is computed in
    float32 and rounded once (`keras_jumbo._half_precision.in_float32`),
    as PyTorch's `F.gelu` does.
    """
    if keras.backend.backend() == "torch":
        return exact_gelu(x)
    return in_float32(_erf_gelu, ops.convert_to_tensor(x))


def _erf_gelu(x):
    return 0.5 * x * (1.0 + ops.erf(x * _SQRT_HALF))


def dropout(layer, x, training=None):
    """`layer(x, training=training)` for a `Dropout` / `StochasticDepth`
    sublayer, skipped when its rate is 0 (an identity): a Keras layer call
    costs ~50 us in eager PyTorch, and a ViT has about nine such no-op
    calls per block. A skipped layer is still marked built: Keras runs a
    whole eager forward pass before every `predict_on_batch` / `fit` while
    any sublayer is unbuilt (3x slower JAX inference)."""
    if not layer.rate:
        if not layer.built:
            layer.build(x.shape)
        return x
    return layer(x, training=training)


def dense(layer, x):
    """`layer(x)` for a `keras.layers.Dense` sublayer, computed from its
    weights with `keras.ops` when it is a plain float layer (no
    activation, Keras LoRA or quantisation): the same function, without
    Keras' layer-call machinery, which costs ~200 us per call in eager
    PyTorch against ~20 us for the matmul and bias themselves (two Dense
    calls per FFN), and as one fused matmul-plus-bias kernel on PyTorch
    (`keras_jumbo._torch_kernels.linear`). A quantised or LoRA-enabled
    layer (`model.quantize`, `enable_lora`) goes through its own `call`,
    which knows its scales and adapters."""
    if not _plain_dense(layer):
        return layer(x)
    kernel, bias = dense_weights(layer)
    return linear(
        x,
        value_as(kernel, x),
        None if bias is None else value_as(bias, x),
    )


def dense_gelu(layer, x):
    """`gelu(dense(layer, x))`, the exact GELU of a `Dense` sublayer's
    output (an FFN's first layer). On PyTorch a plain float layer goes
    through `linear_then(gelu, ...)` on its weights; the same values."""
    if keras.backend.backend() != "torch" or not _plain_dense(layer):
        return gelu(dense(layer, x))
    kernel, bias = dense_weights(layer)
    return linear_then(
        gelu,
        x,
        value_as(kernel, x),
        None if bias is None else value_as(bias, x),
    )


def linear_then(activation, x, kernel, bias=None):
    """`activation(linear(x, kernel, bias))`. With the exact GELU
    (`gelu`, what `get_activation("gelu")` returns) on PyTorch:
    `keras_jumbo._torch_kernels.linear_gelu`, which applies the GELU
    inside oneDNN's matmul where an inference call runs on it (the same
    values); any other activation or backend, the two ops."""
    if activation is gelu and keras.backend.backend() == "torch":
        return linear_gelu(x, kernel, bias)
    return activation(linear(x, kernel, bias))


def _plain_dense(layer):
    """Whether `dense` may compute `layer(x)` from its weights: no
    activation, Keras LoRA or quantisation."""
    return (
        layer.quantization_mode is None
        and not layer.lora_enabled
        and layer.activation is keras.activations.linear
    )


def add_all(tensors):
    """The sum of a non-empty sequence of same-shape tensors."""
    total = tensors[0]
    for tensor in tensors[1:]:
        total = total + tensor
    return total


def get_activation(activation):
    """Resolve an activation; "gelu" maps to the exact erf form above."""
    if activation == "gelu":
        return gelu
    if activation == "gelu_approximate":
        return lambda x: keras.activations.gelu(x, approximate=True)
    return keras.activations.get(activation)


def check_positive_int(name, value, allow_zero=False):
    """Raise unless `value` is an int > 0 (or >= 0 with `allow_zero`)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"`{name}` must be an integer. Received: {name}={value!r} "
            f"(of type {type(value).__name__})"
        )
    low = 0 if allow_zero else 1
    if value < low:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"`{name}` must be {bound}. Received: {name}={value}")
    return value


def check_positive_float(name, value):
    """Raise unless `value` is a number > 0 (an epsilon, a width ratio)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{name}` must be a number > 0. Received: {name}={value!r}"
        )
    if not value > 0:
        raise ValueError(f"`{name}` must be > 0. Received: {name}={value}")
    return value


def check_number_in(name, value, low, high):
    """Raise unless `value` is a number in [low, high]; return a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{name}` must be a number. Received: {name}={value!r} "
            f"(of type {type(value).__name__})"
        )
    if not low <= value <= high:
        raise ValueError(
            f"`{name}` must be in [{low}, {high}]. Received: {name}={value}"
        )
    return float(value)


def check_value_range(value_range):
    """Raise unless `value_range` is a pair `(low, high)` with low < high;
    return it as two floats."""
    if (
        not isinstance(value_range, (tuple, list))
        or len(value_range) != 2
        or not value_range[0] < value_range[1]
    ):
        raise ValueError(
            "`value_range` must be a pair (low, high) with low < high. "
            f"Received: value_range={value_range!r}"
        )
    return tuple(float(v) for v in value_range)


def check_rate(name, value):
    """Raise unless `value` is a float in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"`{name}` must be a float in [0, 1). Received: {name}={value!r}"
        )
    if not 0.0 <= float(value) < 1.0:
        raise ValueError(
            f"`{name}` must be in [0, 1). Received: {name}={value}"
        )
    return float(value)


def check_bool(name, value):
    """Raise unless `value` is a bool."""
    if not isinstance(value, bool):
        raise TypeError(
            f"`{name}` must be a bool. Received: {name}={value!r} "
            f"(of type {type(value).__name__})"
        )
    return value


def check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {sorted(choices)}. "
            f"Received: {name}={value!r}"
        )
    return value


def to_pair(name, value):
    """Normalise an int or a pair of ints to a tuple of two positive ints."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value, value)
    if (
        not isinstance(value, (tuple, list))
        or len(value) != 2
        or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0
            for v in value
        )
    ):
        raise ValueError(
            f"`{name}` must be a positive int or a pair of positive ints. "
            f"Received: {name}={value!r}"
        )
    return tuple(value)


def check_last_dim(layer, input_shape, expected, what="features"):
    """Raise a ValueError naming the layer when the last axis is wrong."""
    got = input_shape[-1]
    if got is not None and expected is not None and got != expected:
        raise ValueError(
            f"Layer '{layer.name}' expects inputs with {expected} {what} on "
            f"the last axis. Received: input_shape={tuple(input_shape)}"
        )


def check_rank(layer, input_shape, rank):
    if len(input_shape) != rank:
        raise ValueError(
            f"Layer '{layer.name}' expects inputs of rank {rank}. "
            f"Received: input_shape={tuple(input_shape)}"
        )


def standardize_data_format(data_format):
    """`None` -> `keras.config.image_data_format()`; validate the value."""
    if data_format is None:
        data_format = keras.config.image_data_format()
    return check_choice(
        "data_format", data_format, {"channels_last", "channels_first"}
    )
