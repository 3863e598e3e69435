import keras

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_positive_float
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers._utils import get_activation
from keras_jumbo.layers.attention import MultiHeadSelfAttention
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.layers.layer_scale import LayerScale
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.stochastic_depth import StochasticDepth


def set_block_arguments(
    layer,
    num_heads,
    mlp_dim,
    dropout_rate,
    attention_dropout_rate,
    drop_path_rate,
    layer_norm_epsilon,
    activation,
    qkv_bias,
    kernel_initializer,
):
    """Validate the arguments every encoder block has and set them as
    attributes (`ViTBlock` and `PatchTSTEncoderBlock`)."""
    layer.num_heads = check_positive_int("num_heads", num_heads)
    layer.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
    layer.dropout_rate = check_rate("dropout_rate", dropout_rate)
    layer.attention_dropout_rate = check_rate(
        "attention_dropout_rate", attention_dropout_rate
    )
    layer.drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
    layer.layer_norm_epsilon = float(
        check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
    )
    get_activation(activation)
    layer.activation = activation
    layer.qkv_bias = check_bool("qkv_bias", qkv_bias)
    layer.kernel_initializer = keras.initializers.get(kernel_initializer)


def block_config(layer):
    """The config entries of `set_block_arguments`."""
    return {
        "num_heads": layer.num_heads,
        "mlp_dim": layer.mlp_dim,
        "dropout_rate": layer.dropout_rate,
        "attention_dropout_rate": layer.attention_dropout_rate,
        "drop_path_rate": layer.drop_path_rate,
        "layer_norm_epsilon": layer.layer_norm_epsilon,
        "activation": layer.activation,
        "qkv_bias": layer.qkv_bias,
        "kernel_initializer": keras.initializers.serialize(
            layer.kernel_initializer
        ),
    }


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ViTBlock(keras.layers.Layer):
    """The pre-norm ViT encoder block (ViT, DeiT, timm `Block`).

        x = x + DropPath(LS1(Attn(LN1(x))))
        x = x + DropPath(LS2(FFN(LN2(x))))

    Used by `ViT`, `RegistersViT`, the ViT-style PatchTST and `ViTRes`;
    `JumboBlock` (Jumbo paper) and `MaskedViTBlock` (ViT-ResNAS
    super-network) are built on it. Every attribute exists once the block
    is built: `norm1`, `attention`, `layer_scale1` (None without
    LayerScale), `drop_path1`, `norm2`, `mlp`, `layer_scale2`, `drop_path2`.

    Args:
        num_heads: int, attention heads; must divide the width D unless
            `head_dim` is given.
        mlp_dim: int, hidden width of the FFN.
        head_dim: int or None, width of each head (default D // num_heads;
            ViT-Res: MHSA-32_h on any width).
        dropout_rate: float, dropout in the FFN and after the attention
            projection.
        attention_dropout_rate: float, dropout of attention probabilities.
        drop_path_rate: float, stochastic-depth rate of both branches.
        layer_scale_init_value: float or None (default: no LayerScale).
        layer_norm_epsilon: float > 0.
        activation: FFN activation, `"gelu"` (exact, erf) by default.
        qkv_bias: bool, bias on the q/k/v projection.
        kernel_initializer: initializer of the Dense kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)` tokens.
        training: bool.

    Returns:
        `(batch, length, D)`.

    Example:
    >>> ViTBlock(num_heads=2, mlp_dim=32)(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        head_dim=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_scale_init_value=None,
        layer_norm_epsilon=1e-6,
        activation="gelu",
        qkv_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        set_block_arguments(
            self,
            num_heads,
            mlp_dim,
            dropout_rate,
            attention_dropout_rate,
            drop_path_rate,
            layer_norm_epsilon,
            activation,
            qkv_bias,
            kernel_initializer,
        )
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        self.head_dim = head_dim
        self.layer_scale_init_value = layer_scale_init_value

    # --- construction (subclasses reuse these) --------------------------
    def _norm(self, name):
        return LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _mlp(self, hidden_dim, name):
        return MLP(
            hidden_dim,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def _residual_tail(self, suffix, shape):
        """LayerScale (or None) and DropPath of one residual branch."""
        scale = None
        if self.layer_scale_init_value is not None:
            scale = LayerScale(
                self.layer_scale_init_value,
                dtype=self.dtype_policy,
                name=f"layer_scale{suffix}",
            )
            scale.build(shape)
        drop = StochasticDepth(
            self.drop_path_rate,
            dtype=self.dtype_policy,
            name=f"drop_path{suffix}",
        )
        return scale, drop

    def _check_input(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        if dim is None or (self.head_dim is None and dim % self.num_heads):
            raise ValueError(
                "The model width must be divisible by `num_heads` (or give "
                f"`head_dim`). Received: width={dim}, "
                f"num_heads={self.num_heads}"
            )
        return dim

    def _build_attention(self, input_shape):
        self.norm1 = self._norm("norm1")
        self.norm1.build(input_shape)
        self.attention = MultiHeadSelfAttention(
            self.num_heads,
            head_dim=self.head_dim,
            qkv_bias=self.qkv_bias,
            attention_dropout_rate=self.attention_dropout_rate,
            dropout_rate=self.dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="attention",
        )
        self.attention.build(input_shape)
        self.layer_scale1, self.drop_path1 = self._residual_tail(
            "1", input_shape
        )

    def _build_mlp(self, token_shape):
        self.norm2 = self._norm("norm2")
        self.norm2.build(token_shape)
        self.mlp = self._mlp(self.mlp_dim, "mlp")
        self.mlp.build(token_shape)
        self.layer_scale2, self.drop_path2 = self._residual_tail(
            "2", token_shape
        )

    def build(self, input_shape):
        dim = self._check_input(input_shape)
        self._build_attention(input_shape)
        self._build_mlp((input_shape[0], None, dim))

    # --- forward ------------------------------------------------------
    @staticmethod
    def _add(x, branch, scale, drop, training, mask=None):
        """`x + DropPath(LayerScale(branch))` (times `mask` if given)."""
        if scale is not None:
            branch = scale(branch)
        branch = dropout(drop, branch, training)
        if mask is not None:
            branch = branch * keras.ops.cast(mask, branch.dtype)
        return x + branch

    def attention_branch(self, x, training=None):
        """`x + DropPath(LS1(Attn(LN1(x))))`."""
        return self._add(
            x,
            call_sublayer(
                self.attention,
                call_sublayer(self.norm1, x),
                training=training,
            ),
            self.layer_scale1,
            self.drop_path1,
            training,
        )

    def attention_maps(self, x):
        """The block's attention maps `(batch, heads, length, length)` for
        its input `x`: `softmax(q kᵀ / sqrt(d))` of `LN1(x)`, as `call`
        computes them (no dropout). For attention-map distillation."""
        return self.attention.attention_probabilities(self.norm1(x))

    def mlp_branch(self, x, training=None):
        """`x + DropPath(LS2(FFN(LN2(x))))`."""
        return self._add(
            x,
            call_sublayer(
                self.mlp, call_sublayer(self.norm2, x), training=training
            ),
            self.layer_scale2,
            self.drop_path2,
            training,
        )

    def call(self, inputs, training=None):
        return self.mlp_branch(
            self.attention_branch(inputs, training), training
        )

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(block_config(self))
        config.update(
            {
                "head_dim": self.head_dim,
                "layer_scale_init_value": self.layer_scale_init_value,
            }
        )
        return config
