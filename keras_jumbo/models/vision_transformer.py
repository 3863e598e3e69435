"""The ViT family as model classes: `ViT`, `RegistersViT`, `JumboViT`.

Each class is a `keras.Model` built in the functional style inside
`__init__` (as keras-hub's backbones are): its constructor arguments are
its config (`get_config()` returns them, with the size table's values filled
in), `keras.saving.load_model` gives the class back, and code that
transforms a model (`with_image_size`, `load_official_jumbo`, `count_macs`,
`reparameterize`) reads the config and the layer attributes below, never
layer names.

Layer attributes (always present; `None` where the variant has none):
`patch_embedding`, `position_embedding`, `flatten_patches`,
`token_dropping`, `jumbo_token`, `registers`, `class_token`, `encoder` (a
`TransformerEncoder`; `None` for `NonDeepViT`, whose blocks are `blocks`),
`blocks`, `final_norm`, `pooling`, `head_dropout`, `classifier` (the Dense
head; `None` without a top).
`forward_with_attention_maps` runs the same layers in the same order and
also returns chosen blocks' attention maps.
"""

import logging

import keras

from keras_jumbo.layers import MLP
from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import JumboToken
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import Registers
from keras_jumbo.layers import TokenDropping
from keras_jumbo.layers import TokenPooling
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers import ViTBlock
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_float
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import standardize_data_format
from keras_jumbo.layers._utils import to_pair
from keras_jumbo.layers.dropout import Dropout
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.models.base import ConfiguredModel
from keras_jumbo.models.base import check_not_quantized
from keras_jumbo.models.base import constructor_arguments
from keras_jumbo.models.vit_sizes import VIT_SIZES
from keras_jumbo.models.vit_sizes import get_size
from keras_jumbo.schedules import drop_path_rates

HEADS = ("jumbo", "official", "token", "avg")
logger = logging.getLogger("keras_jumbo")


