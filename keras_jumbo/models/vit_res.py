"""Multi-stage ViT-Res and the searched ViT-ResNAS networks.

Liao et al., "Searching for Efficient Multi-Stage Vision Transformers"
(ViT-ResNAS), §2.2, §2.4, Appendix A and D.
"""

import keras

from keras_jumbo.layers import BatchNormalization
from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import Conv2D
from keras_jumbo.layers import MaskedLayerNorm
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers import TokenPooling
from keras_jumbo.layers import ViTBlock
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_float
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import standardize_data_format
from keras_jumbo.models.base import ConfiguredModel
from keras_jumbo.models.base import constructor_arguments
from keras_jumbo.schedules import drop_path_rates

# Reduction of the image side before the first stage: a stride-2 stem and
# a stride-7 patch projection (the paper's "patch size 14"). Each of the two
# residual spatial reductions halves the grid again: 224 -> 16, 8, 4.
STEM_STRIDE = 2
PATCH_SIZE = 7


def _uniform(heads, mlp_dim, count):
    return tuple((heads, mlp_dim) for _ in range(count))


# Table 4: ViT-Res-Tiny, DeiT-Tiny split into 3 stages of 4 blocks.
# Tables 6-8: the searched ViT-ResNAS networks, (heads, FFN hidden) per
# block; head widths 32 / 48 / 64 per stage (Appendix B).
ARCHITECTURES = {
    "vit_res_tiny": dict(
        stem_filters=24,
        embed_dims=(192, 384, 768),
        head_dims=(64, 64, 64),
        blocks=(
            _uniform(3, 768, 4),
            _uniform(6, 1536, 4),
            _uniform(12, 3072, 4),
        ),
    ),
    "vit_resnas_tiny": dict(
        stem_filters=24,
        embed_dims=(176, 352, 704),
        head_dims=(32, 48, 64),
        blocks=(
            ((3, 704), (3, 576), (3, 640), (4, 576), (4, 704)),
            (
                (10, 1408),
                (8, 1408),
                (8, 1280),
                (8, 1408),
                (10, 1280),
                (10, 1024),
            ),
            ((10, 2560), (10, 1792), (10, 2816), (8, 2816), (8, 2560)),
        ),
    ),
    "vit_resnas_small": dict(
        stem_filters=24,
        embed_dims=(220, 440, 880),
        head_dims=(32, 48, 64),
        blocks=(
            ((5, 880), (5, 880), (7, 800), (5, 720), (5, 720), (5, 720)),
            (
                (10, 1760),
                (10, 1440),
                (10, 1920),
                (10, 1600),
                (12, 1600),
                (12, 1440),
            ),
            ((16, 3200), (12, 3200), (16, 2880), (12, 2240), (14, 2560)),
        ),
    ),
    "vit_resnas_medium": dict(
        stem_filters=24,
        embed_dims=(240, 640, 880),
        head_dims=(32, 48, 64),
        blocks=(
            (
                (7, 960),
                (6, 960),
                (7, 800),
                (8, 960),
                (7, 880),
                (8, 880),
                (6, 800),
            ),
            (
                (10, 1120),
                (14, 1760),
                (14, 1920),
                (16, 1760),
                (14, 1440),
                (16, 1760),
                (16, 1920),
            ),
            (
                (16, 3200),
                (10, 3840),
                (16, 3840),
                (12, 3200),
                (16, 3520),
                (14, 3520),
            ),
        ),
    ),
}


