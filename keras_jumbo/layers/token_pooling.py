import keras
from keras import ops

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers.jumbo_token import jumbo_merge

POOLING_MODES = {"token", "avg", "jumbo", "official", "jumbo_avg"}


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TokenPooling(keras.layers.Layer):
    """Read a model's prefix/patch tokens into one vector for the head.

    Modes: `"token"` (token 0, the CLS token), `"avg"` (mean of the patch
    tokens after `num_prefix_tokens`), `"jumbo"` (the first J tokens
    reassembled into the `J * D` Jumbo token), `"official"` (the official
    Jumbo release: reassembled Jumbo token concatenated with the mean of the
    patch tokens, width `J * D + D`), `"jumbo_avg"` (the mean of the J
    split Jumbo tokens, width D; PatchTST+Jumbo, Jumbo paper A.2.3).

    Args:
        mode: one of `"token"`, `"avg"`, `"jumbo"`, `"official"`,
            `"jumbo_avg"`.
        num_prefix_tokens: int, the number of leading non-patch tokens
            (J for Jumbo models; 1 + R for CLS + registers).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, num_prefix_tokens + N, D)`.

    Returns:
        `(batch, width)`.
    """

    def __init__(self, mode, num_prefix_tokens, **kwargs):
        super().__init__(**kwargs)
        self.mode = check_choice("mode", mode, POOLING_MODES)
        self.num_prefix_tokens = check_positive_int(
            "num_prefix_tokens", num_prefix_tokens, allow_zero=True
        )

    def call(self, inputs):
        prefix = self.num_prefix_tokens
        if self.mode == "token":
            return inputs[:, 0]
        if self.mode == "avg":
            return ops.mean(inputs[:, prefix:], axis=1)
        if self.mode == "jumbo_avg":
            return ops.mean(inputs[:, :prefix], axis=1)
        jumbo = jumbo_merge(inputs[:, :prefix])
        if self.mode == "jumbo":
            return jumbo
        patches = ops.mean(inputs[:, prefix:], axis=1)
        return ops.concatenate([jumbo, patches], axis=-1)

    def compute_output_shape(self, input_shape):
        dim = input_shape[-1]
        width = {
            "token": dim,
            "avg": dim,
            "jumbo_avg": dim,
            "jumbo": self.num_prefix_tokens * dim,
            "official": (self.num_prefix_tokens + 1) * dim,
        }[self.mode]
        return (input_shape[0], width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}
        )
        return config
