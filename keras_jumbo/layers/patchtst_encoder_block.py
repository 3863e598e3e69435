import keras

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers.attention import MultiHeadSelfAttention
from keras_jumbo.layers.batch_norm import BatchNormalization
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.stochastic_depth import StochasticDepth
from keras_jumbo.layers.vit_block import block_config
from keras_jumbo.layers.vit_block import set_block_arguments


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PatchTSTEncoderBlock(keras.layers.Layer):
    """The official PatchTST encoder layer (`TSTEncoderLayer`).

    Post-norm by default, as the official code (`pre_norm=False`): each
    norm follows its residual addition,

        x = N1(x + DropPath(Attn(x; scores_prev)))
        x = N2(x + DropPath(FFN(x)))

    and with `norm_first=True` the norms move in front of the branches
    (`x + DropPath(f(N(x)))`). The norms are `BatchNormalization` over the
    width, statistics over batch and tokens (the official `norm="BatchNorm"`;
    PyTorch momentum 0.1 = Keras momentum 0.9), or `LayerNormalization`.
    With `residual_attention=True` (official `res_attention=True`) the
    previous block's scaled pre-softmax scores are added to this block's
    before the softmax. The block always returns its scores, so a stack
    threads them (`TransformerEncoder` does).

    The ViT-style PatchTST of the Jumbo paper uses `ViTBlock`/`JumboBlock`
    instead (pre-norm LayerNorm, no residual attention).

    Attributes: `attention`, `norm1`, `drop_path1`, `mlp`, `norm2`,
    `drop_path2`.

    Args:
        num_heads: int, must divide the width D.
        mlp_dim: int, hidden width of the FFN.
        dropout_rate: float, dropout in the FFN and after the attention
            projection.
        attention_dropout_rate: float, dropout of attention probabilities.
        drop_path_rate: float, stochastic depth of both branches.
        normalization: `"batch_norm"` (official default) or `"layer_norm"`.
        norm_first: bool, pre-norm instead of the official post-norm.
        residual_attention: bool, add the previous block's scores.
        layer_norm_epsilon: float > 0, epsilon of both norms.
        activation: FFN activation (`"gelu"`, exact).
        qkv_bias: bool.
        kernel_initializer: initializer of the Dense kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)`.
        training: bool.
        attention_scores: the previous block's scores `(batch, heads,
            length, length)`, or None (first block); only with
            `residual_attention=True`.

    Returns:
        A pair `(tokens, scores)`: `(batch, length, D)` and this block's
        scaled pre-softmax scores `(batch, heads, length, length)` (the
        previous block's included when `residual_attention=True`).

    Example:
    >>> block = PatchTSTEncoderBlock(num_heads=2, mlp_dim=16)
    >>> tokens, scores = block(np.zeros((2, 5, 8)))
    >>> tokens.shape, scores.shape
    ((2, 5, 8), (2, 2, 5, 5))
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        normalization="batch_norm",
        norm_first=False,
        residual_attention=True,
        layer_norm_epsilon=1e-5,
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
        self.normalization = check_choice(
            "normalization", normalization, {"batch_norm", "layer_norm"}
        )
        self.norm_first = check_bool("norm_first", norm_first)
        self.residual_attention = check_bool(
            "residual_attention", residual_attention
        )

    def _norm(self, name):
        if self.normalization == "batch_norm":
            return BatchNormalization(
                epsilon=self.layer_norm_epsilon,
                momentum=0.9,
                dtype=self.dtype_policy,
                name=name,
            )
        return LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        if dim is None or dim % self.num_heads:
            raise ValueError(
                "The model width must be divisible by `num_heads`. "
                f"Received: width={dim}, num_heads={self.num_heads}"
            )
        self.attention = MultiHeadSelfAttention(
            self.num_heads,
            qkv_bias=self.qkv_bias,
            attention_dropout_rate=self.attention_dropout_rate,
            dropout_rate=self.dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="attention",
        )
        self.attention.build(input_shape)
        self.mlp = MLP(
            self.mlp_dim,
            activation=self.activation,
            dropout_rate=self.dropout_rate,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="mlp",
        )
        self.mlp.build(input_shape)
        self.norm1 = self._norm("norm1")
        self.norm2 = self._norm("norm2")
        for norm in (self.norm1, self.norm2):
            norm.build(input_shape)
        self.drop_path1, self.drop_path2 = (
            StochasticDepth(
                self.drop_path_rate,
                dtype=self.dtype_policy,
                name=f"drop_path{i}",
            )
            for i in (1, 2)
        )

    def _sublayer(self, x, norm, fn, drop, training):
        """Post-norm `N(x + f(x))` or pre-norm `x + f(N(x))`."""
        if self.norm_first:
            normed = call_sublayer(norm, x, training=training)
            return x + dropout(drop, fn(normed), training)
        residual = x + dropout(drop, fn(x), training)
        return call_sublayer(norm, residual, training=training)

    def call(self, inputs, training=None, attention_scores=None):
        if attention_scores is not None and not self.residual_attention:
            raise ValueError(
                f"Block '{self.name}' has residual_attention=False and takes "
                "no previous scores. Received: attention_scores of shape "
                f"{tuple(attention_scores.shape)}"
            )
        scores = None

        def attend(hidden):
            nonlocal scores
            out, scores = call_sublayer(
                self.attention,
                hidden,
                training=training,
                previous_scores=attention_scores,
                return_scores=True,
            )
            return out

        x = self._sublayer(
            inputs, self.norm1, attend, self.drop_path1, training
        )
        x = self._sublayer(
            x,
            self.norm2,
            lambda h: call_sublayer(self.mlp, h, training=training),
            self.drop_path2,
            training,
        )
        return x, scores

    def compute_output_shape(self, input_shape):
        batch, length = input_shape[0], input_shape[1]
        return tuple(input_shape), (batch, self.num_heads, length, length)

    def get_config(self):
        config = super().get_config()
        config.update(block_config(self))
        config.update(
            {
                "normalization": self.normalization,
                "norm_first": self.norm_first,
                "residual_attention": self.residual_attention,
            }
        )
        return config
