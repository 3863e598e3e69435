import keras
from keras import ops

from keras_jumbo._torch_kernels import linear
from keras_jumbo._torch_kernels import reshape
from keras_jumbo._torch_kernels import value_as
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import standardize_data_format
from keras_jumbo.layers._utils import to_pair

# Backends on which the projection at inference is one matmul over the
# flattened patches (`PatchEmbedding._matmul_projection`) instead of the
# stride-P convolution. XLA's CPU runtime runs that convolution on one
# thread (4.3 ms of a 60 ms pico predict step at batch 64); the patches are
# gathered by one stack of column slices and projected by a two-threaded
# matmul (2.1 ms). On PyTorch it skips Keras' two layout copies around the
# convolution: pico predict at 128 px 1.015x at batch 64, 1.004x at 8,
# 1.01x at 1 (2-core Xeon, interleaved, 2026-11-29). The same function
# (tested). JAX's training keeps the convolution (no faster through its
# gradient).
MATMUL_INFERENCE_BACKENDS = ("jax", "torch")
# Backends on which a training call projects with that matmul too. On
# eager PyTorch the convolution's training step costs two layout copies of
# the image batch and oneDNN's convolution backward; the matmul's backward
# is one kernel-gradient product (the input gradient, where one is needed,
# the gather's). Pico's `train_on_batch` at 128 px, batch 32:
# 1.005-1.043x in three in-process A/Bs (2 Zen 4 cores; benchmarks/
# README.md, fifty-first session). The same values and gradients (tested).
MATMUL_TRAINING_BACKENDS = ("torch",)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PatchEmbedding(keras.layers.Layer):
    """Split an image into non-overlapping patches and project each one.

    `(batch, H, W, C)` (or `(batch, C, H, W)` with
    `data_format="channels_first"`) becomes a token grid
    `(batch, H / P_y, W / P_x, hidden_dim)`. The grid is always channels
    last, whatever the image layout, so that position embeddings and the
    encoder see one layout. The projection is a stride-P convolution, the
    same linear map as flattening each patch and applying a Dense layer
    (ViT, Dosovitskiy et al. 2021, eq. 1; Jumbo paper §2.1). Calls at
    inference on JAX, and every call on PyTorch, compute it in that
    second form (`_matmul_projection`: the patches gathered by one stack
    of column slices, one matmul): XLA runs the matmul on every CPU
    thread where it runs the convolution on one, and PyTorch skips Keras'
    layout copies around the convolution. The same numbers and gradients
    to float32 round-off (tested).

    Args:
        hidden_dim: int, width D of each patch token.
        patch_size: int or pair of ints, patch height and width in pixels.
        data_format: `"channels_last"` or `"channels_first"`; defaults to
            `keras.config.image_data_format()`.
        use_bias: bool, whether the projection has a bias.
        kernel_initializer: initializer for the projection kernel.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: images of rank 4. Height and width must be divisible by
            `patch_size`.

    Returns:
        Token grid `(batch, grid_h, grid_w, hidden_dim)`.

    Example:
    >>> layer = PatchEmbedding(hidden_dim=32, patch_size=4)
    >>> layer(np.zeros((2, 16, 16, 3))).shape
    (2, 4, 4, 32)
    """

    def __init__(
        self,
        hidden_dim,
        patch_size,
        data_format=None,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.patch_size = to_pair("patch_size", patch_size)
        self.data_format = standardize_data_format(data_format)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection = keras.layers.Conv2D(
            hidden_dim,
            kernel_size=self.patch_size,
            strides=self.patch_size,
            padding="valid",
            # Always NHWC: TensorFlow has no NCHW convolution on the CPU, so
            # channels-first images are transposed once in `call`.
            data_format="channels_last",
            use_bias=use_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="projection",
        )

    def _spatial(self, input_shape):
        if self.data_format == "channels_last":
            return input_shape[1], input_shape[2], input_shape[3]
        return input_shape[2], input_shape[3], input_shape[1]

    def build(self, input_shape):
        check_rank(self, input_shape, 4)
        height, width, _ = self._spatial(input_shape)
        for axis, size, patch in (
            ("height", height, self.patch_size[0]),
            ("width", width, self.patch_size[1]),
        ):
            if size is not None and size % patch:
                raise ValueError(
                    f"Image {axis} must be divisible by `patch_size`. "
                    f"Received: image {axis}={size}, "
                    f"patch_size={self.patch_size}"
                )
        self.num_channels = self._spatial(input_shape)[2]
        self.projection.build(
            (input_shape[0], height, width, self.num_channels)
        )

    def call(self, inputs, training=None):
        check_rank(self, inputs.shape, 4)
        channels = self._spatial(inputs.shape)[2]
        if channels is not None and channels != self.num_channels:
            raise ValueError(
                f"Layer '{self.name}' was built for {self.num_channels} "
                f"channels ({self.data_format}). Received: "
                f"input_shape={tuple(inputs.shape)}"
            )
        if self.data_format == "channels_first":
            inputs = ops.transpose(inputs, (0, 2, 3, 1))
        if self._uses_matmul(inputs.shape, training):
            return self._matmul_projection(inputs)
        return self.projection(inputs)

    def _uses_matmul(self, nhwc_shape, training):
        projection = self.projection
        backends = (
            MATMUL_TRAINING_BACKENDS if training else MATMUL_INFERENCE_BACKENDS
        )
        return (
            keras.backend.backend() in backends
            and None not in nhwc_shape[1:]
            and projection.quantization_mode is None
            and not projection.lora_enabled
        )

    def _matmul_projection(self, images):
        """The convolution as one matmul: each row of patches
        `(patch_h, grid_w, patch_w * C)` is regrouped patch by patch by a
        stack of `grid_w` column slices, so that every patch is one
        contiguous `(patch_h * patch_w * C)` row in the kernel's (HWIO)
        order, then projected by the reshaped kernel through `linear`, the
        library's dense product (on PyTorch oneDNN's matmul where it runs
        dense layers: pico's `(4096, 768)·(768, 96)` at batch 64 3.0
        against 4.0 ms for `torch.matmul` and the bias, 2 Zen 4 cores)."""
        height, width, channels = images.shape[1:]
        patch_h, patch_w = self.patch_size
        grid_h, grid_w = height // patch_h, width // patch_w
        # `reshape` / `value_as`: no Keras op dispatch per call on eager
        # PyTorch (the same ops elsewhere).
        rows = reshape(images, (-1, patch_h, grid_w, patch_w * channels))
        patches = ops.stack([rows[:, :, i] for i in range(grid_w)], axis=1)
        patches = reshape(patches, (-1, patch_h * patch_w * channels))
        kernel = reshape(
            value_as(self.projection.kernel, patches),
            (patch_h * patch_w * channels, self.hidden_dim),
        )
        bias = self.projection.bias if self.use_bias else None
        tokens = linear(
            patches, kernel, None if bias is None else value_as(bias, patches)
        )
        return reshape(tokens, (-1, grid_h, grid_w, self.hidden_dim))

    def compute_output_shape(self, input_shape):
        height, width, _ = self._spatial(input_shape)
        grid = [
            None if s is None else s // p
            for s, p in zip((height, width), self.patch_size, strict=True)
        ]
        return (input_shape[0], grid[0], grid[1], self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "patch_size": self.patch_size,
                "data_format": self.data_format,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