def validate_architecture(arch):
    """Check an architecture dict; return it with tuples (see `ViTRes`)."""
    if not isinstance(arch, dict):
        raise TypeError(f"`architecture` must be a dict. Received: {arch!r}")
    missing = {"embed_dims", "head_dims", "blocks"} - set(arch)
    if missing:
        raise ValueError(
            f"`architecture` lacks keys {sorted(missing)}. Received: {arch!r}"
        )
    embed_dims = tuple(arch["embed_dims"])
    head_dims = tuple(arch["head_dims"])
    blocks = tuple(tuple(tuple(b) for b in stage) for stage in arch["blocks"])
    if not (len(embed_dims) == len(head_dims) == len(blocks) >= 1):
        raise ValueError(
            "`embed_dims`, `head_dims` and `blocks` need one entry per stage. "
            f"Received: embed_dims={embed_dims}, head_dims={head_dims}, "
            f"{len(blocks)} block lists"
        )
    for index, dim in enumerate(embed_dims):
        check_positive_int(f"embed_dims[{index}]", dim)
        if index and dim < embed_dims[index - 1]:
            raise ValueError(
                "Stage widths cannot shrink (residual spatial reduction "
                f"zero-pads channels). Received: embed_dims={embed_dims}"
            )
    for index, dim in enumerate(head_dims):
        check_positive_int(f"head_dims[{index}]", dim)
    for stage, stage_blocks in enumerate(blocks):
        for block in stage_blocks:
            if len(block) != 2:
                raise ValueError(
                    "Each block is a pair (num_heads, mlp_dim). Received: "
                    f"stage {stage} block={block!r}"
                )
            check_positive_int("num_heads", block[0])
            check_positive_int("mlp_dim", block[1])
    stem = check_positive_int("stem_filters", arch.get("stem_filters", 24))
    return dict(
        stem_filters=stem,
        embed_dims=embed_dims,
        head_dims=head_dims,
        blocks=blocks,
    )


def conv_stem(x, filters, data_format, name="stem", created=None):
    """Three 3x3 conv-BN-ReLU layers, stride 2 then 1, 1, with a residual
    connection from the first to the third output (Appendix A; reference
    `PatchConvEmbed`: convolutions without bias, BatchNorm, ReLU).

    `created`: a list the stem's layers are appended to, in order (what
    `extract_subnet` pairs between a super-network and a sub-network).

    PyTorch's symmetric padding 1 is explicit (`ZeroPadding2D`): for the
    stride-2 convolution Keras' "same" would pad only bottom/right.
    """
    axis = -1 if data_format == "channels_last" else 1

    created = [] if created is None else created

    def conv_bn_relu(inputs, strides, index):
        layers = [
            keras.layers.ZeroPadding2D(
                1, data_format=data_format, name=f"{name}_pad{index}"
            ),
            Conv2D(
                filters,
                3,
                strides=strides,
                use_bias=False,
                data_format=data_format,
                name=f"{name}_conv{index}",
            ),
            BatchNormalization(
                axis=axis,
                epsilon=1e-5,
                momentum=0.9,
                name=f"{name}_bn{index}",
            ),
            keras.layers.ReLU(name=f"{name}_relu{index}"),
        ]
        created.extend(layers)
        h = inputs
        for layer in layers:
            h = layer(h)
        return h

    first = conv_bn_relu(x, STEM_STRIDE, 1)
    h = conv_bn_relu(first, 1, 2)
    h = conv_bn_relu(h, 1, 3)
    return keras.layers.Add(name=f"{name}_residual")([first, h])


# The layers every multi-stage model (ViTRes, the super-network) exposes
# as attributes; `stem_tokens` returns them.
MULTI_STAGE_LAYERS = (
    "stem_layers",
    "patch_embedding",
    "position_embedding",
    "class_token",
    "reductions",
    "blocks",
    "final_norm",
    "classifier",
)


def stem_tokens(
    images,
    stem_filters,
    width,
    grid,
    layer_norm_epsilon,
    data_format,
    make_classifier=None,
):
    """Conv stem, 7x7 patches, position embeddings, CLS token.

    The front of every multi-stage ViT here (`ViTRes` and the NAS
    super-network). Returns `(tokens, layers)`: `layers` holds the stem's
    layers and the ones every multi-stage model exposes (`reductions` and
    `blocks` start empty for the caller to fill; `final_norm` is built;
    `classifier` is `make_classifier()`, made before the stem's layers as
    the super-network always did, so seeded initial weights are unchanged).
    """
    check_positive_float("layer_norm_epsilon", layer_norm_epsilon)
    layers = dict(
        stem_layers=[],
        patch_embedding=PatchEmbedding(
            width, PATCH_SIZE, data_format=data_format, name="patch_embedding"
        ),
        position_embedding=PositionEmbedding(grid, name="position_embedding"),
        class_token=ClassToken(name="class_token"),
        reductions=[None],
        blocks=[],
        final_norm=MaskedLayerNorm(layer_norm_epsilon, name="final_norm"),
    )
    layers["classifier"] = make_classifier() if make_classifier else None
    x = conv_stem(
        images, stem_filters, data_format, created=layers["stem_layers"]
    )
    x = layers["position_embedding"](layers["patch_embedding"](x))
    x = keras.layers.Reshape((-1, width), name="flatten")(x)
    return layers["class_token"](x), layers


