import keras

from keras_jumbo.layers.prefix_tokens import PrefixTokens


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ClassToken(PrefixTokens):
    """Prepend one learned CLS token of the input width (ViT §3.1).

    Args:
        initializer: token initializer, truncated normal (std 0.02) by
            default.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: tokens `(batch, length, dim)`.

    Returns:
        `(batch, 1 + length, dim)`, the CLS token first.

    Example:
    >>> ClassToken()(np.zeros((2, 16, 8))).shape
    (2, 17, 8)
    """

    @property
    def num_tokens(self):
        return 1
