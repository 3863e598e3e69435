import itertools

import keras

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo._torch_kernels import concatenate
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers.jumbo_token import jumbo_merge
from keras_jumbo.layers.jumbo_token import jumbo_split
from keras_jumbo.layers.vit_block import ViTBlock


@keras.saving.register_keras_serializable(package="keras_jumbo")
class JumboBlock(ViTBlock):
    """The Jumbo encoder block (Jumbo paper §3.2, Fig. 2).

    The first J tokens are the split Jumbo token. All tokens attend
    together (the `ViTBlock` attention branch); then the J split tokens are
    reassembled into one `J * D` token that goes through its own wide FFN,
    while the patch tokens go through the patch FFN:

        x = x + DropPath(LS1(Attn(LN1(x))))            # all J + N tokens
        jumbo = concat_J(x[:J])                          # (J * D,)
        jumbo = jumbo + DropPath(LS3(FFN_J(LN3(jumbo)) [+ B A LN3(jumbo)]))
        patches = x[J:] + DropPath(LS2(FFN(LN2(x[J:]))))
        x = split_J(jumbo) || patches

    With J = 1 and FFN_J = FFN it is the `ViTBlock` with a CLS token
    (tested).

    The Jumbo FFN is the block's own (`jumbo_mlp`, the paper's default) or,
    with `share_jumbo_mlp=True`, one `MLP` passed at call time by the
    `TransformerEncoder` that owns it (official release; Table 3 "layer
    share"). LN3 is always per block, as in the official release. With
    `jumbo_lora_rank=r` the block adds a per-layer low-rank branch
    `J*D -> r -> J*D` (no bias, up-projection zero-initialised, as LoRA)
    to the shared FFN's output (Table 3 "LoRA").

    The last block of a model whose head reads only the Jumbo token needs
    no patch FFN (`use_patch_mlp=False`; the paper does not build it), and
    one whose head reads only patches needs no Jumbo FFN
    (`use_jumbo_mlp=False`).

    Attributes, always present once built (None where the options leave a
    part out): those of `ViTBlock`, and `norm3`, `jumbo_mlp`,
    `jumbo_lora_down`, `jumbo_lora_up`, `layer_scale3`, `drop_path3`.

    Args:
        num_heads, mlp_dim, head_dim, dropout_rate, attention_dropout_rate,
            drop_path_rate, layer_scale_init_value, layer_norm_epsilon,
            activation, qkv_bias, kernel_initializer: as `ViTBlock`.
        jumbo_multiplier: int >= 1, J.
        jumbo_mlp_dim: int, hidden width of the block's own Jumbo FFN (not
            used with `share_jumbo_mlp=True`).
        share_jumbo_mlp: bool, take the Jumbo FFN from the call argument
            `shared_jumbo_mlp` instead of owning one.
        jumbo_lora_rank: int or None, rank of the per-layer adapter; only
            with `share_jumbo_mlp=True`.
        use_patch_mlp: bool, build the patch FFN.
        use_jumbo_mlp: bool, build the Jumbo FFN branch (LN3, FFN, adapter).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, J + N, D)`, the split Jumbo token first.
        training: bool.
        shared_jumbo_mlp: an `MLP` mapping `J * D -> J * D`, required when
            `share_jumbo_mlp=True`.

    Returns:
        `(batch, J + N, D)`.

    Example:
    >>> block = JumboBlock(num_heads=2, mlp_dim=32, jumbo_multiplier=2,
    ...                    jumbo_mlp_dim=64)
    >>> block(np.zeros((2, 2 + 16, 8))).shape
    (2, 18, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        jumbo_multiplier,
        jumbo_mlp_dim=None,
        share_jumbo_mlp=False,
        jumbo_lora_rank=None,
        use_patch_mlp=True,
        use_jumbo_mlp=True,
        **kwargs,
    ):
        super().__init__(num_heads, mlp_dim, **kwargs)
        self.jumbo_multiplier = check_positive_int(
            "jumbo_multiplier", jumbo_multiplier
        )
        self.share_jumbo_mlp = check_bool("share_jumbo_mlp", share_jumbo_mlp)
        self.use_patch_mlp = check_bool("use_patch_mlp", use_patch_mlp)
        self.use_jumbo_mlp = check_bool("use_jumbo_mlp", use_jumbo_mlp)
        if jumbo_mlp_dim is not None:
            check_positive_int("jumbo_mlp_dim", jumbo_mlp_dim)
        elif self.use_jumbo_mlp and not self.share_jumbo_mlp:
            raise ValueError(
                "`jumbo_mlp_dim` is required when the block owns its Jumbo "
                "FFN (share_jumbo_mlp=False). Received: jumbo_mlp_dim=None"
            )
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

    def build(self, input_shape):
        dim = self._check_input(input_shape)
        length = input_shape[1]
        if length is not None and length < self.jumbo_multiplier:
            raise ValueError(
                f"A Jumbo block with jumbo_multiplier={self.jumbo_multiplier} "
                f"needs at least that many tokens. Received: "
                f"input_shape={tuple(input_shape)}"
            )
        self._build_attention(input_shape)
        self.norm2 = self.mlp = self.layer_scale2 = self.drop_path2 = None
        if self.use_patch_mlp:
            self._build_mlp((input_shape[0], None, dim))
        self.norm3 = self.jumbo_mlp = None
        self.jumbo_lora_down = self.jumbo_lora_up = None
        self.layer_scale3 = self.drop_path3 = None
        if self.use_jumbo_mlp:
            self._build_jumbo_mlp((input_shape[0], self.jumbo_multiplier * dim))

    def _build_jumbo_mlp(self, jumbo_shape):
        jumbo_dim = jumbo_shape[-1]
        self.norm3 = self._norm("norm3")
        self.norm3.build(jumbo_shape)
        if not self.share_jumbo_mlp:
            self.jumbo_mlp = self._mlp(self.jumbo_mlp_dim, "jumbo_mlp")
            self.jumbo_mlp.build(jumbo_shape)
        if self.jumbo_lora_rank is not None:
            self.jumbo_lora_down = keras.layers.Dense(
                self.jumbo_lora_rank,
                use_bias=False,
                kernel_initializer=self.kernel_initializer,
                dtype=self.dtype_policy,
                name="jumbo_lora_down",
            )
            self.jumbo_lora_down.build(jumbo_shape)
            self.jumbo_lora_up = keras.layers.Dense(
                jumbo_dim,
                use_bias=False,
                kernel_initializer="zeros",
                dtype=self.dtype_policy,
                name="jumbo_lora_up",
            )
            self.jumbo_lora_up.build((jumbo_shape[0], self.jumbo_lora_rank))
        self.layer_scale3, self.drop_path3 = self._residual_tail(
            "3", jumbo_shape
        )

    def _jumbo_ffn(self, jumbo, training, shared_jumbo_mlp):
        mlp = self.jumbo_mlp
        if self.share_jumbo_mlp:
            if shared_jumbo_mlp is None:
                raise ValueError(
                    f"Block '{self.name}' was built with share_jumbo_mlp=True "
                    "and needs the shared Jumbo FFN at call time. Received: "
                    "shared_jumbo_mlp=None"
                )
            mlp = shared_jumbo_mlp
        hidden = call_sublayer(self.norm3, jumbo)
        branch = call_sublayer(mlp, hidden, training=training)
        if self.jumbo_lora_rank is not None:
            branch = branch + self.jumbo_lora_up(self.jumbo_lora_down(hidden))
        return self._add(
            jumbo, branch, self.layer_scale3, self.drop_path3, training
        )

    def call(self, inputs, training=None, shared_jumbo_mlp=None):
        return self.call_on_slices([inputs], training, shared_jumbo_mlp)[0]

    def call_on_slices(self, slices, training=None, shared_jumbo_mlp=None):
        """`[block(s) for s in slices]` for slices of one batch, with the
        Jumbo FFN run once on every slice's Jumbo token (the rows
        concatenated): the same numbers, since the FFN and LN3 act on each
        row alone. The FFN's wide weights are then read once for all the
        rows rather than once per slice: `TransformerEncoder`'s inference
        on slices of a batch, where a slice holds as few as 32 Jumbo rows
        (benchmarks/README.md, twenty-fourth session). The block must be
        built.

        Args:
            slices: a non-empty list of `(batch_i, J + N, D)` tensors.
            training, shared_jumbo_mlp: as in `call`.

        Returns:
            A list of `(batch_i, J + N, D)` tensors, one per slice.
        """
        num_jumbo = self.jumbo_multiplier
        xs = [self.attention_branch(x, training) for x in slices]
        jumbos = [jumbo_merge(x[:, :num_jumbo]) for x in xs]
        if self.use_jumbo_mlp:
            if len(jumbos) == 1:
                jumbos = [
                    self._jumbo_ffn(jumbos[0], training, shared_jumbo_mlp)
                ]
            else:
                joined = self._jumbo_ffn(
                    concatenate(jumbos, axis=0), training, shared_jumbo_mlp
                )
                ends = list(
                    itertools.accumulate(jumbo.shape[0] for jumbo in jumbos)
                )
                jumbos = [
                    joined[start:end]
                    for start, end in zip([0] + ends[:-1], ends, strict=True)
                ]
        outputs = []
        for x, jumbo in zip(xs, jumbos, strict=True):
            patches = x[:, num_jumbo:]
            if self.use_patch_mlp:
                patches = self.mlp_branch(patches, training)
            outputs.append(
                concatenate([jumbo_split(jumbo, num_jumbo), patches], axis=1)
            )
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "jumbo_multiplier": self.jumbo_multiplier,
                "jumbo_mlp_dim": self.jumbo_mlp_dim,
                "share_jumbo_mlp": self.share_jumbo_mlp,
                "jumbo_lora_rank": self.jumbo_lora_rank,
                "use_patch_mlp": self.use_patch_mlp,
                "use_jumbo_mlp": self.use_jumbo_mlp,
            }
        )
        return config
