import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_jumbo")
class LayerScale(keras.layers.Layer):
    """Learned per-channel scale of a residual branch (CaiT, DeiT III).

    Args:
        init_value: float, initial value of every scale (e.g. 1e-4).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(..., channels)`.

    Returns:
        `inputs * gamma`, same shape.

    Example:
    >>> LayerScale(0.1)(np.ones((2, 4))).shape
    (2, 4)
    """

    def __init__(self, init_value=1e-4, **kwargs):
        super().__init__(**kwargs)
        if isinstance(init_value, bool) or not isinstance(
            init_value, (int, float)
        ):
            raise TypeError(
                "`init_value` must be a float. "
                f"Received: init_value={init_value!r}"
            )
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.gamma = self.add_weight(
            name="gamma",
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.init_value),
        )

    def call(self, inputs):
        return inputs * ops.cast(self.gamma, inputs.dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["init_value"] = self.init_value
        return config
