import keras
from keras import ops

from keras_jumbo.layers._utils import check_rank


@keras.saving.register_keras_serializable(package="keras_jumbo")
class MaskedLayerNorm(keras.layers.Layer):
    """Layer normalisation over the active channels of a channel mask.

    ViT-ResNAS §2.3, Fig. 6: in a weight-sharing super-network, example b
    runs a sub-network whose width is a prefix of `k_b` of the C channels
    (the rest are zero). A plain LayerNorm would normalise over all C
    channels; masked layer norm computes the mean and variance over the
    `k_b` active channels only and outputs zero on the masked ones, so it
    equals `LayerNormalization` applied to the `k_b`-channel slice with the
    first `k_b` scales and offsets (tested). Without a mask it is exactly a
    `keras.layers.LayerNormalization` over the last axis (same `gamma` and
    `beta` weights).

    The variance is computed in two passes (`mean((x - mu)^2)` over the
    active channels) rather than the reference's `E[x^2] - mu^2`, which
    cancels badly in float16/bfloat16.

    Args:
        epsilon: float, added to the variance (1e-6, as ViT/timm).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(..., C)`.
        channel_mask: optional 0/1 tensor broadcastable to `inputs` (e.g.
            `(batch, 1, C)`), 1 on active channels. None normalises over all
            channels.

    Returns:
        Same shape as `inputs`.

    Example:
    >>> x = np.random.normal(size=(2, 3, 8))
    >>> mask = (np.arange(8) < 5).astype("float32")[None, None]
    >>> y = MaskedLayerNorm()(x, channel_mask=mask)  # == LN(x[..., :5])
    """

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
            raise TypeError(f"`epsilon` must be a float. Received: {epsilon!r}")
        if epsilon < 0:
            raise ValueError(f"`epsilon` must be >= 0. Received: {epsilon}")
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        if len(input_shape) < 2:
            check_rank(self, input_shape, 2)
        dim = input_shape[-1]
        if dim is None:
            raise ValueError(
                "The last axis of the input of MaskedLayerNorm must be "
                f"defined. Received: input_shape={input_shape}"
            )
        self.gamma = self.add_weight(
            name="gamma", shape=(dim,), initializer="ones"
        )
        self.beta = self.add_weight(
            name="beta", shape=(dim,), initializer="zeros"
        )

    def call(self, inputs, channel_mask=None):
        # Statistics in float32 at least (as keras LayerNormalization).
        dtype = inputs.dtype
        x = ops.cast(inputs, "float32")
        gamma = ops.cast(self.gamma, "float32")
        beta = ops.cast(self.beta, "float32")
        if channel_mask is None:
            mean = ops.mean(x, axis=-1, keepdims=True)
            var = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
            y = (x - mean) * ops.rsqrt(var + self.epsilon) * gamma + beta
            return ops.cast(y, dtype)
        mask = ops.cast(channel_mask, "float32")
        count = ops.maximum(ops.sum(mask, axis=-1, keepdims=True), 1.0)
        mean = ops.sum(x * mask, axis=-1, keepdims=True) / count
        centred = (x - mean) * mask
        var = ops.sum(ops.square(centred), axis=-1, keepdims=True) / count
        y = (centred * ops.rsqrt(var + self.epsilon) * gamma + beta) * mask
        return ops.cast(y, dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon})
        return config
