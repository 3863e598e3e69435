import keras
from keras import ops

from keras_jumbo.layers._utils import check_rate


@keras.saving.register_keras_serializable(package="keras_jumbo")
class StochasticDepth(keras.layers.Layer):
    """Drop a whole residual branch per example (Huang et al. 2016).

    In training, each example's branch output is zeroed with probability
    `rate` and the survivors are scaled by `1 / (1 - rate)` (timm
    `DropPath`). Identity at inference.

    Args:
        rate: float in [0, 1), the drop probability.
        seed: int or None, seed of the layer's `SeedGenerator`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: branch output `(batch, ...)`.
        training: bool.

    Returns:
        Same shape as `inputs`.

    Example:
    >>> StochasticDepth(0.1)(np.ones((2, 3)), training=False).shape
    (2, 3)
    """

    def __init__(self, rate=0.0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_rate("rate", rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        # No weights: built at creation, like Keras' `Dropout` (a block
        # skips a rate-0 drop path, so it may never be called; an unbuilt
        # sublayer makes Keras run an eager build pass before predict/fit)
        self.built = True

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        keep = 1.0 - self.rate
        shape = (ops.shape(inputs)[0],) + (1,) * (len(inputs.shape) - 1)
        noise = keras.random.uniform(
            shape, dtype=inputs.dtype, seed=self.seed_generator
        )
        mask = ops.cast(noise < keep, inputs.dtype)
        return inputs * mask / keep

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
