import math

import keras
import numpy as np
from keras import ops

from keras_jumbo._torch_kernels import linear

# The backends whose convolutions XLA compiles by default. XLA:CPU hands a
# convolution and its kernel gradient to YNNPACK as convolutions; the kernel
# gradient of a 3x3 convolution becomes a convolution with a window the size
# of the image, which ran at ~13 GFLOP/s (75 ms each for ViT-Res's two
# 24-channel stem convolutions at 112x112, batch 8, on 2 CPU cores), and a
# 3-channel stride-2 convolution at ~5 GFLOP/s (benchmarks/README.md,
# "Every model's step in wall time; ViT-Res's 3x3 convolutions as
# matmuls"). So on these backends:
# - an input narrower than `IM2COL_MAX_CHANNELS` is one matmul of its taps
#   gathered along channels (im2col), in training and at inference
#   (ViT-Res-Tiny's first stem convolution at batch 16: ~5 against 52 ms);
# - a wider input is XLA's convolution, whose gradient in training is
#   written out (`conv2d_with_matmul_kernel_gradient`): the input gradient
#   as XLA's transposed convolution, the kernel gradient as `sliceᵀ · g`
#   matmuls over chunks of the batch.
# TensorFlow and PyTorch keep their convolution kernels (with XLA,
# TensorFlow's ViT-Res step was slower with matmuls: 658 vs 625 ms).
MATMUL_CONV_BACKENDS = ("jax",)

# Kernels of at most this many taps (3x3) take the paths above.
MAX_MATMUL_TAPS = 9

# Inputs with fewer channels than this gather their taps into one matmul
# (im2col): XLA's convolution of 3 channels runs at ~5 GFLOP/s (forward 52
# vs ~5 ms for ViT-Res-Tiny's first stem convolution at batch 16), and
# the gathered copy is small (9x a narrow input).
IM2COL_MAX_CHANNELS = 8

# The kernel gradient's slices are taken from chunks of the batch of at
# most this many bytes of input (at least one sample), each chunk's nine
# slices still in cache when its matmuls read them: for ViT-Res-Tiny's
# 24-channel stem convolutions (112x112), two images a chunk. Chunks of
# 2-8 images gave the same train step; one image a chunk was 9% slower
# (batch 32; benchmarks/README.md, twenty-third session).
KERNEL_GRADIENT_CHUNK_BYTES = 2**22


def _taps(inputs, kernel_size, strides, output_size):
    """The strided slices of `inputs` that tap `(i, j)` of a valid
    convolution multiplies, in the kernel's `(kh, kw)` order."""
    kh, kw = kernel_size
    sh, sw = strides
    row_span = sh * (output_size[0] - 1) + 1
    col_span = sw * (output_size[1] - 1) + 1
    return [
        inputs[:, i : i + row_span : sh, j : j + col_span : sw, :]
        for i in range(kh)
        for j in range(kw)
    ]


def _valid_output_size(input_size, kernel_size, strides):
    return tuple(
        (size - k) // s + 1
        for size, k, s in zip(input_size, kernel_size, strides, strict=True)
    )


def im2col_conv2d(inputs, kernel, strides):
    """`ops.conv(inputs, kernel, strides, padding="valid")` for a
    channels-last `inputs` with static height, width and channels, as one
    matmul of its taps gathered along channels (im2col).

    Tap `(i, j)` of the kernel sees the slice of the input that starts at
    row `i`, column `j` and steps by the strides; the slices are
    concatenated along channels (tap-major, as the kernel's `(kh, kw, in)`
    layout) and multiplied by the kernel reshaped to `(kh * kw * in, out)`,
    as 2-D rows (`_torch_kernels.linear`), so the kernel gradient is one
    plain matmul too. For narrow inputs: the gathered copy is `kh * kw`
    times the input.

    Args:
        inputs: `(batch, height, width, in)` tensor.
        kernel: `(kh, kw, in, out)` tensor.
        strides: pair of ints.

    Returns:
        `(batch, out_height, out_width, out)`, the same linear map as the
        convolution; values equal to float rounding (the sums are ordered
        differently).
    """
    kh, kw, channels, _ = kernel.shape
    output_size = _valid_output_size(inputs.shape[1:3], (kh, kw), strides)
    gathered = ops.concatenate(
        _taps(inputs, (kh, kw), strides, output_size), axis=-1
    )
    return linear(gathered, ops.reshape(kernel, (kh * kw * channels, -1)))


