import keras

from keras_jumbo.layers.prefix_tokens import PrefixTokens
from keras_jumbo.layers.prefix_tokens import check_num_tokens


@keras.saving.register_keras_serializable(package="keras_jumbo")
class Registers(PrefixTokens):
    """Prepend R learned register tokens (Darcet et al., ICLR 2024).

    Registers are extra global tokens that take part in attention and the
    shared FFN like any token; the model drops them after the encoder.
    Models place them between the CLS token and the patches
    (`[CLS, reg_1..reg_R, patches]`, Jumbo paper §2.1).

    Args:
        num_registers: int >= 0, the number R of registers (0: identity).
        initializer: token initializer, truncated normal (std 0.02) by
            default.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: tokens `(batch, length, dim)`.

    Returns:
        `(batch, R + length, dim)`, the registers first.

    Example:
    >>> Registers(4)(np.zeros((2, 16, 8))).shape
    (2, 20, 8)
    """

    def __init__(self, num_registers=16, initializer=None, **kwargs):
        super().__init__(initializer=initializer, **kwargs)
        self.num_registers = check_num_tokens(
            "num_registers", num_registers, allow_zero=True
        )

    @property
    def num_tokens(self):
        return self.num_registers

    def get_config(self):
        config = super().get_config()
        config["num_registers"] = self.num_registers
        return config
