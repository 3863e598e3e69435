import keras
from keras import ops

from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TokenDropping(keras.layers.Layer):
    """Randomly drop a fraction of patch tokens per example, in training.

    Each example keeps `round((1 - rate) * N)` (at least one) of its N
    patch tokens, chosen uniformly at random without replacement, in their
    original order; the first `num_prefix_tokens` tokens (CLS, registers,
    Jumbo) are always kept. At inference, or with `rate=0`, the layer is
    the identity. Used to speed up supervised training (Jumbo paper §4.2:
    90% -> 10% on ImageNet-21K; Dehghani et al. 2024).

    The number of kept tokens sets tensor shapes, which compiled (XLA,
    `tf.function`) train steps fix when they are traced, so the rate is a
    Python attribute changed with `set_rate`; `TokenDropSchedule` calls it
    and rebuilds the train function whenever the kept count changes.

    Args:
        rate: float in [0, 1), the fraction of patch tokens dropped.
        num_prefix_tokens: int >= 0, leading tokens never dropped.
        seed: int or None, seed of the layer's `SeedGenerator`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, num_prefix_tokens + N, D)`.
        training: bool.

    Returns:
        `(batch, num_prefix_tokens + kept, D)` in training, else `inputs`.

    Example:
    >>> layer = TokenDropping(rate=0.5)
    >>> layer(np.zeros((2, 16, 8)), training=True).shape
    (2, 8, 8)
    """

    def __init__(self, rate=0.0, num_prefix_tokens=0, seed=None, **kwargs):
        super().__init__(**kwargs)
        self.rate = check_rate("rate", rate)
        self.num_prefix_tokens = check_positive_int(
            "num_prefix_tokens", num_prefix_tokens, allow_zero=True
        )
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def set_rate(self, rate):
        """Change the drop rate; returns True if the kept count changed."""
        rate = check_rate("rate", rate)
        changed = getattr(self, "_num_patches", None) is not None and (
            self.num_kept(self._num_patches, rate)
            != self.num_kept(self._num_patches, self.rate)
        )
        self.rate = rate
        return changed

    @staticmethod
    def num_kept(num_patches, rate):
        """Number of patch tokens kept out of `num_patches` at `rate`."""
        return max(1, int(round((1.0 - rate) * num_patches)))

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        length = input_shape[1]
        if length is not None and length <= self.num_prefix_tokens:
            raise ValueError(
                "TokenDropping needs at least one token after the "
                f"{self.num_prefix_tokens} prefix tokens. Received: "
                f"input_shape={tuple(input_shape)}"
            )
        self._num_patches = (
            None if length is None else length - self.num_prefix_tokens
        )

    def call(self, inputs, training=None):
        if not training or self.rate == 0.0:
            return inputs
        num_patches = inputs.shape[1] - self.num_prefix_tokens
        keep = self.num_kept(num_patches, self.rate)
        prefix = inputs[:, : self.num_prefix_tokens]
        patches = inputs[:, self.num_prefix_tokens :]
        scores = keras.random.uniform(
            (ops.shape(inputs)[0], num_patches), seed=self.seed_generator
        )
        _, index = ops.top_k(scores, keep, sorted=False)
        index = ops.sort(index, axis=-1)
        kept = ops.take_along_axis(patches, index[..., None], axis=1)
        return ops.concatenate([prefix, kept], axis=1)

    def compute_output_shape(self, input_shape):
        # Symbolic shapes describe inference, where nothing is dropped.
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "rate": self.rate,
                "num_prefix_tokens": self.num_prefix_tokens,
                "seed": self.seed,
            }
        )
        return config