def _kernel_gradient(inputs, upstream, kernel_shape, strides):
    """The gradient of a valid convolution's `(kh, kw, in, out)` kernel:
    for each tap, its slice of `inputs` (as rows) transposed times the
    upstream gradient's rows, summed over the batch in chunks of at most
    `KERNEL_GRADIENT_CHUNK_BYTES` of input (a loop, `ops.map`)."""
    kh, kw, channels, filters = kernel_shape

    def chunk_gradient(x, g):
        rows = ops.reshape(g, (-1, filters))
        taps = _taps(x, (kh, kw), strides, tuple(g.shape[1:3]))
        per_tap = [
            ops.matmul(ops.transpose(ops.reshape(t, (-1, channels))), rows)
            for t in taps
        ]
        return ops.reshape(ops.stack(per_tap), kernel_shape)

    batch = inputs.shape[0]
    sample_bytes = (
        math.prod(inputs.shape[1:])
        * np.dtype(keras.backend.standardize_dtype(inputs.dtype)).itemsize
    )
    chunk = max(1, KERNEL_GRADIENT_CHUNK_BYTES // sample_bytes)
    if batch is None or chunk >= batch:
        return chunk_gradient(inputs, upstream)
    chunks = batch // chunk
    looped = chunks * chunk

    def stacked(t):
        return ops.reshape(t[:looped], (chunks, chunk) + tuple(t.shape[1:]))

    gradient = ops.sum(
        ops.map(
            lambda pair: chunk_gradient(*pair),
            (stacked(inputs), stacked(upstream)),
        ),
        axis=0,
    )
    if looped < batch:
        gradient = gradient + chunk_gradient(inputs[looped:], upstream[looped:])
    return gradient


def conv2d_with_matmul_kernel_gradient(inputs, kernel, strides):
    """`ops.conv(inputs, kernel, strides, padding="valid")` whose gradient
    is written out (`keras.ops.custom_gradient`), for a channels-last
    `inputs` with static height, width and channels. The layer calls it
    on JAX only: in a Keras train step, PyTorch's `custom_gradient` did
    not reach the variables, and TensorFlow 2.21's gave wrong gradients
    to some models built later in the same process (not this function's
    doing: a custom gradient of `x * k` alone did the same).

    Forward: the convolution. Gradient: for the input, the transposed
    convolution (`ops.conv_transpose`, the output padding restoring rows
    and columns the strides left unused); for the kernel, tap `(i, j)`'s
    strided slice of the input, as rows, transposed times the upstream
    gradient's rows (`_kernel_gradient`), instead of XLA:CPU's convolution
    with an image-sized window. The slices are taken a chunk of the batch
    at a time and are not kept from the forward pass: ViT-Res-Tiny's JAX
    train step at 224 px held 735 instead of 1032 MB of temporaries at
    batch 16 and ran 1.35x faster at batch 32 than with nine slice
    matmuls in the forward pass (benchmarks/README.md, twenty-third
    session). Like every `custom_gradient`, it has no forward-mode
    derivative (`jax.jvp`).

    Args:
        inputs: `(batch, height, width, in)` tensor.
        kernel: `(kh, kw, in, out)` tensor.
        strides: pair of ints.

    Returns:
        The convolution, `(batch, out_height, out_width, out)`.
    """
    strides = tuple(strides)
    kernel_shape = tuple(kernel.shape)
    height, width = inputs.shape[1:3]

    @ops.custom_gradient
    def convolution(x, k):
        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            out_h, out_w = upstream.shape[1:3]
            unused = (
                height - (strides[0] * (out_h - 1) + kernel_shape[0]),
                width - (strides[1] * (out_w - 1) + kernel_shape[1]),
            )
            dx = ops.conv_transpose(
                upstream,
                k,
                strides,
                padding="valid",
                output_padding=None if unused == (0, 0) else unused,
            )
            return dx, _kernel_gradient(x, upstream, kernel_shape, strides)

        return ops.conv(x, k, strides, padding="valid"), grad

    return convolution(inputs, kernel)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class Conv2D(keras.layers.Conv2D):
    """`keras.layers.Conv2D` (same arguments, weights, config and
    function) whose small kernels avoid XLA:CPU's slow convolution cases
    on JAX.

    On `MATMUL_CONV_BACKENDS` (JAX), a channels-last convolution with
    `padding="valid"`, no dilation, one group, at most `MAX_MATMUL_TAPS`
    taps (3x3) and a static input size runs as:

    - `im2col_conv2d` (one matmul of the gathered taps) when the input has
      fewer than `IM2COL_MAX_CHANNELS` channels, in training and at
      inference: ~10x faster than XLA's convolution of 3 channels;
    - `conv2d_with_matmul_kernel_gradient` when the call is in training
      (`training=True`: `fit`, the recipes' train steps): XLA's
      convolution forward, its kernel gradient as plain matmuls instead of
      an image-sized convolution window (ViT-Res-Tiny, JAX train step at
      224 px on 2 CPU cores: 1.35x at batch 32, 1.02-1.08x at 8, 16 and
      64, ~30% less memory for temporaries);
    - Keras' convolution at inference (`training` false or None:
      `predict`, a plain call), which XLA runs fastest without a gradient.

    Every other case, and every other backend, is Keras' convolution. A
    gradient taken through a call at inference is still correct, only
    slower. In training, the written-out gradient has no forward-mode
    derivative (`jax.jvp`, as any `custom_gradient`).

    The library's 3x3 convolutions (ViT-Res stem, `ResidualSpatialReduction`)
    are this layer; the patch embeddings (kernel = stride = patch) keep
    Keras' layer. Values and gradients equal Keras' to float rounding (the
    sums run in another order; tests compare values to 1e-5, gradients
    after an SGD step to 1e-4).

    Call arguments:
        inputs: as `keras.layers.Conv2D`.
        training: bool or None; `True` selects the written-out gradient on
            JAX for an input of `IM2COL_MAX_CHANNELS` channels or more.

    Example:
    >>> layer = Conv2D(4, 3, strides=2)
    >>> layer(np.zeros((2, 9, 9, 3)), training=True).shape
    (2, 4, 4, 4)
    """

    def _matmul_path(self, inputs, training):
        """`im2col_conv2d`, `conv2d_with_matmul_kernel_gradient`, or None
        (Keras' convolution) for this call."""
        if keras.backend.backend() not in MATMUL_CONV_BACKENDS:
            return None
        if (
            self.data_format != "channels_last"
            or self.padding != "valid"
            or self.groups != 1
            or tuple(self.dilation_rate) != (1, 1)
        ):
            return None
        kh, kw = self.kernel_size
        spatial = tuple(inputs.shape[1:])
        if kh * kw > MAX_MATMUL_TAPS or not all(
            isinstance(d, int) for d in spatial
        ):
            return None
        if spatial[0] < kh or spatial[1] < kw:
            return None
        if spatial[-1] < IM2COL_MAX_CHANNELS:
            return im2col_conv2d
        return conv2d_with_matmul_kernel_gradient if training else None

    def call(self, inputs, training=None):
        convolution = self._matmul_path(inputs, training)
        if convolution is None:
            return super().call(inputs)
        kernel = ops.cast(self.kernel, inputs.dtype)
        outputs = convolution(inputs, kernel, tuple(self.strides))
        if self.use_bias:
            outputs = outputs + ops.cast(self.bias, outputs.dtype)
        if self.activation is not None:
            return self.activation(outputs)
        return outputs
