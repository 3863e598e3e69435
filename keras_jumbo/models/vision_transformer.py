"""Functional builders for ViT, ViT+Registers and ViT+Jumbo."""

import keras
from keras import ops

from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import JumboToken
from keras_jumbo.layers import ParallelBranchBlock
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import Registers
from keras_jumbo.layers import TokenDropping
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import standardize_data_format
from keras_jumbo.layers._utils import to_pair
from keras_jumbo.layers.jumbo_token import jumbo_merge
from keras_jumbo.models.vit_sizes import get_size

HEADS = {"jumbo", "official", "token", "avg"}
# "jumbo_avg": the mean of the J split Jumbo tokens, width D (PatchTST+Jumbo
# classification, Jumbo paper A.2.3).
POOLING_MODES = HEADS | {"jumbo_avg"}


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TokenPooling(keras.layers.Layer):
    """Read a model's prefix/patch tokens into one vector for the head.

    Modes: `"token"` (token 0, the CLS token), `"avg"` (mean of the patch
    tokens after `num_prefix_tokens`), `"jumbo"` (the first J tokens
    reassembled into the `J * D` Jumbo token), `"official"` (the official
    Jumbo release: reassembled Jumbo token concatenated with the mean of the
    patch tokens, width `J * D + D`), `"jumbo_avg"` (the mean of the J
    split Jumbo tokens, width D; PatchTST+Jumbo, Jumbo paper A.2.3).

    Args:
        mode: one of `"token"`, `"avg"`, `"jumbo"`, `"official"`,
            `"jumbo_avg"`.
        num_prefix_tokens: int, the number of leading non-patch tokens
            (J for Jumbo models; 1 + R for CLS + registers).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, num_prefix_tokens + N, D)`.

    Returns:
        `(batch, width)`.
    """

    def __init__(self, mode, num_prefix_tokens, **kwargs):
        super().__init__(**kwargs)
        self.mode = check_choice("mode", mode, POOLING_MODES)
        self.num_prefix_tokens = check_positive_int(
            "num_prefix_tokens", num_prefix_tokens, allow_zero=True
        )

    def call(self, inputs):
        prefix = self.num_prefix_tokens
        if self.mode == "token":
            return inputs[:, 0]
        if self.mode == "avg":
            return ops.mean(inputs[:, prefix:], axis=1)
        if self.mode == "jumbo_avg":
            return ops.mean(inputs[:, :prefix], axis=1)
        jumbo = jumbo_merge(inputs[:, :prefix])
        if self.mode == "jumbo":
            return jumbo
        patches = ops.mean(inputs[:, prefix:], axis=1)
        return ops.concatenate([jumbo, patches], axis=-1)

    def compute_output_shape(self, input_shape):
        dim = input_shape[-1]
        width = {
            "token": dim,
            "avg": dim,
            "jumbo_avg": dim,
            "jumbo": self.num_prefix_tokens * dim,
            "official": (self.num_prefix_tokens + 1) * dim,
        }[self.mode]
        return (input_shape[0], width)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"mode": self.mode, "num_prefix_tokens": self.num_prefix_tokens}
        )
        return config


def _layer_norm(epsilon, name):
    return keras.layers.LayerNormalization(epsilon=epsilon, name=name)