class VisionTransformerBase(ConfiguredModel):
    """What the ViT-family classes share: validation, graph, config.

    Not built directly: `ViT`, `RegistersViT`, `JumboViT` and `NonDeepViT`
    call `_build` from their `__init__` with their resolved config.
    """

    input_shape_hint = (
        " For another image size, rebuild the model at that size with "
        "`keras_jumbo.models.with_image_size(model, size)` (position "
        "embeddings resampled once)."
    )

    exposed_layers = (
        "patch_embedding",
        "position_embedding",
        "flatten_patches",
        "token_dropping",
        "jumbo_token",
        "registers",
        "class_token",
        "encoder",
        "blocks",
        "final_norm",
        "pooling",
        "head_dropout",
        "classifier",
    )

    def _build(self, config, graph, name, kwargs):
        """Validate `graph` options, build the layers and the graph.

        `config` is what `get_config()` returns (the constructor's
        arguments, sizes filled in); `graph` the full set of options of the
        shared stem/encoder/head.
        """
        g = dict(graph)
        for key in ("hidden_dim", "depth", "num_heads"):
            check_positive_int(key, g[key])
        if g["hidden_dim"] % g["num_heads"]:
            raise ValueError(
                "`hidden_dim` must be divisible by `num_heads`. Received: "
                f"hidden_dim={g['hidden_dim']}, num_heads={g['num_heads']}"
            )
        check_positive_int("num_classes", g["num_classes"])
        check_positive_int("num_channels", g["num_channels"])
        check_positive_int("num_registers", g["num_registers"], allow_zero=True)
        check_positive_int(
            "jumbo_multiplier", g["jumbo_multiplier"], allow_zero=True
        )
        check_bool("include_top", g["include_top"])
        check_rate("token_drop_rate", g["token_drop_rate"])
        check_rate("head_dropout_rate", g["head_dropout_rate"])
        check_positive_float("mlp_ratio", g["mlp_ratio"])
        check_positive_float("jumbo_mlp_ratio", g["jumbo_mlp_ratio"])
        check_positive_float("layer_norm_epsilon", g["layer_norm_epsilon"])
        image_size = to_pair("image_size", g["image_size"])
        patch_size = to_pair("patch_size", g["patch_size"])
        if any(i % p for i, p in zip(image_size, patch_size, strict=True)):
            raise ValueError(
                "`image_size` must be divisible by `patch_size`. Received: "
                f"image_size={image_size}, patch_size={patch_size}"
            )
        check_choice(
            "drop_path_schedule",
            g["drop_path_schedule"],
            {"linear", "constant"},
        )
        head = check_choice("head", g["head"], HEADS)
        is_jumbo = g["jumbo_multiplier"] > 0
        if head in ("jumbo", "official") and not is_jumbo:
            raise ValueError(
                f"head={head!r} reads the Jumbo token; use it with "
                "jumbo_multiplier >= 1. Received: jumbo_multiplier=0"
            )
        if head == "token" and not (is_jumbo or g["use_class_token"]):
            raise ValueError(
                "head='token' needs a CLS token. "
                "Received: use_class_token=False"
            )
        data_format = standardize_data_format(g["data_format"])
        dim = g["hidden_dim"]
        grid = (image_size[0] // patch_size[0], image_size[1] // patch_size[1])
        if data_format == "channels_last":
            input_shape = (*image_size, g["num_channels"])
        else:
            input_shape = (g["num_channels"], *image_size)
        if is_jumbo:
            num_prefix = g["jumbo_multiplier"]
        else:
            num_prefix = int(g["use_class_token"]) + g["num_registers"]
        last_block_patch_mlp = g["last_block_patch_mlp"]
        if last_block_patch_mlp is None:
            # The Jumbo head alone never reads patch tokens after the last
            # block, so the paper does not build that FFN (§3.2).
            last_block_patch_mlp = not (is_jumbo and head == "jumbo")
        mlp_dim = int(dim * g["mlp_ratio"])

        # === Layers ===
        self.patch_embedding = PatchEmbedding(
            dim, patch_size, data_format=data_format, name="patch_embedding"
        )
        self.position_embedding = PositionEmbedding(
            grid, name="position_embedding"
        )
        self.token_dropping = TokenDropping(
            g["token_drop_rate"], name="token_dropping"
        )
        self.jumbo_token = self.registers = self.class_token = None
        if is_jumbo:
            self.jumbo_token = JumboToken(
                g["jumbo_multiplier"], name="jumbo_token"
            )
        else:
            if g["num_registers"]:
                self.registers = Registers(g["num_registers"], name="registers")
            if g["use_class_token"]:
                self.class_token = ClassToken(name="class_token")
        blocks = self._build_blocks(g, mlp_dim)
        if blocks is None:
            self.encoder = self._build_encoder(g, mlp_dim, last_block_patch_mlp)
            self.blocks = self.encoder.blocks
        else:
            self.encoder = None
            self.blocks = blocks
        self.final_norm = LayerNormalization(
            epsilon=g["layer_norm_epsilon"], name="final_norm"
        )
        self.pooling = TokenPooling(head, num_prefix, name="pooling")
        self.head_dropout = None
        if g["include_top"] and g["head_dropout_rate"]:
            self.head_dropout = Dropout(
                g["head_dropout_rate"], name="head_dropout"
            )
        self.classifier = None
        if g["include_top"]:
            self.classifier = keras.layers.Dense(
                g["num_classes"],
                activation=g["classifier_activation"],
                kernel_initializer="zeros",
                name="head",
            )

        self.flatten_patches = keras.layers.Reshape((-1, dim), name="flatten")

        # === Functional Model ===
        inputs = keras.Input(shape=input_shape, name="images")
        x = self._embed(inputs)
        if self.encoder is not None:
            x = self.encoder(x)
        else:
            for block in self.blocks:
                x = block(x)
        x = self._head(x)

        # === Config ===
        config = dict(config)
        for key in ("image_size", "patch_size"):
            if key in config:
                config[key] = to_pair(key, config[key])
        if "data_format" in config:
            config["data_format"] = data_format
        self._finish(inputs, x, config, name, kwargs)

    # --- the forward pass in parts (the functional graph is built from
    # the same methods) ----------------------------------------------------
    def _embed(self, images, training=None):
        """Images -> the token sequence the first block reads."""
        x = self.patch_embedding(images)
        x = self.position_embedding(x)
        x = self.flatten_patches(x)
        x = self.token_dropping(x, training=training)
        for prefix in (self.jumbo_token, self.registers, self.class_token):
            if prefix is not None:
                x = prefix(x)
        return x

    def _run_block(self, block, x, training=None):
        if isinstance(block, JumboBlock):
            return block(
                x,
                training=training,
                shared_jumbo_mlp=self.encoder.shared_jumbo_mlp,
            )
        return block(x, training=training)

    def _head(self, x, training=None):
        """The last block's tokens -> the model's output."""
        if self.pooling.mode == "jumbo":
            # The paper's head: LayerNorm over the reassembled J*D token,
            # then J*D -> classes (§3.2).
            x = self.final_norm(self.pooling(x))
        else:
            # Official release / plain ViT: LayerNorm (width D) on every
            # token, then pooling.
            x = self.pooling(self.final_norm(x))
        if self.head_dropout is not None:
            x = self.head_dropout(x, training=training)
        if self.classifier is not None:
            x = self.classifier(x)
        return x

    def forward_with_attention_maps(self, images, blocks=(-1,), training=None):
        """The model's output and the attention maps of some blocks.

        One pass through the model, the same computation as calling it;
        for each listed block, `attention_maps` of its input recomputes
        that block's q/k projections and softmax once more (the block's
        call does not return its maps). The maps are
        `(batch, heads, tokens, tokens)`, rows summing to 1 (a Non-Deep ViT
        block gives its branches' average). For attention-map distillation
        (`keras_jumbo.losses.AttentionMapDistiller`).

        Args:
            images: a batch the model takes.
            blocks: indices into `model.blocks` (negative from the end).
            training: bool, passed to every layer.

        Returns:
            `(outputs, [maps of blocks[0], maps of blocks[1], ...])`.

        Example:
        >>> model = ViT("pico", image_size=32, patch_size=8, num_classes=10)
        >>> logits, (last,) = model.forward_with_attention_maps(
        ...     np.zeros((2, 32, 32, 3)))
        >>> tuple(last.shape)  # 16 patches + the class token, 3 heads
        (2, 3, 17, 17)
        """
        depth = len(self.blocks)
        wanted = []
        for index in blocks:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(
                    "`blocks` must be ints (block indices). "
                    f"Received: blocks={blocks!r}"
                )
            if not -depth <= index < depth:
                raise ValueError(
                    f"Block index {index} is out of range for a model of "
                    f"{depth} blocks. Received: blocks={blocks!r}"
                )
            wanted.append(index % depth)
        self.check_input_shapes(images)
        x = self._embed(images, training=training)
        maps = {}
        for i, block in enumerate(self.blocks):
            if i in wanted:
                maps[i] = block.attention_maps(x)
            x = self._run_block(block, x, training=training)
        return self._head(x, training=training), [maps[i] for i in wanted]

    def _build_blocks(self, graph, mlp_dim):
        """Blocks built by a subclass instead of the encoder (or None)."""
        return None

    def _build_encoder(self, g, mlp_dim, last_block_patch_mlp):
        """`ViTBlock`s, or `JumboBlock`s (+ the shared Jumbo FFN)."""
        depth = g["depth"]
        rates = drop_path_rates(
            g["drop_path_rate"], depth, g["drop_path_schedule"]
        )
        common = dict(
            num_heads=g["num_heads"],
            mlp_dim=mlp_dim,
            dropout_rate=g["dropout_rate"],
            attention_dropout_rate=g["attention_dropout_rate"],
            layer_scale_init_value=g["layer_scale_init_value"],
            layer_norm_epsilon=g["layer_norm_epsilon"],
            activation=g["activation"],
            qkv_bias=g["qkv_bias"],
        )
        num_jumbo = g["jumbo_multiplier"]
        if not num_jumbo:
            blocks = [
                ViTBlock(**common, drop_path_rate=rate, name=f"block_{i}")
                for i, rate in enumerate(rates)
            ]
            return TransformerEncoder(blocks, name="encoder")
        jumbo_mlp_dim = int(num_jumbo * g["hidden_dim"] * g["jumbo_mlp_ratio"])
        shared = g["share_jumbo_mlp"]
        blocks = [
            JumboBlock(
                **common,
                jumbo_multiplier=num_jumbo,
                jumbo_mlp_dim=jumbo_mlp_dim,
                share_jumbo_mlp=shared,
                jumbo_lora_rank=g["jumbo_lora_rank"],
                use_patch_mlp=last_block_patch_mlp or i < depth - 1,
                # Nothing reads the Jumbo token after the last block for
                # head="avg".
                use_jumbo_mlp=g["head"] != "avg" or i < depth - 1,
                drop_path_rate=rate,
                name=f"block_{i}",
            )
            for i, rate in enumerate(rates)
        ]
        shared_mlp = None
        if shared:
            shared_mlp = MLP(
                jumbo_mlp_dim,
                activation=g["activation"],
                dropout_rate=g["dropout_rate"],
                name="shared_jumbo_mlp",
            )
        return TransformerEncoder(
            blocks, shared_jumbo_mlp=shared_mlp, name="encoder"
        )

    @property
    def grid_size(self):
        """The patch grid `(rows, cols)` at the model's image size."""
        return self.position_embedding.grid_size

    @property
    def num_prefix_tokens(self):
        """Tokens before the patches: J, or CLS + registers."""
        return self.pooling.num_prefix_tokens

    @classmethod
    def from_preset(
        cls,
        preset,
        *,
        num_classes=None,
        include_top=None,
        image_size=None,
        cache_dir=None,
        **config_changes,
    ):
        """A model with pretrained weights, by preset name, path or URL.

        Args:
            preset: a name from `keras_jumbo.models.list_presets()` (e.g.
                `"jumbo_nano_imagenet1k"`: downloaded once (resumed if
                interrupted), converted, cached), a directory
                written by `save_to_preset`, the path of an official Jumbo
                `.pth` checkpoint, or an `http(s)://` / `file://` URL of one.
            num_classes: None keeps the preset's head; another number keeps
                the pretrained backbone and starts a fresh, zero-initialised
                head (logged once).
            include_top: False drops the head (pooled features out).
            image_size: None keeps the preset's; another size resamples
                the position embeddings (as `with_image_size`).
            cache_dir: where downloads and converted weights are kept
                (default `$KERAS_HOME` or `~/.keras`, under `keras_jumbo/`).
            **config_changes: other config values that keep every weight's
                shape (`dropout_rate`, `drop_path_rate`, `data_format`, ...).

        Example (offline: pass a local copy of the official file):
        ```python
        model = JumboViT.from_preset("jumbo_nano_imagenet1k")
        model = JumboViT.from_preset("path/to/jumbo_nano.pth", num_classes=10)
        ```
        """
        from keras_jumbo.presets.loader import load_preset

        model = load_preset(preset, cache_dir=cache_dir)
        if not isinstance(model, cls):
            raise ValueError(
                f"The preset holds a {type(model).__name__}, not a "
                f"{cls.__name__}: use {type(model).__name__}.from_preset. "
                f"Received: preset={preset!r}"
            )
        changes = dict(config_changes)
        for key, value in (
            ("num_classes", num_classes),
            ("include_top", include_top),
            ("image_size", image_size),
        ):
            if value is not None:
                changes[key] = value
        if "image_size" in changes:
            changes["image_size"] = to_pair("image_size", changes["image_size"])
        current = model.get_config()
        changes = {k: v for k, v in changes.items() if current.get(k) != v}
        if not changes:
            return model
        new, head_kept = with_config(model, **changes)
        if new.classifier is not None and not head_kept:
            logger.warning(
                "%s.from_preset(%r): kept the pretrained backbone; the head "
                "is new (%d classes, zero-initialised): train it before use.",
                cls.__name__,
                preset,
                new.num_classes,
            )
        return new

    def save_to_preset(self, preset_dir):
        """Save as a preset directory that `from_preset` loads back."""
        from keras_jumbo.presets.loader import save_to_preset

        return save_to_preset(self, preset_dir)


def graph_defaults():
    """Every option of the shared graph, at the values of a plain ViT."""
    return dict(
        num_classes=1000,
        image_size=224,
        patch_size=16,
        num_channels=3,
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
        data_format=None,
    )


def _sized(config, size):
    """Fill `hidden_dim`/`depth`/`num_heads` left as None from `size`."""
    spec = get_size(size)
    for key in ("hidden_dim", "depth", "num_heads"):
        if config.get(key, 0) is None:
            config[key] = spec[key]
    return config


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ViT(VisionTransformerBase):
    """Plain ViT with a CLS token (Dosovitskiy et al., ICLR 2021).

    Sizes (`VIT_SIZES`, the Jumbo paper's §2.1 and the official
    `configs.py`): pico/nano/tiny/small/base = width 96/128/192/384/768,
    heads 3/4/3/6/12, depth 12, patch 16, FFN ratio 4.

    Args:
        size: `"pico"`, `"nano"`, `"tiny"`, `"small"` or `"base"`.
        num_classes: int, classes of the classifier.
        image_size: int or pair; also the grid of the stored position
            embeddings (`with_image_size` resamples them).
        patch_size: int or pair.
        num_channels: int, input channels.
        hidden_dim, depth, num_heads: None takes the size's value.
        mlp_ratio: FFN hidden width / `hidden_dim`.
        num_registers: int, register tokens after the CLS token
            (`RegistersViT` defaults it to 16).
        use_class_token: bool; False for average pooling without CLS.
        head: `"token"` (the CLS token) or `"avg"` (mean patch token).
        include_top: bool; False returns the pooled features.
        classifier_activation: activation of the head (None: logits).
        dropout_rate, attention_dropout_rate: floats in [0, 1).
        drop_path_rate: stochastic depth of the last block.
        drop_path_schedule: `"linear"` (0 -> rate over depth, DeiT/timm)
            or `"constant"`.
        head_dropout_rate: dropout before the head.
        layer_scale_init_value: float or None (no LayerScale).
        layer_norm_epsilon: float > 0 (1e-6; PyTorch's default is 1e-5).
        activation: FFN activation (`"gelu"`: exact, erf form).
        qkv_bias: bool.
        token_drop_rate: fraction of patch tokens dropped in training
            (ImageNet-21K recipe; `TokenDropSchedule` drives it).
        data_format: `"channels_last"` or `"channels_first"`; None takes
            `keras.config.image_data_format()`.
        name: model name (default `vit_<size>`).
        **kwargs: `trainable`, `dtype` of `keras.Model`; `quantization`
            (every model class; see `ConfiguredModel`).

    Example:
    >>> model = ViT("pico", image_size=32, patch_size=8, num_classes=10)
    >>> model(np.zeros((2, 32, 32, 3))).shape
    (2, 10)
    """

    def __init__(
        self,
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
        data_format=None,
        name=None,
        **kwargs,
    ):
        config = _sized(constructor_arguments(locals()), size)
        self._build(
            config,
            {**graph_defaults(), **config},
            name or f"{self._name_prefix}_{size}",
            kwargs,
        )

    _name_prefix = "vit"


@keras.saving.register_keras_serializable(package="keras_jumbo")
class RegistersViT(ViT):
    """ViT+Registers (Darcet et al., ICLR 2024), the Jumbo paper's baseline.

    Tokens are `[CLS, reg_1..reg_R, patches]`; every token shares the patch
    FFN; the head drops the registers. R=16 by default (Jumbo paper §4.1.1,
    Appendix Table 5). Arguments as `ViT`, with `num_registers=16`.

    Example:
    >>> model = RegistersViT("pico", image_size=32, patch_size=8,
    ...                      num_classes=10, num_registers=4)
    >>> model.num_prefix_tokens
    5
    """

    _name_prefix = "registers_vit"

    def __init__(self, size="nano", *, num_registers=16, **kwargs):
        super().__init__(size, num_registers=num_registers, **kwargs)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class JumboViT(VisionTransformerBase):
    """ViT+Jumbo: a J-times-wider CLS token with its own wide FFN.

    The Jumbo token (width `J * D`) is split into J tokens for attention
    with the patches and reassembled for its own FFN of hidden width
    `jumbo_mlp_ratio * J * D` in every block (Jumbo paper §3.2, Fig. 2).
    Sizes as `ViT`; J = 6 (3 for base; official `configs.py`).
    `JumboViT.from_preset("jumbo_nano_imagenet1k")` gives the official
    ImageNet-1K weights (see `keras_jumbo.models.list_presets()`).

    Args:
        size: `"pico"`, `"nano"`, `"tiny"`, `"small"` or `"base"`.
        jumbo_multiplier: J; None takes the size's default.
        jumbo_mlp_ratio: the Jumbo FFN's hidden width / (J*D) (Table 2; 4).
        share_jumbo_mlp: one Jumbo FFN for all layers (official release,
            Table 3 "layer share"); each layer keeps its own LayerNorm.
        jumbo_lora_rank: with `share_jumbo_mlp`, a per-layer rank-r branch
            `J*D -> r -> J*D` added to the shared FFN (Table 3 "LoRA").
        head: `"jumbo"` (paper: LayerNorm(J*D) then J*D -> classes; the last
            block's patch FFN is not built since nothing reads it),
            `"official"` (official release: LayerNorm(D) on all tokens, then
            concat(Jumbo token, mean of patches) -> classes), or `"avg"`.
        last_block_patch_mlp: None (build it unless `head="jumbo"`) or bool.
        Other arguments as `ViT` (no CLS token or registers); name default
        `jumbo_vit_<size>`.

    Example:
    >>> model = JumboViT("pico", image_size=32, patch_size=8, num_classes=10)
    >>> model(np.zeros((2, 32, 32, 3))).shape
    (2, 10)
    >>> model.jumbo_multiplier, model.get_config()["hidden_dim"]
    (6, 96)

    Reference: Fuller et al., "Simpler Fast Vision Transformers with a
    Jumbo CLS Token", arXiv 2502.15021.
    """

    def __init__(
        self,
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
        jumbo_multiplier=None,
        jumbo_mlp_ratio=4.0,
        share_jumbo_mlp=False,
        jumbo_lora_rank=None,
        head="jumbo",
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
        data_format=None,
        name=None,
        **kwargs,
    ):
        config = _sized(constructor_arguments(locals()), size)
        if jumbo_multiplier is None:
            config["jumbo_multiplier"] = get_size(size)["jumbo"]
        check_positive_int("jumbo_multiplier", config["jumbo_multiplier"])
        self._build(
            config,
            {**graph_defaults(), **config, "use_class_token": False},
            name or f"jumbo_vit_{size}",
            kwargs,
        )


def with_config(model, **changes):
    """The model rebuilt with `changes` to its config, keeping its weights.

    Every weight is copied, with two exceptions: the position-embedding
    table is resampled when `image_size` changes the patch grid (bicubic,
    antialiased, as timm's `resample_abs_pos_embed`), and the classifier
    starts fresh (zero-initialised, as built) when `num_classes` changes;
    `include_top=False` drops it. Any other change must keep every weight's
    shape (e.g. `dropout_rate`, `drop_path_rate`, `data_format`,
    `classifier_activation`); one that does not raises a `ValueError`
    naming the changes.

    `dtype="bfloat16"` gives a trained model's inference copy with every
    weight stored in bfloat16 (rounded once; `ProgressiveJoin`'s λ stays
    float32): under `mixed_bfloat16` JAX's CPU casts each float32 kernel
    in every step, which slows JumboViT's wide FFN most.

    Returns:
        `(new_model, head_kept)`: `head_kept` is False when the classifier
        was not copied.
    """
    if not isinstance(model, VisionTransformerBase):
        raise TypeError(
            "`model` must be a ViT-family model (ViT, RegistersViT, "
            f"JumboViT, NonDeepViT). Received: {type(model).__name__}"
        )
    check_not_quantized(model, "with_config")
    config = {**model.get_config(), **changes}
    new = type(model).from_config(config)

    def body(m):
        head = {id(w) for w in m.classifier.weights} if m.classifier else set()
        return [w for w in m.weights if id(w) not in head]

    old_body, new_body = body(model), body(new)
    if len(old_body) != len(new_body):
        raise ValueError(
            f"These changes alter the architecture: {changes}. "
            f"Received: {len(old_body)} weights before, {len(new_body)} after"
        )
    table = model.position_embedding.embeddings
    for old, fresh in zip(old_body, new_body, strict=True):
        if old is table:
            fresh.assign(model.position_embedding.resampled(new.grid_size))
            continue
        if tuple(old.shape) != tuple(fresh.shape):
            raise ValueError(
                f"These changes alter the weight {old.path!r} from "
                f"{tuple(old.shape)} to {tuple(fresh.shape)}: {changes}"
            )
        fresh.assign(old)
    head_kept = False
    if model.classifier is not None and new.classifier is not None:
        shapes = [tuple(w.shape) for w in model.classifier.weights]
        if shapes == [tuple(w.shape) for w in new.classifier.weights]:
            new.classifier.set_weights(model.classifier.get_weights())
            head_kept = True
    return new, head_kept


def with_image_size(model, image_size):
    """The same model (same weights) taking images of another size.

    Builds the model's class again from its config with the new
    `image_size` and copies the weights; the position-embedding table is
    resampled to the new grid (bicubic, antialiased; as timm's
    `resample_abs_pos_embed`), so a model trained at 128 px runs at 224 px
    (FixRes fine-tuning, Jumbo paper §4.1.1).

    Example:
    >>> small = JumboViT("pico", image_size=32, patch_size=8, num_classes=10)
    >>> large = with_image_size(small, 64)
    >>> large(np.zeros((1, 64, 64, 3))).shape
    (1, 10)
    """
    image_size = to_pair("image_size", image_size)
    return with_config(model, image_size=image_size)[0]


__all__ = [
    "JumboViT",
    "RegistersViT",
    "VIT_SIZES",
    "ViT",
    "VisionTransformerBase",
    "with_config",
    "with_image_size",
]
