import keras
from keras import ops

from keras_jumbo._torch_kernels import linear

# The backends whose training step XLA compiles by default. XLA:CPU hands a
# convolution and its kernel gradient to YNNPACK as convolutions; the kernel
# gradient of a 3x3 convolution becomes a convolution with a window the size
# of the image, which ran at ~13 GFLOP/s (75 ms each for ViT-Res's two
# 24-channel stem convolutions at 112x112, batch 8, on 2 CPU cores), and a
# 3-channel stride-2 convolution at ~5 GFLOP/s. As matmuls of shifted
# slices, both gradients are plain `xᵀ·g` matmuls (benchmarks/README.md,
# "Every model's step in wall time; ViT-Res's 3x3 convolutions as
# matmuls"). At inference (no gradient) XLA's own convolution is faster
# for the nine-matmul form, and far slower for a narrow input's one
# gathered matmul (3 channels: ~5 GFLOP/s, 52 ms against ~5 ms for
# ViT-Res-Tiny's first stem convolution at batch 16), so a call with
# `training` false or None keeps the gathered matmul and is otherwise
# XLA's convolution (ViT-Res-Tiny predict step, 224 px: 1.44x at batch 8,
# 1.34-1.36x at 16; benchmarks/README.md, twenty-second session).
# TensorFlow and PyTorch keep their convolution kernels (with XLA,
# TensorFlow's ViT-Res step was slower this way: 658 vs 625 ms).
SHIFTED_MATMUL_BACKENDS = ("jax",)

# Kernels of at most this many taps (3x3) are computed as shifted matmuls.
MAX_SHIFTED_TAPS = 9

# Inputs with fewer channels than this gather their taps into one matmul
# (im2col): with 3 channels, nine matmuls with a contraction of 3 are slower
# than one with a contraction of 27 (forward 46 vs 5 ms for ViT-Res's first
# stem convolution); with more channels the nine matmuls are faster, and
# they skip the gathered copy (9x the input).
IM2COL_MAX_CHANNELS = 8


def shifted_matmul_conv2d(inputs, kernel, strides):
    """`ops.conv(inputs, kernel, strides, padding="valid")` for a
    channels-last `inputs` with static height, width and channels, as
    matmuls of strided slices.

    Tap `(i, j)` of the kernel sees the slice of the input that starts at
    row `i`, column `j` and steps by the strides; the convolution is the sum
    over taps of that slice's rows times `kernel[i, j]`, `(in, out)`. Narrow
    inputs (fewer than `IM2COL_MAX_CHANNELS` channels) concatenate the
    slices along channels (tap-major, as the kernel's `(kh, kw, in)`
    layout) and multiply once. The rows are flattened to 2-D
    (`_torch_kernels.linear`), so each kernel gradient is one matmul.

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
    sh, sw = strides
    _, height, width, _ = inputs.shape
    row_span = sh * ((height - kh) // sh) + 1
    col_span = sw * ((width - kw) // sw) + 1
    taps = [
        inputs[:, i : i + row_span : sh, j : j + col_span : sw, :]
        for i in range(kh)
        for j in range(kw)
    ]
    if channels < IM2COL_MAX_CHANNELS:
        gathered = ops.concatenate(taps, axis=-1)
        return linear(gathered, ops.reshape(kernel, (kh * kw * channels, -1)))
    outputs = None
    for index, tap in enumerate(taps):
        term = linear(tap, kernel[index // kw, index % kw])
        outputs = term if outputs is None else outputs + term
    return outputs


@keras.saving.register_keras_serializable(package="keras_jumbo")
class Conv2D(keras.layers.Conv2D):
    """`keras.layers.Conv2D` (same arguments, weights, config and
    function) whose small kernels train as matmuls on JAX.

    On `SHIFTED_MATMUL_BACKENDS` (JAX), a call with `training=True` of a
    channels-last convolution with `padding="valid"`, no dilation, one
    group, at most `MAX_SHIFTED_TAPS` taps (3x3) and a static input size
    is `shifted_matmul_conv2d`: the same linear map, computed as matmuls of
    strided slices, whose kernel gradient XLA computes as plain matmuls
    instead of an image-sized convolution window (ViT-Res-Tiny, batch 8,
    JAX train step on 2 CPU cores: median 765 -> 699 ms; ViT-ResNAS-Tiny
    804 -> 734 ms; benchmarks/README.md). At inference (`training` false
    or None: `predict`, a plain call) only an input narrower than
    `IM2COL_MAX_CHANNELS` keeps that form (its taps gathered into one
    matmul, ~10x faster than XLA's convolution of 3 channels); a wider
    one is Keras' convolution, which XLA runs faster without a gradient
    (ViT-Res-Tiny predict step at 224 px: 1.44x at batch 8 with both).
    Every other case, and every other backend, is Keras' convolution. A
    gradient taken through a call at inference is still correct, only
    slower.

    The library's 3x3 convolutions (ViT-Res stem, `ResidualSpatialReduction`)
    are this layer; the patch embeddings (kernel = stride = patch) keep
    Keras' layer. Values equal Keras' to float rounding (the sums run in
    another order; tests compare to 1e-5).

    Call arguments:
        inputs: as `keras.layers.Conv2D`.
        training: bool or None; `True` selects the shifted matmuls on JAX
            (which a narrow input uses in either case).

    Example:
    >>> layer = Conv2D(4, 3, strides=2)
    >>> layer(np.zeros((2, 9, 9, 3)), training=True).shape
    (2, 4, 4, 4)
    """

    def _uses_shifted_matmul(self, inputs, training):
        channels = inputs.shape[-1]
        if not training and not (
            isinstance(channels, int) and channels < IM2COL_MAX_CHANNELS
        ):
            return False
        if keras.backend.backend() not in SHIFTED_MATMUL_BACKENDS:
            return False
        if (
            self.data_format != "channels_last"
            or self.padding != "valid"
            or self.groups != 1
            or tuple(self.dilation_rate) != (1, 1)
        ):
            return False
        kh, kw = self.kernel_size
        spatial = tuple(inputs.shape[1:])
        if kh * kw > MAX_SHIFTED_TAPS or not all(
            isinstance(d, int) for d in spatial
        ):
            return False
        return spatial[0] >= kh and spatial[1] >= kw

    def call(self, inputs, training=None):
        if not self._uses_shifted_matmul(inputs, training):
            return super().call(inputs)
        kernel = ops.cast(self.kernel, inputs.dtype)
        outputs = shifted_matmul_conv2d(inputs, kernel, tuple(self.strides))
        if self.use_bias:
            outputs = outputs + ops.cast(self.bias, outputs.dtype)
        if self.activation is not None:
            return self.activation(outputs)
        return outputs
