import keras
from keras import ops

from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers.attention import MultiHeadSelfAttention
from keras_jumbo.layers.jumbo_token import jumbo_merge
from keras_jumbo.layers.jumbo_token import jumbo_split
from keras_jumbo.layers.layer_scale import LayerScale
from keras_jumbo.layers.masked_layer_norm import MaskedLayerNorm
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.stochastic_depth import StochasticDepth


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TransformerBlock(keras.layers.Layer):
    """The one pre-norm transformer block every keras_jumbo ViT uses.

    Plain block (`jumbo_multiplier=0`), for ViT, ViT+Registers, PatchTST:

        x = x + DropPath(LS1(Attn(LN1(x))))
        x = x + DropPath(LS2(FFN(LN2(x))))

    Jumbo block (`jumbo_multiplier=J >= 1`; Jumbo paper §3.2, Fig. 2): the
    first J tokens are the split Jumbo token. All tokens attend together;
    then the J split tokens are reassembled into one `J * D` token that
    goes through its own FFN, while the remaining (patch) tokens go
    through the patch FFN:

        x = x + DropPath(LS1(Attn(LN1(x))))            # all N + J tokens
        jumbo = concat_J(x[:J])                          # (J * D,)
        jumbo = jumbo + DropPath(LS3(FFN_J(LN3(jumbo)) [+ B A LN3(jumbo)]))
        patches = x[J:] + DropPath(LS2(FFN(LN2(x[J:]))))
        x = split_J(jumbo) || patches

    Post-norm (`norm_first=False`, the original Transformer and the
    official PatchTST) moves each norm after its residual addition:
    `x = LN1(x + DropPath(LS1(Attn(x))))`, and likewise for both FFNs.
    `normalization="batch_norm"` replaces every LayerNorm by a
    BatchNormalization over the width (statistics over batch and tokens,
    the official PatchTST's `norm="BatchNorm"`). `residual_attention=True`
    adds the previous block's scaled pre-softmax scores to this block's
    (official PatchTST `res_attention=True`); the block then takes
    `attention_scores=` and returns `(tokens, scores)`. These three follow
    the official PatchTST code, not its paper; they default to the ViT
    block.

    NAS super-network (ViT-ResNAS §2.3): with
    `normalization="masked_layer_norm"` the norms are `MaskedLayerNorm` and
    the call takes per-example channel masks: `embed_mask` (the active
    prefix of the width), `head_mask` (active heads, over `num_heads *
    head_dim`), `hidden_mask` (active FFN units) and `layer_mask` (0 skips
    the block: `x` passes through unchanged). Each branch output is
    multiplied by `embed_mask * layer_mask`. With prefix masks the block
    computes exactly the smaller block whose weights are the leading
    slices (tested against the sliced standalone block). Without masks it
    is the plain pre-norm block.

    The Jumbo FFN is the block's own (`share_jumbo_mlp=False`, the paper's
    default) or an `MLP` passed at call time (`shared_jumbo_mlp=`, used by
    `TransformerEncoder` to share one Jumbo FFN across layers as in the
    official release and Table 3 "layer share"). LN3 is always per block,
    as in the official release. With `jumbo_lora_rank=r` the block adds a
    per-layer low-rank branch `J*D -> r -> J*D` (no bias, up-projection
    zero-initialised, as LoRA) to the shared FFN's output (Table 3 "LoRA").

    Args:
        num_heads: int, attention heads; must divide the width D unless
            `head_dim` is given.
        head_dim: int or None, width of each head (default D // num_heads).
        mlp_dim: int, hidden width of the patch FFN.
        jumbo_multiplier: int >= 0, J (0 = plain block).
        jumbo_mlp_dim: int, hidden width of the Jumbo FFN (needed when
            `jumbo_multiplier > 0` and the FFN is the block's own).
        share_jumbo_mlp: bool, take the Jumbo FFN from the call argument
            `shared_jumbo_mlp` instead of owning one.
        jumbo_lora_rank: int or None, rank of the per-layer adapter; only
            with `share_jumbo_mlp=True`.
        use_patch_mlp: bool, build the patch FFN. The last block of a model
            whose head reads only the Jumbo token does not need it.
        use_jumbo_mlp: bool, build the Jumbo FFN branch (LN3, FFN, adapter).
            The last block of a Jumbo model whose head reads only patch
            tokens (`head="avg"`) does not need it.
        dropout_rate: float, dropout in the FFNs and after the attention
            projection.
        attention_dropout_rate: float, dropout of attention probabilities.
        drop_path_rate: float, stochastic-depth rate of every branch.
        layer_scale_init_value: float or None; None disables LayerScale.
        layer_norm_epsilon: float, epsilon of every normalisation layer.
        normalization: `"layer_norm"` (default), `"batch_norm"` or
            `"masked_layer_norm"` (NAS super-network; equals layer norm when
            no mask is given).
        norm_first: bool, pre-norm (True, ViT) or post-norm (False).
        residual_attention: bool, carry attention scores across blocks.
        activation: FFN activation, `"gelu"` (exact, erf) by default.
        qkv_bias: bool, bias on the q/k/v projection.
        kernel_initializer: initializer of the Dense kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, J + N, D)` tokens (the first J are the split Jumbo
            token when `jumbo_multiplier > 0`).
        training: bool.
        shared_jumbo_mlp: an `MLP` mapping `J * D -> J * D`, required when
            `share_jumbo_mlp=True`.
        attention_scores: with `residual_attention=True`, the previous
            block's scores `(batch, heads, J + N, J + N)` or None.
        embed_mask, head_mask, hidden_mask, layer_mask: optional channel
            masks `(batch, 1, width)` (`layer_mask`: `(batch, 1, 1)`) for
            `normalization="masked_layer_norm"` blocks; see above.

    Returns:
        `(batch, J + N, D)`; with `residual_attention=True`, a pair
        `(tokens, scores)`.

    Example:
    >>> block = TransformerBlock(num_heads=2, mlp_dim=32, jumbo_multiplier=2,
    ...                          jumbo_mlp_dim=64)
    >>> block(np.zeros((2, 2 + 16, 8))).shape
    (2, 18, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        head_dim=None,
        jumbo_multiplier=0,
        jumbo_mlp_dim=None,
        share_jumbo_mlp=False,
        jumbo_lora_rank=None,
        use_patch_mlp=True,
        use_jumbo_mlp=True,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
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
        self.normalization = check_choice(
            "normalization",
            normalization,
            {"layer_norm", "batch_norm", "masked_layer_norm"},
        )
        self.norm_first = check_bool("norm_first", norm_first)
        self.residual_attention = check_bool(
            "residual_attention", residual_attention
        )
        self.num_heads = check_positive_int("num_heads", num_heads)
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        self.head_dim = head_dim
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.jumbo_multiplier = check_positive_int(
            "jumbo_multiplier", jumbo_multiplier, allow_zero=True
        )
        self.share_jumbo_mlp = bool(share_jumbo_mlp)
        if self.jumbo_multiplier and not self.share_jumbo_mlp:
            if jumbo_mlp_dim is None:
                raise ValueError(
                    "`jumbo_mlp_dim` is required when `jumbo_multiplier > 0` "
                    "and the block owns its Jumbo FFN. Received: "
                    f"jumbo_mlp_dim=None, jumbo_multiplier={jumbo_multiplier}"
                )
        if jumbo_mlp_dim is not None:
            check_positive_int("jumbo_mlp_dim", jumbo_mlp_dim)
        self.jumbo_mlp_dim = jumbo_mlp_dim
        if jumbo_lora_rank is not None:
            check_positive_int("jumbo_lora_rank", jumbo_lora_rank)
            if not self.share_jumbo_mlp:
                raise ValueError(
                    "`jumbo_lora_rank` adapts a shared Jumbo FFN; set "
                    "`share_jumbo_mlp=True`. Received: "
                    f"jumbo_lora_rank={jumbo_lora_rank}, share_jumbo_mlp=False"
                )
        self.jumbo_lora_rank = jumbo_lora_rank
        self.use_patch_mlp = bool(use_patch_mlp)
        self.use_jumbo_mlp = bool(use_jumbo_mlp)
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
        self.layer_scale_init_value = layer_scale_init_value
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = activation
        self.qkv_bias = qkv_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    # --- construction -------------------------------------------------
    def _norm(self, name):
        if self.normalization == "batch_norm":
            # PyTorch BatchNorm1d(momentum=0.1) == Keras momentum 0.9.
            return keras.layers.BatchNormalization(
                epsilon=self.layer_norm_epsilon,
                momentum=0.9,
                dtype=self.dtype_policy,
                name=name,
            )
        if self.normalization == "masked_layer_norm":
            return MaskedLayerNorm(
                epsilon=self.layer_norm_epsilon,
                dtype=self.dtype_policy,
                name=name,
            )
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _branch_tail(self, suffix):
        scale = None
        if self.layer_scale_init_value is not None:
            scale = LayerScale(
                self.layer_scale_init_value,
                dtype=self.dtype_policy,
                name=f"layer_scale{suffix}",
            )
        drop = StochasticDepth(
            self.drop_path_rate,
            dtype=self.dtype_policy,
            name=f"drop_path{suffix}",
        )
        return scale, drop

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        if dim is None or (self.head_dim is None and dim % self.num_heads):
            raise ValueError(
                "The model width must be divisible by `num_heads` (or give "
                f"`head_dim`). Received: width={dim}, "
                f"num_heads={self.num_heads}"
            )
        length = input_shape[1]
        if length is not None and length < self.jumbo_multiplier:
            raise ValueError(
                f"A Jumbo block with jumbo_multiplier={self.jumbo_multiplier} "
                f"needs at least that many tokens. Received: "
                f"input_shape={tuple(input_shape)}"
            )
        self.hidden_dim = dim
        common = dict(
            dtype=self.dtype_policy, kernel_initializer=self.kernel_initializer
        )
        self.norm1 = self._norm("norm1")
        self.norm1.build(input_shape)
        self.attention = MultiHeadSelfAttention(
            self.num_heads,
            head_dim=self.head_dim,
            qkv_bias=self.qkv_bias,
            attention_dropout_rate=self.attention_dropout_rate,
            dropout_rate=self.dropout_rate,
            name="attention",
            **common,
        )
        self.attention.build(input_shape)
        self.layer_scale1, self.drop_path1 = self._branch_tail("1")
        token_shape = (input_shape[0], None, dim)
        if self.use_patch_mlp:
            self.norm2 = self._norm("norm2")
            self.norm2.build(token_shape)
            self.mlp = MLP(
                self.mlp_dim,
                activation=self.activation,
                dropout_rate=self.dropout_rate,
                name="mlp",
                **common,
            )
            self.mlp.build(token_shape)
            self.layer_scale2, self.drop_path2 = self._branch_tail("2")
        for sub in (self.layer_scale1, getattr(self, "layer_scale2", None)):
            if sub is not None:
                sub.build(token_shape)
        if self.jumbo_multiplier and self.use_jumbo_mlp:
            jumbo_dim = self.jumbo_multiplier * dim
            jumbo_shape = (input_shape[0], jumbo_dim)
            self.norm3 = self._norm("norm3")
            self.norm3.build(jumbo_shape)
            self.jumbo_mlp = None
            if not self.share_jumbo_mlp:
                self.jumbo_mlp = MLP(
                    self.jumbo_mlp_dim,
                    activation=self.activation,
                    dropout_rate=self.dropout_rate,
                    name="jumbo_mlp",
                    **common,
                )
                self.jumbo_mlp.build(jumbo_shape)
            if self.jumbo_lora_rank is not None:
                self.jumbo_lora_down = keras.layers.Dense(
                    self.jumbo_lora_rank,
                    use_bias=False,
                    name="jumbo_lora_down",
                    **common,
                )
                self.jumbo_lora_down.build(jumbo_shape)
                self.jumbo_lora_up = keras.layers.Dense(
                    jumbo_dim,
                    use_bias=False,
                    kernel_initializer="zeros",
                    dtype=self.dtype_policy,
                    name="jumbo_lora_up",
                )
                self.jumbo_lora_up.build((input_shape[0], self.jumbo_lora_rank))
            self.layer_scale3, self.drop_path3 = self._branch_tail("3")
            if self.layer_scale3 is not None:
                self.layer_scale3.build(jumbo_shape)

    # --- forward ------------------------------------------------------
    def _normalize(self, norm, x, training, masks):
        if masks is not None:
            return norm(x, channel_mask=masks["embed"])
        return norm(x, training=training)

    def _sublayer(self, x, norm, fn, scale, drop, training, masks=None):
        """Pre-norm `x + f(N(x))` or post-norm `N(x + f(x))`."""
        if self.norm_first:
            branch = fn(self._normalize(norm, x, training, masks))
        else:
            branch = fn(x)
        if scale is not None:
            branch = scale(branch)
        branch = drop(branch, training=training)
        if masks is not None and masks["branch"] is not None:
            branch = branch * ops.cast(masks["branch"], branch.dtype)
        x = x + branch
        if self.norm_first:
            return x
        return self._normalize(norm, x, training, masks)

    def _patch_ffn(self, x, training, masks=None):
        if not self.use_patch_mlp:
            return x
        hidden_mask = None if masks is None else masks["hidden"]
        return self._sublayer(
            x,
            self.norm2,
            lambda h: self.mlp(h, training=training, hidden_mask=hidden_mask),
            self.layer_scale2,
            self.drop_path2,
            training,
            masks,
        )

    def _masks(self, embed_mask, head_mask, hidden_mask, layer_mask):
        given = (embed_mask, head_mask, hidden_mask, layer_mask)
        if all(m is None for m in given):
            return None
        if self.normalization != "masked_layer_norm" or self.jumbo_multiplier:
            raise ValueError(
                "Channel masks need a plain block with "
                "normalization='masked_layer_norm'. Received: "
                f"normalization={self.normalization!r}, "
                f"jumbo_multiplier={self.jumbo_multiplier}"
            )
        if embed_mask is None:
            embed_mask = ops.ones((1, 1, self.hidden_dim))
        branch = embed_mask
        if layer_mask is not None:
            branch = embed_mask * layer_mask
        return {
            "embed": embed_mask,
            "head": head_mask,
            "hidden": hidden_mask,
            "branch": branch,
        }

    def _jumbo_ffn(self, jumbo, training, shared_jumbo_mlp):
        if not self.use_jumbo_mlp:
            return jumbo
        mlp = self.jumbo_mlp
        if self.share_jumbo_mlp:
            if shared_jumbo_mlp is None:
                raise ValueError(
                    f"Block '{self.name}' was built with share_jumbo_mlp=True "
                    "and needs the shared Jumbo FFN at call time. Received: "
                    "shared_jumbo_mlp=None"
                )
            mlp = shared_jumbo_mlp

        def branch(hidden):
            out = mlp(hidden, training=training)
            if self.jumbo_lora_rank is not None:
                out = out + self.jumbo_lora_up(self.jumbo_lora_down(hidden))
            return out

        return self._sublayer(
            jumbo,
            self.norm3,
            branch,
            self.layer_scale3,
            self.drop_path3,
            training,
        )

    def call(
        self,
        inputs,
        training=None,
        shared_jumbo_mlp=None,
        attention_scores=None,
        embed_mask=None,
        head_mask=None,
        hidden_mask=None,
        layer_mask=None,
    ):
        scores = None
        masks = self._masks(embed_mask, head_mask, hidden_mask, layer_mask)

        def attend(hidden):
            nonlocal scores
            if not self.residual_attention:
                return self.attention(
                    hidden, training=training, head_mask=head_mask
                )
            out, scores = self.attention(
                hidden,
                training=training,
                previous_scores=attention_scores,
                return_scores=True,
            )
            return out

        x = self._sublayer(
            inputs,
            self.norm1,
            attend,
            self.layer_scale1,
            self.drop_path1,
            training,
            masks,
        )
        if self.jumbo_multiplier:
            num_jumbo = self.jumbo_multiplier
            jumbo = jumbo_merge(x[:, :num_jumbo])
            jumbo = self._jumbo_ffn(jumbo, training, shared_jumbo_mlp)
            patches = self._patch_ffn(x[:, num_jumbo:], training)
            x = ops.concatenate(
                [jumbo_split(jumbo, num_jumbo), patches], axis=1
            )
        else:
            x = self._patch_ffn(x, training, masks)
        if self.residual_attention:
            return x, scores
        return x

    def compute_output_shape(self, input_shape):
        if not self.residual_attention:
            return tuple(input_shape)
        batch, length = input_shape[0], input_shape[1]
        return tuple(input_shape), (batch, self.num_heads, length, length)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "head_dim": self.head_dim,
                "jumbo_multiplier": self.jumbo_multiplier,
                "jumbo_mlp_dim": self.jumbo_mlp_dim,
                "share_jumbo_mlp": self.share_jumbo_mlp,
                "jumbo_lora_rank": self.jumbo_lora_rank,
                "use_patch_mlp": self.use_patch_mlp,
                "use_jumbo_mlp": self.use_jumbo_mlp,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
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
