import keras
from keras import ops

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_last_dim
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import to_pair


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PositionEmbedding(keras.layers.Layer):
    """Learned position embeddings added to a 2-D or 1-D patch-token grid.

    The table is stored at `grid_size`. When the layer receives a grid of
    another size (a model built at 128 px run on 224 px images), the table
    is resampled to the received grid with `keras.ops.image.resize`
    (`interpolation`, antialiased), as timm and the official Jumbo code do
    with `resample_abs_pos_embed`. Only patch tokens get position
    embeddings; prefix tokens (CLS, registers, Jumbo) do not.

    Note: bicubic kernels differ slightly between backends (JAX uses the
    Keys a=-0.5 kernel, PyTorch a=-0.75), so a resampled table matches
    across backends only to ~1e-2; at the stored grid the layer is exact.

    A one-element `grid_size=(N,)` makes it 1-D: inputs `(batch, N, dim)`
    (PatchTST's learned positional encoding; other lengths are resampled
    along the one axis the same way).

    Args:
        grid_size: int or pair, the stored table's grid (height, width);
            or a one-element tuple `(N,)` for a 1-D sequence of N patches.
        interpolation: resampling method for other grids, one of
            `"bicubic"`, `"bilinear"`, `"nearest"`.
        initializer: table initializer (truncated normal, std 0.02, as in
            ViT/timm).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: token grid `(batch, grid_h, grid_w, dim)`, or
            `(batch, N, dim)` for a 1-D `grid_size`.

    Returns:
        The grid plus the (resampled) table, same shape as `inputs`.

    Example:
    >>> layer = PositionEmbedding(grid_size=4)
    >>> layer(np.zeros((2, 6, 6, 8))).shape  # resampled to 6x6
    (2, 6, 6, 8)
    """

    def __init__(
        self,
        grid_size,
        interpolation="bicubic",
        initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if (
            isinstance(grid_size, (tuple, list))
            and len(grid_size) == 1
            and isinstance(grid_size[0], int)
            and not isinstance(grid_size[0], bool)
            and grid_size[0] > 0
        ):
            self.grid_size = (grid_size[0],)
        else:
            self.grid_size = to_pair("grid_size", grid_size)
        self.interpolation = check_choice(
            "interpolation", interpolation, {"bicubic", "bilinear", "nearest"}
        )
        if initializer is None:
            initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        self.initializer = keras.initializers.get(initializer)

    def build(self, input_shape):
        check_rank(self, input_shape, len(self.grid_size) + 2)
        self.hidden_dim = input_shape[-1]
        if self.hidden_dim is None:
            raise ValueError(
                "The last axis of the input of PositionEmbedding must be "
                f"defined. Received: input_shape={input_shape}"
            )
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(*self.grid_size, self.hidden_dim),
            initializer=self.initializer,
        )

    def resampled(self, grid_size):
        """The table resampled to `grid_size`: `(h, w, dim)` or `(n, dim)`."""
        one_d = len(self.grid_size) == 1
        if one_d:
            grid_size = tuple(grid_size)
        else:
            grid_size = to_pair("grid_size", grid_size)
        table = ops.convert_to_tensor(self.embeddings)
        if grid_size == self.grid_size:
            return table
        dtype = table.dtype
        image = table[:, None] if one_d else table  # 1-D: an (n, 1) grid
        resized = ops.image.resize(
            ops.cast(image[None], "float32"),
            (grid_size[0], 1) if one_d else grid_size,
            interpolation=self.interpolation,
            antialias=True,
            data_format="channels_last",
        )[0]
        if one_d:
            resized = resized[:, 0]
        return ops.cast(resized, dtype)

    def call(self, inputs):
        check_rank(self, inputs.shape, len(self.grid_size) + 2)
        check_last_dim(self, inputs.shape, self.hidden_dim)
        grid = tuple(inputs.shape[1:-1])
        if any(size is None for size in grid):
            raise ValueError(
                "PositionEmbedding needs a static grid size at call time. "
                f"Received: input_shape={inputs.shape}"
            )
        table = ops.cast(self.resampled(grid), inputs.dtype)
        return inputs + table[None]

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "grid_size": self.grid_size,
                "interpolation": self.interpolation,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config
