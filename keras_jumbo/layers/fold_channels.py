import keras
from keras import ops

from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_jumbo")
class FoldChannels(keras.layers.Layer):
    """Move the channel axis into the batch (channel independence).

    PatchTST runs every channel of a multivariate series through one shared
    backbone as if it were its own example (Nie et al., ICLR 2023, §3.1):
    `(batch, channels, ...)` becomes `(batch * channels, ...)`; with
    `inverse=True`, `(batch * channels, ...)` becomes
    `(batch, channels, ...)` again. Keras' `Reshape` keeps the batch axis,
    hence this layer.

    Args:
        num_channels: int, C (needed for `inverse=True`; checked otherwise).
        inverse: bool, unfold instead of fold.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, C, ...)`, or `(batch * C, ...)` with `inverse`.

    Returns:
        `(batch * C, ...)`, or `(batch, C, ...)` with `inverse`.

    Example:
    >>> FoldChannels(3)(np.zeros((2, 3, 5, 8))).shape
    (6, 5, 8)
    >>> FoldChannels(3, inverse=True)(np.zeros((6, 8))).shape
    (2, 3, 8)
    """

    def __init__(self, num_channels, inverse=False, **kwargs):
        super().__init__(**kwargs)
        self.num_channels = check_positive_int("num_channels", num_channels)
        self.inverse = check_bool("inverse", inverse)

    def build(self, input_shape):
        if not self.inverse:
            if len(input_shape) < 2 or input_shape[1] != self.num_channels:
                raise ValueError(
                    f"Layer '{self.name}' folds {self.num_channels} channels "
                    "on axis 1. Received: "
                    f"input_shape={tuple(input_shape)}"
                )
        if any(d is None for d in input_shape[1:]):
            raise ValueError(
                "FoldChannels needs static shapes after the batch axis. "
                f"Received: input_shape={tuple(input_shape)}"
            )

    def call(self, inputs):
        rest = tuple(inputs.shape[1:])
        if self.inverse:
            return ops.reshape(inputs, (-1, self.num_channels, *rest))
        return ops.reshape(inputs, (-1, *rest[1:]))

    def compute_output_shape(self, input_shape):
        batch = input_shape[0]
        if self.inverse:
            if batch is not None:
                batch //= self.num_channels
            return (batch, self.num_channels, *input_shape[1:])
        if batch is not None:
            batch *= self.num_channels
        return (batch, *input_shape[2:])

    def get_config(self):
        config = super().get_config()
        config.update(
            {"num_channels": self.num_channels, "inverse": self.inverse}
        )
        return config
