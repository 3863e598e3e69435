"""Learned tokens prepended to a token sequence: CLS, registers, Jumbo."""

import keras
from keras import ops

from keras_jumbo.layers._utils import check_last_dim
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank


class PrefixTokens(keras.layers.Layer):
    """Base class: prepend `num_tokens` learned tokens of the input width.

    Subclasses define the `num_tokens` property and may change how the
    weight is stored (`_token_shape`); the call is the same for all.
    """

    def __init__(self, initializer=None, **kwargs):
        super().__init__(**kwargs)
        if initializer is None:
            initializer = keras.initializers.TruncatedNormal(stddev=0.02)
        self.initializer = keras.initializers.get(initializer)

    def _token_shape(self, hidden_dim):
        return (self.num_tokens, hidden_dim)

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        self.hidden_dim = input_shape[-1]
        if self.hidden_dim is None:
            raise ValueError(
                f"The last axis of the input of {type(self).__name__} must be "
                f"defined. Received: input_shape={input_shape}"
            )
        self.tokens = self.add_weight(
            name="tokens",
            shape=self._token_shape(self.hidden_dim),
            initializer=self.initializer,
        )

    def token_matrix(self):
        """The learned tokens as a `(num_tokens, hidden_dim)` tensor."""
        return ops.reshape(self.tokens, (self.num_tokens, self.hidden_dim))

    def call(self, inputs):
        check_last_dim(self, inputs.shape, self.hidden_dim)
        if self.num_tokens == 0:
            return inputs
        tokens = ops.cast(self.token_matrix(), inputs.dtype)
        batch = ops.shape(inputs)[0]
        tokens = ops.broadcast_to(
            tokens[None], (batch, self.num_tokens, self.hidden_dim)
        )
        return ops.concatenate([tokens, inputs], axis=1)

    def compute_output_shape(self, input_shape):
        length = input_shape[1]
        if length is not None:
            length += self.num_tokens
        return (input_shape[0], length, input_shape[2])

    def get_config(self):
        config = super().get_config()
        config["initializer"] = keras.initializers.serialize(self.initializer)
        return config


def check_num_tokens(name, value, allow_zero):
    return check_positive_int(name, value, allow_zero=allow_zero)
