import math

import keras
from keras import ops

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import to_pair
from keras_jumbo.layers.conv2d import Conv2D
from keras_jumbo.layers.masked_layer_norm import MaskedLayerNorm


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ResidualSpatialReduction(keras.layers.Layer):
    """Halve the patch grid and widen the tokens (ViT-ResNAS §2.2, Fig. 3).

    Tokens are `[prefix tokens (CLS), patches on an H x W grid]`.

    Residual branch: one LayerNorm over every token; the normalised patch
    tokens are reshaped to the H x W grid and reduced by a 3x3 convolution
    with stride 2 and padding 1 (the reference's `Conv2d(k=3, s=2, p=1)`,
    symmetric zero padding -- not Keras' "same", which pads only the
    bottom/right for stride 2) to `output_dim` channels, plus new learned
    position embeddings of the `H/2 x W/2` grid; the normalised prefix
    tokens go through a Linear layer to `output_dim`.

    Main branch (no weights): 2x2 average pooling of the (un-normalised)
    patch grid, and the prefix tokens themselves, both zero-padded along
    the channels to `output_dim`. The output is the sum of the branches.

    The one LayerNorm is shared by the patch and prefix tokens, as in the
    reference implementation (the paper's Fig. 3 draws two "Norm" boxes;
    per-token normalisation with shared parameters is the same as two norms
    with tied parameters). It is a `MaskedLayerNorm`, i.e. a plain
    LayerNorm unless a channel mask is passed (NAS super-network).

    Args:
        output_dim: int, output width; must be >= the input width.
        num_prefix_tokens: int, leading non-patch tokens (1 = CLS).
        grid_size: int, pair or None, the input patch grid; None infers a
            square grid from the token count. Each side must be even.
        layer_norm_epsilon: float.
        kernel_initializer: initializer of the convolution and the Linear.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, num_prefix_tokens + H * W, D_in)`.
        channel_mask: optional `(batch, 1, D_in)` 0/1 mask of the active
            input channels (NAS super-network).
        output_channel_mask: optional `(batch, 1, output_dim)` mask of the
            active output channels; the output is multiplied by it.

    Returns:
        `(batch, num_prefix_tokens + H/2 * W/2, output_dim)`.

    Example:
    >>> layer = ResidualSpatialReduction(16)
    >>> layer(np.zeros((2, 1 + 8 * 8, 8))).shape
    (2, 17, 16)
    """

    def __init__(
        self,
        output_dim,
        num_prefix_tokens=1,
        grid_size=None,
        layer_norm_epsilon=1e-6,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.output_dim = check_positive_int("output_dim", output_dim)
        self.num_prefix_tokens = check_positive_int(
            "num_prefix_tokens", num_prefix_tokens, allow_zero=True
        )
        self.grid_size = (
            None if grid_size is None else to_pair("grid_size", grid_size)
        )
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def _grid(self, input_shape):
        patches = input_shape[1] - self.num_prefix_tokens
        if self.grid_size is not None:
            grid = self.grid_size
            if grid[0] * grid[1] != patches:
                raise ValueError(
                    f"grid_size={grid} does not match the {patches} patch "
                    f"tokens received. Received: input_shape={input_shape}"
                )
        else:
            side = math.isqrt(max(patches, 0))
            if side * side != patches:
                raise ValueError(
                    "ResidualSpatialReduction infers a square grid; give "
                    f"`grid_size` for {patches} patch tokens. Received: "
                    f"input_shape={input_shape}"
                )
            grid = (side, side)
        if grid[0] % 2 or grid[1] % 2:
            raise ValueError(
                "The patch grid must be divisible by 2 for the reduction. "
                f"Received: grid={grid}"
            )
        return grid

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        if input_shape[1] is None or dim is None:
            raise ValueError(
                "ResidualSpatialReduction needs a static token count and "
                f"width. Received: input_shape={input_shape}"
            )
        if self.output_dim < dim:
            raise ValueError(
                "`output_dim` must be >= the input width (the main branch "
                f"zero-pads channels). Received: output_dim={self.output_dim}"
                f", input width={dim}"
            )
        self.input_dim = dim
        self.grid = self._grid(input_shape)
        self.output_grid = (self.grid[0] // 2, self.grid[1] // 2)
        self.norm = MaskedLayerNorm(
            self.layer_norm_epsilon, dtype=self.dtype_policy, name="norm"
        )
        self.norm.build(input_shape)
        self.conv = Conv2D(
            self.output_dim,
            3,
            strides=2,
            padding="valid",
            data_format="channels_last",
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="conv",
        )
        self.conv.build((None, self.grid[0] + 2, self.grid[1] + 2, dim))
        self.token_dense = keras.layers.Dense(
            self.output_dim,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="token_dense",
        )
        self.token_dense.build((None, self.num_prefix_tokens, dim))
        self.position_embedding = self.add_weight(
            name="position_embedding",
            shape=(*self.output_grid, self.output_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )

    def call(self, inputs, channel_mask=None, output_channel_mask=None):
        prefix = self.num_prefix_tokens
        height, width = self.grid
        pad_channels = self.output_dim - self.input_dim
        normed = call_sublayer(self.norm, inputs, channel_mask=channel_mask)

        # Residual branch.
        grid = ops.reshape(
            normed[:, prefix:], (-1, height, width, self.input_dim)
        )
        grid = ops.pad(grid, ((0, 0), (1, 1), (1, 1), (0, 0)))
        reduced = self.conv(grid)
        reduced = reduced + ops.cast(self.position_embedding, reduced.dtype)
        reduced = ops.reshape(
            reduced, (-1, math.prod(self.output_grid), self.output_dim)
        )
        tokens = self.token_dense(normed[:, :prefix])

        # Main branch.
        main_grid = ops.reshape(
            inputs[:, prefix:], (-1, height, width, self.input_dim)
        )
        pooled = ops.average_pool(
            main_grid,
            2,
            strides=2,
            padding="valid",
            data_format="channels_last",
        )
        pooled = ops.reshape(
            pooled, (-1, math.prod(self.output_grid), self.input_dim)
        )
        main = ops.concatenate([inputs[:, :prefix], pooled], axis=1)
        main = ops.pad(main, ((0, 0), (0, 0), (0, pad_channels)))

        outputs = ops.concatenate([tokens, reduced], axis=1) + main
        if output_channel_mask is not None:
            outputs = outputs * ops.cast(output_channel_mask, outputs.dtype)
        return outputs

    def compute_output_shape(self, input_shape):
        grid = self._grid(input_shape)
        length = self.num_prefix_tokens + (grid[0] // 2) * (grid[1] // 2)
        return (input_shape[0], length, self.output_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "output_dim": self.output_dim,
                "num_prefix_tokens": self.num_prefix_tokens,
                "grid_size": self.grid_size,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
