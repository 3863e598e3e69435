import keras

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.transformer_block import TransformerBlock


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TransformerEncoder(keras.layers.Layer):
    """A stack of `TransformerBlock`s, owning the shared Jumbo FFN.

    Holding the blocks in one layer (as keras-hub's `ViTEncoder` does) lets
    one Jumbo FFN be shared by every block and still save and reload as
    one shared set of weights.

    Args:
        depth: int, number of blocks.
        num_heads: int, attention heads.
        mlp_dim: int, hidden width of the patch FFN.
        jumbo_multiplier: int >= 0, J (0 = plain blocks).
        jumbo_mlp_dim: int, hidden width of the Jumbo FFN(s).
        share_jumbo_mlp: bool, one Jumbo FFN for all blocks.
        jumbo_lora_rank: int or None, per-block low-rank adapter on the
            shared Jumbo FFN.
        last_block_patch_mlp: bool, whether the last block has a patch FFN
            (False when the head reads only the Jumbo token; the paper
            discards those weights, §3.2).
        last_block_jumbo_mlp: bool, whether the last block has its Jumbo
            FFN branch (False when the head reads only patch tokens).
        dropout_rate, attention_dropout_rate: floats in [0, 1).
        drop_path_rate: float, stochastic depth of the last block.
        drop_path_schedule: `"linear"` (rate grows from 0 to
            `drop_path_rate` over depth, as timm/DeiT) or `"constant"`
            (every block uses `drop_path_rate`, as the official Jumbo code).
        layer_scale_init_value: float or None.
        layer_norm_epsilon: float.
        normalization: `"layer_norm"` or `"batch_norm"` (see
            `TransformerBlock`).
        norm_first: bool, pre-norm (True) or post-norm blocks.
        residual_attention: bool, each block adds the previous block's
            attention scores to its own (official PatchTST).
        activation: FFN activation.
        qkv_bias: bool.
        kernel_initializer: initializer of the Dense kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, J + N, D)`.
        training: bool.

    Returns:
        `(batch, J + N, D)`.

    Example:
    >>> encoder = TransformerEncoder(depth=2, num_heads=2, mlp_dim=16)
    >>> encoder(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(
        self,
        depth,
        num_heads,
        mlp_dim,
        jumbo_multiplier=0,
        jumbo_mlp_dim=None,
        share_jumbo_mlp=False,
        jumbo_lora_rank=None,
        last_block_patch_mlp=True,
        last_block_jumbo_mlp=True,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        drop_path_schedule="linear",
        layer_scale_init_value=None,
        layer_norm_epsilon=1e-6,
        normalization="layer_norm",
        norm_first=True,
        residual_attention=False,
        activation="gelu",
        qkv_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.normalization = normalization
        self.norm_first = norm_first
        self.residual_attention = residual_attention
        self.depth = check_positive_int("depth", depth)
        self.num_heads = num_heads
        self.mlp_dim = mlp_dim
        self.jumbo_multiplier = jumbo_multiplier
        self.jumbo_mlp_dim = jumbo_mlp_dim
        self.share_jumbo_mlp = bool(share_jumbo_mlp)
        self.jumbo_lora_rank = jumbo_lora_rank
        self.last_block_patch_mlp = bool(last_block_patch_mlp)
        self.last_block_jumbo_mlp = bool(last_block_jumbo_mlp)
        self.dropout_rate = dropout_rate
        self.attention_dropout_rate = attention_dropout_rate
        self.drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
        self.drop_path_schedule = check_choice(
            "drop_path_schedule", drop_path_schedule, {"linear", "constant"}
        )
        self.layer_scale_init_value = layer_scale_init_value
        self.layer_norm_epsilon = layer_norm_epsilon
        self.activation = activation
        self.qkv_bias = qkv_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        if self.share_jumbo_mlp and jumbo_multiplier and jumbo_mlp_dim is None:
            raise ValueError(
                "`jumbo_mlp_dim` is required for a shared Jumbo FFN. "
                "Received: jumbo_mlp_dim=None"
            )
        self.blocks = [
            TransformerBlock(
                num_heads,
                mlp_dim,
                jumbo_multiplier=jumbo_multiplier,
                jumbo_mlp_dim=jumbo_mlp_dim,
                share_jumbo_mlp=self.share_jumbo_mlp,
                jumbo_lora_rank=jumbo_lora_rank,
                use_patch_mlp=(
                    self.last_block_patch_mlp or index < self.depth - 1
                ),
                use_jumbo_mlp=(
                    self.last_block_jumbo_mlp or index < self.depth - 1
                ),
                dropout_rate=dropout_rate,
                attention_dropout_rate=attention_dropout_rate,
                drop_path_rate=self._drop_path(index),
                layer_scale_init_value=layer_scale_init_value,
                layer_norm_epsilon=layer_norm_epsilon,
                normalization=normalization,
                norm_first=norm_first,
                residual_attention=residual_attention,
                activation=activation,
                qkv_bias=qkv_bias,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name=f"block_{index}",
            )
            for index in range(self.depth)
        ]
        self.shared_jumbo_mlp = None
        if self.share_jumbo_mlp and jumbo_multiplier:
            self.shared_jumbo_mlp = MLP(
                jumbo_mlp_dim,
                activation=activation,
                dropout_rate=dropout_rate,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="shared_jumbo_mlp",
            )

    def _drop_path(self, index):
        from keras_jumbo.schedules import drop_path_rates

        return drop_path_rates(
            self.drop_path_rate, self.depth, self.drop_path_schedule
        )[index]

    def build(self, input_shape):
        for block in self.blocks:
            block.build(input_shape)
        if self.shared_jumbo_mlp is not None:
            jumbo_dim = self.jumbo_multiplier * input_shape[-1]
            self.shared_jumbo_mlp.build((input_shape[0], jumbo_dim))

    def call(self, inputs, training=None):
        x, scores = inputs, None
        for block in self.blocks:
            if self.residual_attention:
                x, scores = block(
                    x,
                    training=training,
                    shared_jumbo_mlp=self.shared_jumbo_mlp,
                    attention_scores=scores,
                )
            else:
                x = block(
                    x,
                    training=training,
                    shared_jumbo_mlp=self.shared_jumbo_mlp,
                )
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "depth": self.depth,
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "jumbo_multiplier": self.jumbo_multiplier,
                "jumbo_mlp_dim": self.jumbo_mlp_dim,
                "share_jumbo_mlp": self.share_jumbo_mlp,
                "jumbo_lora_rank": self.jumbo_lora_rank,
                "last_block_patch_mlp": self.last_block_patch_mlp,
                "last_block_jumbo_mlp": self.last_block_jumbo_mlp,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "drop_path_schedule": self.drop_path_schedule,
                "layer_scale_init_value": self.layer_scale_init_value,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalization": self.normalization,
                "norm_first": self.norm_first,
                "residual_attention": self.residual_attention,
                "activation": self.activation,
                "qkv_bias": self.qkv_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
