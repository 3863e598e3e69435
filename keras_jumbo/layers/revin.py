import keras
from keras import ops

from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_rank


@keras.saving.register_keras_serializable(package="keras_jumbo")
class RevIN(keras.layers.Layer):
    """Reversible instance normalisation (Kim et al., ICLR 2022).

    Normalises every series of a batch by its own statistics over time (per
    channel), as PatchTST does before patching, and undoes it on the
    forecast. Statistics are not differentiated through (`stop_gradient`),
    as the official RevIN/PatchTST code detaches them.

        forward:  y = (x - center) / std * weight + bias
        inverse:  x = (y - bias) / (weight + eps²) * std + center

    with `center` the mean over time (or the last value, `subtract_last`)
    and `std = sqrt(var + eps)` (biased variance).

    One layer does both directions, so the affine weights are shared:
    call it on the input series, then on the model's output with
    `reference=` the same input series (its statistics are recomputed, a
    cheap reduction, which keeps the layer a plain one-output layer).

    Args:
        affine: bool, learn a per-channel weight and bias (official
            PatchTST default: False in its scripts).
        subtract_last: bool, center on the last value instead of the mean.
        epsilon: float, added to the variance.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, time, channels)`.
        reference: None to normalise `inputs`; the original (unnormalised)
            series `(batch, L, channels)` to de-normalise `inputs` with its
            statistics.

    Returns:
        A tensor of the shape of `inputs`.

    Example:
    >>> revin = RevIN()
    >>> x = np.random.normal(size=(2, 32, 3))
    >>> np.allclose(revin(revin(x), reference=x), x, atol=1e-5)
    True

    Reference: Kim et al., "Reversible Instance Normalization for Accurate
    Time-Series Forecasting against Distribution Shift", ICLR 2022;
    PatchTST (Nie et al., ICLR 2023) §3.1.
    """

    def __init__(
        self, affine=False, subtract_last=False, epsilon=1e-5, **kwargs
    ):
        super().__init__(**kwargs)
        self.affine = check_bool("affine", affine)
        self.subtract_last = check_bool("subtract_last", subtract_last)
        self.epsilon = float(epsilon)
        if self.epsilon <= 0:
            raise ValueError(
                f"`epsilon` must be > 0. Received: epsilon={epsilon}"
            )

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(
                "RevIN needs a static channel axis. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        self.num_channels = channels
        if self.affine:
            self.weight = self.add_weight(
                name="weight", shape=(channels,), initializer="ones"
            )
            self.bias = self.add_weight(
                name="bias", shape=(channels,), initializer="zeros"
            )

    def statistics(self, series):
        """`(center, std)`, each `(batch, 1, channels)`, no gradient."""
        series = ops.cast(series, "float32")
        if self.subtract_last:
            center = series[:, -1:, :]
        else:
            center = ops.mean(series, axis=1, keepdims=True)
        variance = ops.var(series, axis=1, keepdims=True)
        std = ops.sqrt(variance + self.epsilon)
        return ops.stop_gradient(center), ops.stop_gradient(std)

    def call(self, inputs, reference=None):
        check_rank(self, inputs.shape, 3)
        if inputs.shape[-1] != self.num_channels:
            raise ValueError(
                f"Layer '{self.name}' was built for {self.num_channels} "
                f"channels. Received: input_shape={tuple(inputs.shape)}"
            )
        dtype = inputs.dtype
        x = ops.cast(inputs, "float32")
        if reference is None:
            center, std = self.statistics(x)
            x = (x - center) / std
            if self.affine:
                x = x * ops.cast(self.weight, x.dtype) + ops.cast(
                    self.bias, x.dtype
                )
            return ops.cast(x, dtype)
        center, std = self.statistics(reference)
        if self.affine:
            weight = ops.cast(self.weight, x.dtype)
            x = (x - ops.cast(self.bias, x.dtype)) / (
                weight + self.epsilon * self.epsilon
            )
        return ops.cast(x * std + center, dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "affine": self.affine,
                "subtract_last": self.subtract_last,
                "epsilon": self.epsilon,
            }
        )
        return config