def token_grid_size(image_size, num_stages):
    factor = STEM_STRIDE * PATCH_SIZE * 2 ** (num_stages - 1)
    if isinstance(image_size, bool) or not isinstance(image_size, int):
        raise TypeError(
            f"`image_size` must be an int. Received: {image_size!r}"
        )
    if image_size <= 0 or image_size % factor:
        raise ValueError(
            f"`image_size` must be a positive multiple of {factor} (stem 2 x "
            f"patch 7 x 2 per reduction). Received: image_size={image_size}"
        )
    return image_size // (STEM_STRIDE * PATCH_SIZE)


def _vit_res_graph(
    arch,
    *,
    num_classes,
    image_size,
    num_channels,
    token_labeling,
    include_top,
    drop_path_rate,
    dropout_rate,
    layer_norm_epsilon,
    classifier_activation,
    data_format,
):
    """`(inputs, outputs, layers)` of a multi-stage ViT (see `ViTRes`)."""
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_channels", num_channels)
    check_rate("drop_path_rate", drop_path_rate)
    check_rate("dropout_rate", dropout_rate)
    if not isinstance(token_labeling, bool):
        raise TypeError(
            f"`token_labeling` must be a bool. Received: {token_labeling!r}"
        )
    if token_labeling and not include_top:
        raise ValueError(
            "`token_labeling=True` adds a patch head; it needs "
            "include_top=True. Received: include_top=False"
        )
    embed_dims, head_dims = arch["embed_dims"], arch["head_dims"]
    grid = token_grid_size(image_size, len(embed_dims))
    if data_format == "channels_last":
        input_shape = (image_size, image_size, num_channels)
    else:
        input_shape = (num_channels, image_size, image_size)
    depth = sum(len(stage) for stage in arch["blocks"])
    rates = drop_path_rates(drop_path_rate, depth)

    inputs = keras.Input(shape=input_shape, name="images")
    x, layers = stem_tokens(
        inputs,
        arch["stem_filters"],
        embed_dims[0],
        grid,
        layer_norm_epsilon,
        data_format,
    )
    layers["patch_classifier"] = None
    index = 0
    for stage, stage_blocks in enumerate(arch["blocks"]):
        if stage:
            reduction = ResidualSpatialReduction(
                embed_dims[stage],
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"reduction_{stage}",
            )
            layers["reductions"].append(reduction)
            x = reduction(x)
        layers["blocks"].append([])
        for number, (heads, mlp_dim) in enumerate(stage_blocks):
            block = ViTBlock(
                heads,
                mlp_dim,
                head_dim=head_dims[stage],
                dropout_rate=dropout_rate,
                drop_path_rate=rates[index],
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"stage_{stage}_block_{number}",
            )
            layers["blocks"][-1].append(block)
            x = block(x)
            index += 1
    x = layers["final_norm"](x)
    if not include_top:
        return inputs, x, layers
    cls = TokenPooling("token", 1, name="pooling")(x)
    layers["classifier"] = keras.layers.Dense(
        num_classes, activation=classifier_activation, name="head"
    )
    logits = layers["classifier"](cls)
    if not token_labeling:
        return inputs, logits, layers
    patches = keras.layers.Cropping1D((1, 0), name="patch_tokens")(x)
    layers["patch_classifier"] = keras.layers.Dense(
        num_classes, activation=classifier_activation, name="patch_head"
    )
    patch_logits = layers["patch_classifier"](patches)
    return inputs, {"logits": logits, "patch_logits": patch_logits}, layers


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ViTRes(ConfiguredModel):
    """Multi-stage ViT with residual spatial reduction (ViT-Res, §2.2).

    DeiT-Tiny reshaped into 3 stages of 4 blocks (Table 4): a convolutional
    stem (three 3x3 conv-BN-ReLU, 24 channels, stride 2 then 1, 1, residual
    from the first to the third), a 7x7 stride-7 patch projection (224 px
    -> 16x16 tokens + CLS), then stages of widths 192/384/768 with 3/6/12
    heads of width 64 and FFN 4x, separated by `ResidualSpatialReduction`
    (16x16 -> 8x8 -> 4x4). Head: LayerNorm, then Linear on the CLS token.

    Args:
        size: `"tiny"` (the paper's only ViT-Res) or an architecture dict
            `{"embed_dims": (...), "head_dims": (...), "blocks":
            (((heads, mlp_dim), ...), ...), "stem_filters": 24}`.
        num_classes: int.
        image_size: int, 224 (a multiple of 56 for three stages).
        num_channels: int.
        token_labeling: bool; add a per-patch head for token labelling
            (§2.4); the model then returns `{"logits", "patch_logits"}`.
        include_top: bool; False returns the final-norm tokens.
        drop_path_rate: stochastic depth, linear over all blocks.
        dropout_rate, layer_norm_epsilon, classifier_activation,
        data_format: as `ViT`.
        name: default `vit_res_<size>` (`vit_res` for a dict).

    The architecture (the size's table entry, or the dict) is the
    `architecture` attribute; `get_config()` holds `size` (a dict given as
    `size` is stored validated).

    Example:
    >>> model = ViTRes("tiny", num_classes=10, image_size=56)

    Choices: the CLS token gets no position embedding (as every keras_jumbo
    ViT; the reference adds one). The blocks are plain `ViTBlock`s (the
    super-network's are `MaskedViTBlock`s with the same weight layout); the
    stem's and the final norm are `MaskedLayerNorm`, i.e. LayerNorm with
    the same weights, shared with the super-network's front.
    """

    sizes = ("tiny",)
    _prefix = "vit_res"
    # Layers of the graph, as attributes: `blocks[s][n]` is block n of stage
    # s, `reductions[s]` the reduction before stage s (None for s = 0).
    exposed_layers = (*MULTI_STAGE_LAYERS, "patch_classifier")

    def __init__(
        self,
        size="tiny",
        *,
        num_classes=1000,
        image_size=224,
        num_channels=3,
        token_labeling=False,
        include_top=True,
        drop_path_rate=0.0,
        dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        classifier_activation=None,
        data_format=None,
        name=None,
        **kwargs,
    ):
        config = constructor_arguments(locals())
        if isinstance(size, dict):
            arch = validate_architecture(size)
            config["size"] = arch
            default_name = self._prefix
        else:
            check_choice("size", size, set(self.sizes))
            arch = validate_architecture(
                ARCHITECTURES[f"{self._prefix}_{size}"]
            )
            default_name = f"{self._prefix}_{size}"
        config["data_format"] = standardize_data_format(data_format)
        inputs, outputs, layers = _vit_res_graph(
            arch,
            **{k: v for k, v in config.items() if k != "size"},
        )
        for key, layer in layers.items():
            setattr(self, key, layer)
        self._finish(inputs, outputs, config, name or default_name, kwargs)
        self.architecture = arch


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ViTResNAS(ViTRes):
    """The searched ViT-ResNAS networks (Appendix D, Tables 6-8).

    Args:
        size: `"tiny"`, `"small"` or `"medium"`.
        Other arguments as `ViTRes`.

    Example:
    >>> model = ViTResNAS("small", num_classes=10, image_size=56)
    >>> model.architecture["embed_dims"]
    (220, 440, 880)
    """

    sizes = ("tiny", "small", "medium")
    _prefix = "vit_resnas"


def build_vit_res(architecture, **kwargs):
    """A `ViTRes` of an architecture dict (e.g. a searched sub-network)."""
    return ViTRes(validate_architecture(architecture), **kwargs)
