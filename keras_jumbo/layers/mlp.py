import keras

from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import dense
from keras_jumbo.layers._utils import dense_gelu
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers._utils import gelu
from keras_jumbo.layers._utils import get_activation
from keras_jumbo.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_jumbo")
class MLP(keras.layers.Layer):
    """Transformer FFN: Dense(hidden) -> activation -> dropout -> Dense.

    Used for the patch FFN (width D, hidden `mlp_ratio * D`) and for the
    Jumbo FFN (width J*D, hidden `jumbo_mlp_ratio * J * D`). With the
    exact GELU on eager PyTorch, an inference call whose first layer runs
    on oneDNN's matmul applies the GELU inside it
    (`keras_jumbo._torch_kernels.linear_gelu`): the same values.

    Args:
        hidden_dim: int, width of the hidden layer.
        output_dim: int or None, output width (defaults to the input width).
        activation: activation name; `"gelu"` is the exact (erf) GELU.
        dropout_rate: float in [0, 1), dropout after the activation and
            after the output projection (timm `Mlp(drop=...)`).
        kernel_initializer: initializer of both kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(..., features)`.
        training: bool, enables dropout.
        hidden_mask: optional 0/1 tensor broadcastable to the hidden
            activations (e.g. `(batch, 1, hidden_dim)`), applied after the
            activation; a prefix of `f` hidden units kept is exactly the FFN
            of hidden width `f` (NAS super-network channel masking).

    Returns:
        `(..., output_dim)`.

    Example:
    >>> MLP(hidden_dim=16)(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(
        self,
        hidden_dim,
        output_dim=None,
        activation="gelu",
        dropout_rate=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        if output_dim is not None:
            check_positive_int("output_dim", output_dim)
        self.output_dim = output_dim
        self.activation = activation
        self._activation_fn = get_activation(activation)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.fc1 = keras.layers.Dense(
            hidden_dim,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="fc1",
        )
        self.fc2 = None
        self.dropout = Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="dropout"
        )

    def build(self, input_shape):
        out = self.output_dim or input_shape[-1]
        if out is None:
            raise ValueError(
                "The last axis of the input of MLP must be defined. "
                f"Received: input_shape={input_shape}"
            )
        self.fc1.build(input_shape)
        self.fc2 = keras.layers.Dense(
            out,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="fc2",
        )
        self.fc2.build((*input_shape[:-1], self.hidden_dim))

    def call(self, inputs, training=None, hidden_mask=None):
        if self._activation_fn is gelu:
            x = dense_gelu(self.fc1, inputs)
        else:
            x = self._activation_fn(dense(self.fc1, inputs))
        if hidden_mask is not None:
            x = x * keras.ops.cast(hidden_mask, x.dtype)
        x = dropout(self.dropout, x, training)
        x = dense(self.fc2, x)
        return dropout(self.dropout, x, training)

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], self.output_dim or input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "output_dim": self.output_dim,
                "activation": self.activation,
                "dropout_rate": self.dropout_rate,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
