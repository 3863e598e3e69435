import keras

from keras_jumbo._torch_kernels import reshape
from keras_jumbo.layers.prefix_tokens import PrefixTokens
from keras_jumbo.layers.prefix_tokens import check_num_tokens


def jumbo_merge(tokens):
    """Reassemble J split tokens `(batch, J, D)` into `(batch, J * D)`.

    Concatenation along the feature axis, token-major: feature `j * D + d`
    of the Jumbo token is feature `d` of split token `j` (Jumbo §3.2, and
    `rearrange("b l d -> b (l d)")` in the official code).
    """
    shape = tokens.shape
    return reshape(tokens, (-1, shape[1] * shape[2]))


def jumbo_split(token, jumbo_multiplier):
    """Split a Jumbo token `(batch, J * D)` into `(batch, J, D)`."""
    width = token.shape[-1] // jumbo_multiplier
    return reshape(token, (-1, jumbo_multiplier, width))


@keras.saving.register_keras_serializable(package="keras_jumbo")
class JumboToken(PrefixTokens):
    """Prepend the Jumbo CLS token, J times wider than the patches.

    The token is one learned vector of width `J * D` (Jumbo paper §3.2).
    It enters the sequence split into J tokens of width D, so the output is
    `[jumbo_1..jumbo_J, inputs]`; encoder blocks built with
    `jumbo_multiplier=J` treat the first J tokens as the split Jumbo token
    (attention with every token, then reassembled for the wide Jumbo FFN).

    Args:
        jumbo_multiplier: int >= 1, the multiplier J.
        initializer: initializer of the `J * D` vector, truncated normal
            (std 0.02) by default.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: patch tokens `(batch, length, D)`.

    Returns:
        `(batch, J + length, D)`.

    Example:
    >>> JumboToken(jumbo_multiplier=6)(np.zeros((2, 16, 8))).shape
    (2, 22, 8)

    Reference: Fuller et al., "Simpler Fast Vision Transformers with a
    Jumbo CLS Token", arXiv 2502.15021, §3.2.
    """

    def __init__(self, jumbo_multiplier=6, initializer=None, **kwargs):
        super().__init__(initializer=initializer, **kwargs)
        self.jumbo_multiplier = check_num_tokens(
            "jumbo_multiplier", jumbo_multiplier, allow_zero=False
        )

    @property
    def num_tokens(self):
        return self.jumbo_multiplier

    def _token_shape(self, hidden_dim):
        return (self.jumbo_multiplier * hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config["jumbo_multiplier"] = self.jumbo_multiplier
        return config