def build_vision_transformer(
    size="nano",
    *,
    num_classes=1000,
    image_size=224,
    patch_size=16,
    num_channels=3,
    hidden_dim=None,
    depth=None,
    num_heads=None,
    mlp_ratio=4.0,
    num_registers=0,
    use_class_token=True,
    jumbo_multiplier=0,
    jumbo_mlp_ratio=4.0,
    share_jumbo_mlp=False,
    jumbo_lora_rank=None,
    head="token",
    include_top=True,
    classifier_activation=None,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    drop_path_rate=0.0,
    drop_path_schedule="linear",
    head_dropout_rate=0.0,
    layer_scale_init_value=None,
    layer_norm_epsilon=1e-6,
    activation="gelu",
    qkv_bias=True,
    token_drop_rate=0.0,
    last_block_patch_mlp=None,
    num_branches=None,
    initial_lambda=0.0,
    diversity_weight=0.0,
    data_format=None,
    name=None,
):
    """Build any of the ViT family; the public builders fix the variant.

    See `JumboViT` for the arguments. `jumbo_multiplier=0` gives a plain
    ViT with a CLS token and `num_registers` registers.
    """
    spec = get_size(size)
    hidden_dim = spec["hidden_dim"] if hidden_dim is None else hidden_dim
    depth = spec["depth"] if depth is None else depth
    num_heads = spec["num_heads"] if num_heads is None else num_heads
    check_positive_int("hidden_dim", hidden_dim)
    check_positive_int("depth", depth)
    check_positive_int("num_heads", num_heads)
    if hidden_dim % num_heads:
        raise ValueError(
            "`hidden_dim` must be divisible by `num_heads`. Received: "
            f"hidden_dim={hidden_dim}, num_heads={num_heads}"
        )
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_channels", num_channels)
    check_positive_int("num_registers", num_registers, allow_zero=True)
    check_positive_int("jumbo_multiplier", jumbo_multiplier, allow_zero=True)
    check_rate("token_drop_rate", token_drop_rate)
    check_rate("head_dropout_rate", head_dropout_rate)
    image_size = to_pair("image_size", image_size)
    patch_size = to_pair("patch_size", patch_size)
    pairs = zip(image_size, patch_size, strict=True)
    if any(img % patch for img, patch in pairs):
        raise ValueError(
            "`image_size` must be divisible by `patch_size`. Received: "
            f"image_size={image_size}, patch_size={patch_size}"
        )
    for ratio_name, ratio in (
        ("mlp_ratio", mlp_ratio),
        ("jumbo_mlp_ratio", jumbo_mlp_ratio),
    ):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
            raise TypeError(
                f"`{ratio_name}` must be a number. "
                f"Received: {ratio_name}={ratio!r}"
            )
        if ratio <= 0:
            raise ValueError(
                f"`{ratio_name}` must be > 0. Received: {ratio_name}={ratio}"
            )
    check_choice("head", head, HEADS)
    if num_branches is not None:
        check_positive_int("num_branches", num_branches)
    is_jumbo = jumbo_multiplier > 0
    if num_branches is not None and (is_jumbo or token_drop_rate):
        raise ValueError(
            "Branch blocks (num_branches given) are built for plain ViTs; "
            "they do not combine with Jumbo tokens or token dropping. "
            f"Received: num_branches={num_branches}, "
            f"jumbo_multiplier={jumbo_multiplier}, "
            f"token_drop_rate={token_drop_rate}"
        )
    if head in ("jumbo", "official") and not is_jumbo:
        raise ValueError(
            f"head={head!r} reads the Jumbo token; use it with "
            "jumbo_multiplier >= 1. Received: jumbo_multiplier=0"
        )
    if head == "token" and not (is_jumbo or use_class_token):
        raise ValueError(
            "head='token' needs a CLS token. Received: use_class_token=False"
        )
    data_format = standardize_data_format(data_format)
    grid = (image_size[0] // patch_size[0], image_size[1] // patch_size[1])
    if data_format == "channels_last":
        input_shape = (*image_size, num_channels)
    else:
        input_shape = (num_channels, *image_size)

    if is_jumbo:
        num_prefix = jumbo_multiplier
    else:
        num_prefix = int(use_class_token) + num_registers
    if last_block_patch_mlp is None:
        # The Jumbo head alone never reads patch tokens after the last block.
        last_block_patch_mlp = not (is_jumbo and head == "jumbo")
    mlp_dim = int(hidden_dim * mlp_ratio)
    jumbo_mlp_dim = (
        int(jumbo_multiplier * hidden_dim * jumbo_mlp_ratio)
        if is_jumbo
        else None
    )

    # === Layers ===
    patch_embedding = PatchEmbedding(
        hidden_dim, patch_size, data_format=data_format, name="patch_embedding"
    )
    position_embedding = PositionEmbedding(grid, name="position_embedding")
    token_dropping = TokenDropping(token_drop_rate, name="token_dropping")
    branch_blocks = [
        ParallelBranchBlock(
            num_heads,
            mlp_dim,
            num_branches=num_branches,
            initial_lambda=initial_lambda,
            # α · mean over every attention and FFN module (§4).
            diversity_weight=diversity_weight / depth,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=(
                drop_path_rate * index / max(depth - 1, 1)
                if drop_path_schedule == "linear"
                else drop_path_rate
            ),
            layer_norm_epsilon=layer_norm_epsilon,
            activation=activation,
            name=f"branch_block_{index}",
        )
        for index in range(depth if num_branches is not None else 0)
    ]
    encoder = TransformerEncoder(
        depth,
        num_heads,
        mlp_dim,
        jumbo_multiplier=jumbo_multiplier,
        jumbo_mlp_dim=jumbo_mlp_dim,
        share_jumbo_mlp=share_jumbo_mlp,
        jumbo_lora_rank=jumbo_lora_rank,
        last_block_patch_mlp=last_block_patch_mlp,
        # Nothing reads the Jumbo token after the last block for head="avg".
        last_block_jumbo_mlp=head != "avg",
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        drop_path_rate=drop_path_rate,
        drop_path_schedule=drop_path_schedule,
        layer_scale_init_value=layer_scale_init_value,
        layer_norm_epsilon=layer_norm_epsilon,
        activation=activation,
        qkv_bias=qkv_bias,
        name="encoder",
    )

    # === Functional Model ===
    inputs = keras.Input(shape=input_shape, name="images")
    x = patch_embedding(inputs)
    x = position_embedding(x)
    x = keras.layers.Reshape((-1, hidden_dim), name="flatten")(x)
    x = token_dropping(x)
    if is_jumbo:
        x = JumboToken(jumbo_multiplier, name="jumbo_token")(x)
    else:
        if num_registers:
            x = Registers(num_registers, name="registers")(x)
        if use_class_token:
            x = ClassToken(name="class_token")(x)
    if branch_blocks:
        for block in branch_blocks:
            x = block(x)
    else:
        x = encoder(x)
    if head == "jumbo":
        # The paper's head: LayerNorm over the reassembled J*D token, then
        # J*D -> classes (§3.2).
        x = TokenPooling("jumbo", num_prefix, name="pooling")(x)
        x = _layer_norm(layer_norm_epsilon, "final_norm")(x)
    else:
        # Official release / plain ViT: LayerNorm (width D) on every token.
        x = _layer_norm(layer_norm_epsilon, "final_norm")(x)
        x = TokenPooling(head, num_prefix, name="pooling")(x)
    outputs = x
    if include_top:
        if head_dropout_rate:
            x = keras.layers.Dropout(head_dropout_rate, name="head_dropout")(x)
        outputs = keras.layers.Dense(
            num_classes,
            activation=classifier_activation,
            kernel_initializer="zeros",
            name="head",
        )(x)
    return keras.Model(inputs, outputs, name=name)


def ViT(size="nano", *, num_classes=1000, head="token", **kwargs):
    """Plain ViT with a CLS token (Dosovitskiy et al. 2021).

    Same arguments as `RegistersViT` with `num_registers=0`. Default head:
    `"token"` (CLS); `"avg"` averages the patch tokens.

    Example:
    >>> model = ViT("pico", image_size=32, patch_size=8, num_classes=10)
    """
    kwargs.setdefault("name", f"vit_{size}")
    return build_vision_transformer(
        size, num_classes=num_classes, head=head, **kwargs
    )


def RegistersViT(
    size="nano", *, num_registers=16, num_classes=1000, head="token", **kwargs
):
    """ViT+Registers (Darcet et al., ICLR 2024), the Jumbo paper's baseline.

    Tokens are `[CLS, reg_1..reg_R, patches]`; every token shares the patch
    FFN; registers are dropped by the head. R=16 by default (Jumbo paper
    §4.1.1, Appendix Table 5). Other arguments as in `JumboViT`.

    Example:
    >>> model = RegistersViT("pico", image_size=32, patch_size=8,
    ...                      num_classes=10, num_registers=4)
    """
    kwargs.setdefault("name", f"registers_vit_{size}")
    return build_vision_transformer(
        size,
        num_registers=num_registers,
        num_classes=num_classes,
        head=head,
        **kwargs,
    )


def JumboViT(
    size="nano",
    *,
    num_classes=1000,
    image_size=224,
    patch_size=16,
    jumbo_multiplier=None,
    jumbo_mlp_ratio=4,
    share_jumbo_mlp=False,
    jumbo_lora_rank=None,
    head="jumbo",
    include_top=True,
    **kwargs,
):
    """ViT+Jumbo: a J-times-wider CLS token with its own wide FFN.

    The Jumbo token (width `J * D`) is split into J tokens for attention
    with the patches and reassembled for its own FFN of hidden width
    `jumbo_mlp_ratio * J * D` in every block (Jumbo paper §3.2, Fig. 2).

    Args:
        size: `"pico"`, `"nano"`, `"tiny"`, `"small"` or `"base"` (widths
            96/128/192/384/768, heads 3/4/3/6/12, depth 12).
        num_classes: int, classes of the classifier.
        image_size: int or pair, input height/width; also the grid of the
            stored position embeddings (see `with_image_size`).
        patch_size: int or pair.
        jumbo_multiplier: J; None takes the size's default (6; 3 for base).
        jumbo_mlp_ratio: the inner Jumbo FFN multiplier (Table 2; 4).
        share_jumbo_mlp: one Jumbo FFN for all layers (official release,
            Table 3 "layer share"); each layer keeps its own LayerNorm.
        jumbo_lora_rank: with `share_jumbo_mlp`, a per-layer rank-r branch
            `J*D -> r -> J*D` added to the shared FFN (Table 3 "LoRA").
        head: `"jumbo"` (paper: LayerNorm(J*D) then J*D -> classes; the last
            block's patch FFN is not built since nothing reads it) or
            `"official"` (official release: LayerNorm(D) on all tokens, then
            concat(Jumbo token, mean of patches) -> classes), or `"avg"`.
        include_top: bool; False returns the head's input features.
        **kwargs: overrides: `hidden_dim`, `depth`, `num_heads`,
            `mlp_ratio`, `num_channels`, `dropout_rate`,
            `attention_dropout_rate`, `drop_path_rate`,
            `drop_path_schedule`, `head_dropout_rate`,
            `layer_scale_init_value`, `layer_norm_epsilon` (1e-6; the
            official release uses PyTorch's 1e-5), `activation`,
            `qkv_bias`, `token_drop_rate`, `last_block_patch_mlp`,
            `classifier_activation`, `data_format`, `name`.

    Returns:
        A functional `keras.Model` from images to logits (or features).

    Example:
    >>> model = JumboViT("pico", image_size=32, patch_size=8, num_classes=10)
    >>> model(np.zeros((2, 32, 32, 3))).shape
    (2, 10)

    Reference: Fuller et al., "Simpler Fast Vision Transformers with a
    Jumbo CLS Token", arXiv 2502.15021.
    """
    if jumbo_multiplier is None:
        jumbo_multiplier = get_size(size)["jumbo"]
    check_positive_int("jumbo_multiplier", jumbo_multiplier)
    kwargs.setdefault("name", f"jumbo_vit_{size}")
    return build_vision_transformer(
        size,
        num_classes=num_classes,
        image_size=image_size,
        patch_size=patch_size,
        jumbo_multiplier=jumbo_multiplier,
        jumbo_mlp_ratio=jumbo_mlp_ratio,
        share_jumbo_mlp=share_jumbo_mlp,
        jumbo_lora_rank=jumbo_lora_rank,
        head=head,
        include_top=include_top,
        **kwargs,
    )


def with_image_size(model, image_size):
    """The same model (same weights) taking images of another size.

    Clones the functional graph with a new input size; each
    `PositionEmbedding` keeps its stored table and resamples it to the new
    grid on the fly, so a model trained at 128 px runs at 224 px (FixRes
    fine-tuning, Jumbo paper §4.1.1).

    Example:
    >>> small = JumboViT("pico", image_size=32, patch_size=8, num_classes=10)
    >>> large = with_image_size(small, 64)
    >>> large(np.zeros((1, 64, 64, 3))).shape
    (1, 10)
    """
    image_size = to_pair("image_size", image_size)
    old_shape = model.inputs[0].shape
    channels_first = any(
        isinstance(layer, PatchEmbedding)
        and layer.data_format == "channels_first"
        for layer in model.layers
    )
    if channels_first:
        shape = (old_shape[1], *image_size)
    else:
        shape = (*image_size, old_shape[-1])
    inputs = keras.Input(shape=shape, name=model.inputs[0].name)
    clone = keras.models.clone_model(model, input_tensors=inputs)
    clone.set_weights(model.get_weights())
    return clone
