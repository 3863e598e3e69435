import keras
from keras import ops

from keras_jumbo.layers._utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ChannelMask(keras.layers.Layer):
    """A per-example prefix mask from one column of architecture codes.

    `mask[b, 0, c] = 1 if c < unit * codes[b, index] else 0`, shape
    `(batch, 1, width)`. `unit` turns a head count into channels (the head
    width); a block's keep flag uses `width=1`.

    Args:
        width: int, channels of the mask.
        index: int, the code column.
        unit: int, channels per code unit.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        codes: int architecture codes `(batch, code_length)`.

    Returns:
        `(batch, 1, width)` float mask.

    Example:
    >>> mask = ChannelMask(width=4, index=0, unit=2)
    >>> np.asarray(mask(np.array([[1], [2]])))[:, 0]
    array([[1., 1., 0., 0.],
           [1., 1., 1., 1.]], dtype=float32)

    Reference: ViT-ResNAS §2.3 (channel masks of the super-network).
    """

    def __init__(self, width, index, unit=1, **kwargs):
        super().__init__(**kwargs)
        self.width = check_positive_int("width", width)
        self.index = check_positive_int("index", index, allow_zero=True)
        self.unit = check_positive_int("unit", unit)

    def call(self, codes):
        active = ops.cast(codes[:, self.index], "int32") * self.unit
        channels = ops.arange(self.width, dtype="int32")
        mask = ops.less(channels[None, None, :], active[:, None, None])
        return ops.cast(mask, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1, self.width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"width": self.width, "index": self.index, "unit": self.unit}
        )
        return config


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ApplyChannelMask(keras.layers.Layer):
    """Zero the inactive channels: `inputs * channel_mask`.

    Call arguments:
        inputs: a list `[tokens, channel_mask]`: tokens
            `(batch, tokens, width)` and a `(batch, 1, width)` mask (a
            `ChannelMask` output), broadcast over the tokens.

    Returns:
        Same shape as `inputs`.

    Example:
    >>> tokens = np.ones((1, 2, 3), "float32")
    >>> mask = np.array([[[1.0, 1.0, 0.0]]], "float32")
    >>> np.asarray(ApplyChannelMask()([tokens, mask]))[0]
    array([[1., 1., 0.],
           [1., 1., 0.]], dtype=float32)
    """

    def call(self, inputs):
        tokens, channel_mask = inputs
        return tokens * ops.cast(channel_mask, tokens.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])
