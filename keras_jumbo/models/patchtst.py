"""PatchTST (+Registers, +Jumbo) classifiers and forecasters, MS-PatchTST.

One backbone for all of them (patching, channel independence, learned
1-D position embeddings, prefix tokens, one `TransformerEncoder` of blocks);
the models differ in their prefix tokens, head and normalisation.
"""

import math

import keras

from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import FoldChannels
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import JumboToken
from keras_jumbo.layers import MultiScalePatchFusion
from keras_jumbo.layers import PatchEmbedding1D
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import Registers
from keras_jumbo.layers import RevIN
from keras_jumbo.layers import TokenPooling
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers import ViTBlock
from keras_jumbo.layers import num_patches as count_patches
from keras_jumbo.layers import patching_for_num_patches
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers.dropout import Dropout
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.layers.multi_scale_patch_fusion import FUSION_MODES
from keras_jumbo.models.base import ConfiguredModel
from keras_jumbo.models.base import constructor_arguments
from keras_jumbo.schedules import drop_path_rates

# The PatchTST backbone every model here defaults to: the official PatchTST
# scripts' (Nie et al., ICLR 2023: width 128, 16 heads, 3 layers, FFN 256),
# which the Jumbo paper's time-series experiments keep (A.2.2).
BACKBONE = {"hidden_dim": 128, "num_heads": 16, "depth": 3, "mlp_dim": 256}


def registers_matching_jumbo_flops(width, num_patches, jumbo_multiplier):
    """Registers R whose per-layer FLOPs match a Jumbo layer (Jumbo A.2.3).

    Proposition 1 (FFN hidden width 2D, the Jumbo FFN 2·J·D):
    `R = -(2D + P) + sqrt((2D + P)² + (1 + 2D)J² + 2(D + P)J)`, rounded to
    the nearest integer as the paper does.

    Args:
        width: D, the token width.
        num_patches: P, the patch tokens per channel.
        jumbo_multiplier: J.

    Returns:
        int, R.

    Example:
    >>> registers_matching_jumbo_flops(128, 8, 4)
    10
    """
    d = check_positive_int("width", width)
    p = check_positive_int("num_patches", num_patches)
    j = check_positive_int("jumbo_multiplier", jumbo_multiplier)
    exact = -(2 * d + p) + math.sqrt(
        (2 * d + p) ** 2 + (1 + 2 * d) * j**2 + 2 * (d + p) * j
    )
    return int(round(exact))


def _patching(sequence_length, patch_length, stride, padding, num_patches):
    check_positive_int("sequence_length", sequence_length)
    if num_patches is not None:
        if patch_length is not None or stride is not None:
            raise ValueError(
                "Give either `num_patches` or `patch_length`/`stride`. "
                f"Received: num_patches={num_patches}, "
                f"patch_length={patch_length}, stride={stride}"
            )
        return patching_for_num_patches(sequence_length, num_patches)
    patch_length = 16 if patch_length is None else patch_length
    check_positive_int("patch_length", patch_length)
    if stride is None:
        stride = max(1, patch_length // 2)
    check_positive_int("stride", stride)
    count_patches(sequence_length, patch_length, stride, padding)
    return {"patch_length": patch_length, "stride": stride, "padding": padding}


def _backbone(
    series,
    patching,
    *,
    num_channels,
    hidden_dim,
    num_heads,
    depth,
    mlp_dim,
    use_class_token=False,
    num_registers=0,
    jumbo_multiplier=0,
    jumbo_mlp_dim=None,
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    drop_path_rate=0.0,
    normalization="layer_norm",
    norm_first=True,
    residual_attention=False,
    layer_norm_epsilon=1e-6,
    activation="gelu",
    prefix="",
):
    """Series `(batch, L, C)` -> tokens `(batch * C, prefix + N, D)`."""
    check_positive_int("hidden_dim", hidden_dim)
    check_positive_int("num_heads", num_heads)
    check_positive_int("depth", depth)
    check_positive_int("mlp_dim", mlp_dim)
    check_rate("dropout_rate", dropout_rate)
    if hidden_dim % num_heads:
        raise ValueError(
            "`hidden_dim` must be divisible by `num_heads`. Received: "
            f"hidden_dim={hidden_dim}, num_heads={num_heads}"
        )
    embedding = PatchEmbedding1D(
        hidden_dim, **patching, name=f"{prefix}patch_embedding"
    )
    x = embedding(series)  # (batch, C, N, D)
    x = FoldChannels(num_channels, name=f"{prefix}fold_channels")(x)
    num_patches = x.shape[1]
    x = PositionEmbedding(
        (num_patches,),
        # Official PatchTST: learned, uniform(-0.02, 0.02).
        initializer=keras.initializers.RandomUniform(-0.02, 0.02),
        name=f"{prefix}position_embedding",
    )(x)
    if dropout_rate:
        x = Dropout(dropout_rate, name=f"{prefix}pos_dropout")(x)
    if jumbo_multiplier:
        x = JumboToken(jumbo_multiplier, name=f"{prefix}jumbo_token")(x)
    else:
        if num_registers:
            x = Registers(num_registers, name=f"{prefix}registers")(x)
        if use_class_token:
            x = ClassToken(name=f"{prefix}class_token")(x)
    blocks = _encoder_blocks(
        depth=depth,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        jumbo_multiplier=jumbo_multiplier,
        jumbo_mlp_dim=jumbo_mlp_dim,
        dropout_rate=dropout_rate,
        attention_dropout_rate=attention_dropout_rate,
        drop_path_rate=drop_path_rate,
        normalization=normalization,
        norm_first=norm_first,
        residual_attention=residual_attention,
        layer_norm_epsilon=layer_norm_epsilon,
        activation=activation,
    )
    return TransformerEncoder(blocks, name=f"{prefix}encoder")(x)


def _encoder_blocks(
    *,
    depth,
    jumbo_multiplier,
    jumbo_mlp_dim,
    drop_path_rate,
    normalization,
    norm_first,
    residual_attention,
    **common,
):
    """The backbone's blocks: `ViTBlock`s for the ViT-style encoder of the
    Jumbo paper (pre-norm LayerNorm, no residual attention), `JumboBlock`s
    with a Jumbo token, else the official `PatchTSTEncoderBlock`s."""
    check_choice("normalization", normalization, {"layer_norm", "batch_norm"})
    check_bool("norm_first", norm_first)
    check_bool("residual_attention", residual_attention)
    vit_style = (
        normalization == "layer_norm" and norm_first and not residual_attention
    )
    rates = drop_path_rates(drop_path_rate, depth)
    if jumbo_multiplier:
        if not vit_style:
            raise ValueError(
                "The Jumbo token runs in ViT blocks: use "
                "normalization='layer_norm', norm_first=True, "
                "residual_attention=False with jumbo_multiplier > 0. "
                f"Received: normalization={normalization!r}, "
                f"norm_first={norm_first}, "
                f"residual_attention={residual_attention}"
            )
        return [
            JumboBlock(
                **common,
                jumbo_multiplier=jumbo_multiplier,
                jumbo_mlp_dim=jumbo_mlp_dim,
                # The Jumbo head reads only the Jumbo tokens: the last
                # block's patch FFN would never be used (as JumboViT's
                # head="jumbo").
                use_patch_mlp=index < depth - 1,
                drop_path_rate=rate,
                name=f"block_{index}",
            )
            for index, rate in enumerate(rates)
        ]
    if vit_style:
        return [
            ViTBlock(**common, drop_path_rate=rate, name=f"block_{index}")
            for index, rate in enumerate(rates)
        ]
    return [
        PatchTSTEncoderBlock(
            **common,
            normalization=normalization,
            norm_first=norm_first,
            residual_attention=residual_attention,
            drop_path_rate=rate,
            name=f"block_{index}",
        )
        for index, rate in enumerate(rates)
    ]


def _series_input(sequence_length, num_channels):
    check_positive_int("sequence_length", sequence_length)
    check_positive_int("num_channels", num_channels)
    return keras.Input((sequence_length, num_channels), name="series")


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PatchTSTClassifier(ConfiguredModel):
    """PatchTST classifier with a CLS token, registers or a Jumbo token.

    The Jumbo paper's time-series setup (§4.3, A.2.2-A.2.3): every channel
    of a `(batch, L, C)` series is patched and run through one shared
    backbone (3 layers, width 128, 16 heads, FFN 256, GELU); each channel
    yields one width-D vector (its CLS token, or the average of the J split
    Jumbo tokens), the C vectors are concatenated and a linear layer gives
    the logits.

    - PatchTST: `num_registers=0, jumbo_multiplier=0` (CLS token).
    - PatchTST+Registers: CLS + R registers; `num_registers="auto"` takes
      R from `registers_matching_jumbo_flops(hidden_dim, N,
      matched_jumbo_multiplier)` (Proposition 1).
    - PatchTST+Jumbo: `jumbo_multiplier=J` (4 in the paper), no CLS token;
      the Jumbo FFN is `J*D -> jumbo_mlp_dim -> J*D`, `jumbo_mlp_dim`
      defaulting to `J * mlp_dim` (the 2x ratio Proposition 1 assumes).

    Blocks are pre-norm LayerNorm ViT blocks (the paper runs the patches
    "as they are in ViTs"), followed by a final LayerNorm;
    `normalization="batch_norm", norm_first=False,
    residual_attention=True` gives the official PatchTST encoder instead
    (then no final norm, as there).

    Args:
        num_classes: int.
        sequence_length: int, L.
        num_channels: int, C.
        num_patches: N equally sized patches, stride half the patch length
            (A.2.2: 8 or 42); or None to use `patch_length`/`stride`.
        patch_length, stride, padding: explicit patching (see
            `PatchEmbedding1D`); give `num_patches=None` with them.
        hidden_dim, num_heads, depth, mlp_dim: the backbone (128, 16, 3,
            256).
        num_registers: int or `"auto"`.
        matched_jumbo_multiplier: J used by `num_registers="auto"`.
        jumbo_multiplier: int, J (0: no Jumbo token).
        jumbo_mlp_dim: hidden width of the Jumbo FFN.
        dropout_rate, attention_dropout_rate, drop_path_rate: floats.
        head_dropout_rate: dropout before the classifier.
        normalization, norm_first, residual_attention: the encoder's
            blocks: the defaults give `ViTBlock`s (`JumboBlock`s with a
            Jumbo token); anything else the official PatchTST's
            `PatchTSTEncoderBlock` (not with a Jumbo token).
        instance_norm: bool, normalise each series (RevIN without affine)
            before patching.
        layer_norm_epsilon: float.
        activation: FFN activation.
        name: model name.

    The model maps `(batch, L, C)` series to logits; `get_config()` is its
    arguments (with `num_registers="auto"` and `jumbo_mlp_dim` resolved).

    Example:
    >>> model = PatchTSTClassifier(4, 96, 3, jumbo_multiplier=4)
    >>> model(np.zeros((2, 96, 3))).shape
    (2, 4)
    """

    input_shape_hint = (
        " Series are (batch, sequence_length, num_channels); build the "
        "model with the data's length and channel count."
    )

    def __init__(
        self,
        num_classes=2,
        sequence_length=128,
        num_channels=1,
        *,
        num_patches=8,
        patch_length=None,
        stride=None,
        padding="end",
        hidden_dim=BACKBONE["hidden_dim"],
        num_heads=BACKBONE["num_heads"],
        depth=BACKBONE["depth"],
        mlp_dim=BACKBONE["mlp_dim"],
        num_registers=0,
        matched_jumbo_multiplier=4,
        jumbo_multiplier=0,
        jumbo_mlp_dim=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        head_dropout_rate=0.0,
        normalization="layer_norm",
        norm_first=True,
        residual_attention=False,
        instance_norm=False,
        layer_norm_epsilon=1e-6,
        activation="gelu",
        name=None,
        **kwargs,
    ):
        config = constructor_arguments(locals())
        check_positive_int("num_classes", num_classes)
        check_rate("head_dropout_rate", head_dropout_rate)
        check_positive_int(
            "jumbo_multiplier", jumbo_multiplier, allow_zero=True
        )
        patching = _patching(
            sequence_length, patch_length, stride, padding, num_patches
        )
        series = _series_input(sequence_length, num_channels)
        patches = count_patches(sequence_length, **patching)
        if num_registers == "auto":
            num_registers = registers_matching_jumbo_flops(
                hidden_dim, patches, matched_jumbo_multiplier
            )
        check_positive_int("num_registers", num_registers, allow_zero=True)
        if jumbo_multiplier and num_registers:
            raise ValueError(
                "A Jumbo model has no registers. Received: "
                f"jumbo_multiplier={jumbo_multiplier}, "
                f"num_registers={num_registers}"
            )
        if jumbo_multiplier and jumbo_mlp_dim is None:
            jumbo_mlp_dim = jumbo_multiplier * mlp_dim
        x = series
        if instance_norm:
            x = RevIN(name="instance_norm")(x)
        x = _backbone(
            x,
            patching,
            num_channels=num_channels,
            hidden_dim=hidden_dim,
            num_heads=num_heads,
            depth=depth,
            mlp_dim=mlp_dim,
            use_class_token=not jumbo_multiplier,
            num_registers=num_registers,
            jumbo_multiplier=jumbo_multiplier,
            jumbo_mlp_dim=jumbo_mlp_dim,
            dropout_rate=dropout_rate,
            attention_dropout_rate=attention_dropout_rate,
            drop_path_rate=drop_path_rate,
            normalization=normalization,
            norm_first=norm_first,
            residual_attention=residual_attention,
            layer_norm_epsilon=layer_norm_epsilon,
            activation=activation,
        )
        if norm_first:
            x = LayerNormalization(
                epsilon=layer_norm_epsilon, name="final_norm"
            )(x)
        if jumbo_multiplier:
            x = TokenPooling("jumbo_avg", jumbo_multiplier, name="pooling")(x)
        else:
            x = TokenPooling("token", 1 + num_registers, name="pooling")(x)
        x = FoldChannels(num_channels, inverse=True, name="unfold_channels")(x)
        x = keras.layers.Flatten(name="concat_channels")(x)
        if head_dropout_rate:
            x = Dropout(head_dropout_rate, name="head_dropout")(x)
        logits = keras.layers.Dense(
            num_classes, kernel_initializer="zeros", name="head"
        )(x)
        if name is None:
            name = "patchtst"
            if jumbo_multiplier:
                name = "patchtst_jumbo"
            elif num_registers:
                name = "patchtst_registers"
        config["num_registers"] = num_registers
        config["jumbo_mlp_dim"] = jumbo_mlp_dim
        self._finish(series, logits, config, name, kwargs)


def _forecast_head(tokens, horizon, num_channels, head_dropout_rate, prefix):
    """Flatten head: `(batch*C, N, D)` -> `(batch, T, C)` (normalised)."""
    x = keras.layers.Flatten(name=f"{prefix}flatten")(tokens)
    x = keras.layers.Dense(horizon, name=f"{prefix}head")(x)
    if head_dropout_rate:
        x = Dropout(head_dropout_rate, name=f"{prefix}head_dropout")(x)
    x = FoldChannels(num_channels, inverse=True, name=f"{prefix}unfold")(x)
    return keras.layers.Permute((2, 1), name=f"{prefix}to_time_major")(x)


SCALES = {"small": 0.5, "medium": 1.0, "large": 2.0}


def resolve_scales(scales, patch_length, stride):
    """Scale names or explicit pairs -> `[(patch_length, stride), ...]`.

    MS-PatchTST Table I: small = (P/2, S/2), medium = (P, S), large =
    (2P, 2S), around the base (P, S) = (16, 8).
    """
    if isinstance(scales, str):
        scales = (scales,)
    if not isinstance(scales, (list, tuple)) or not scales:
        raise ValueError(
            "`scales` must be a non-empty list of scale names "
            f"({sorted(SCALES)}) or (patch_length, stride) pairs. "
            f"Received: scales={scales!r}"
        )
    resolved = []
    for scale in scales:
        if isinstance(scale, str):
            if scale not in SCALES:
                raise ValueError(
                    f"Unknown scale. Expected one of {sorted(SCALES)} or a "
                    f"(patch_length, stride) pair. Received: scale={scale!r}"
                )
            factor = SCALES[scale]
            pair = (
                max(1, int(patch_length * factor)),
                max(1, int(stride * factor)),
            )
        elif isinstance(scale, (list, tuple)) and len(scale) == 2:
            pair = (
                check_positive_int("patch_length", scale[0]),
                check_positive_int("stride", scale[1]),
            )
        else:
            raise ValueError(
                "Each scale is a name or a (patch_length, stride) pair. "
                f"Received: scale={scale!r}"
            )
        if pair in resolved:
            raise ValueError(f"Scales must differ. Received: scales={scales!r}")
        resolved.append(pair)
    return resolved


@keras.saving.register_keras_serializable(package="keras_jumbo")
class MSPatchTST(ConfiguredModel):
    """MS-PatchTST: k PatchTST backbones at different patch lengths, fused.

    The series is normalised once (RevIN statistics are the same for every
    scale), each of the k backbones patches it at its own (P_j, S_j) and
    forecasts it, each forecast is de-normalised, and
    `MultiScalePatchFusion` combines them (MS-PatchTST §III-B).

    Args:
        sequence_length: L (336 in the paper).
        horizon: T (96).
        num_channels: C.
        patch_length, stride: the base scale (16, 8; Table I).
        padding: patch end padding of every backbone.
        scales: names among `"small"`, `"medium"`, `"large"` (P/2, P, 2P,
            strides alike) or explicit `(patch_length, stride)` pairs.
            Default `("small", "large")`, the paper's best configuration
            (Table II, used for its Table III).
        fusion: `"per_step"` (the paper's k -> 1 map, default),
            `"per_horizon_step"` (k weights and a bias per forecast step) or
            `"flatten"` (its code's k·T -> T map); see
            `MultiScalePatchFusion`. The default was measured against the
            other two (`docs/fusion_results.md`, 3 seeds on two sets): as
            good as `"per_horizon_step"`, far better than `"flatten"`.
        head_dropout_rate: dropout after each head.
        revin: bool, reversible instance normalisation (once, shared).
        revin_affine, subtract_last: RevIN options.
        hidden_dim, num_heads, depth, mlp_dim, dropout_rate,
        attention_dropout_rate, drop_path_rate, normalization,
        norm_first, residual_attention, layer_norm_epsilon, activation:
            every backbone's encoder; defaults are the official PatchTST's
            (width 128, 16 heads, 3 layers, FFN 256, dropout 0.2,
            BatchNorm, post-norm, residual attention scores).
        name: model name.

    The model maps `(batch, L, C)` to `(batch, T, C)`.

    Example:
    >>> model = MSPatchTST(96, 24, 3, scales=("small", "medium", "large"),
    ...                    hidden_dim=16, num_heads=2)
    >>> model(np.zeros((2, 96, 3))).shape
    (2, 24, 3)
    """

    input_shape_hint = (
        " Series are (batch, sequence_length, num_channels); build the "
        "model with the data's length and channel count."
    )

    _default_name = "ms_patchtst"

    def __init__(
        self,
        sequence_length=336,
        horizon=96,
        num_channels=7,
        *,
        patch_length=16,
        stride=8,
        padding="end",
        scales=("small", "large"),
        fusion="per_step",
        head_dropout_rate=0.0,
        revin=True,
        revin_affine=False,
        subtract_last=False,
        hidden_dim=BACKBONE["hidden_dim"],
        num_heads=BACKBONE["num_heads"],
        depth=BACKBONE["depth"],
        mlp_dim=BACKBONE["mlp_dim"],
        dropout_rate=0.2,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        normalization="batch_norm",
        norm_first=False,
        residual_attention=True,
        layer_norm_epsilon=1e-5,
        activation="gelu",
        name=None,
        **kwargs,
    ):
        config = constructor_arguments(locals())
        check_positive_int("horizon", horizon)
        check_rate("head_dropout_rate", head_dropout_rate)
        check_choice("fusion", fusion, set(FUSION_MODES))
        check_positive_int("patch_length", patch_length)
        check_positive_int("stride", stride)
        options = {
            key: config[key]
            for key in (
                "hidden_dim",
                "num_heads",
                "depth",
                "mlp_dim",
                "dropout_rate",
                "attention_dropout_rate",
                "drop_path_rate",
                "normalization",
                "norm_first",
                "residual_attention",
                "layer_norm_epsilon",
                "activation",
            )
        }
        pairs = resolve_scales(scales, patch_length, stride)
        for p, s in pairs:
            count_patches(sequence_length, p, s, padding)
        series = _series_input(sequence_length, num_channels)
        normaliser = None
        x = series
        if revin:
            normaliser = RevIN(
                affine=revin_affine, subtract_last=subtract_last, name="revin"
            )
            x = normaliser(series)
        forecasts = []
        for index, (p, s) in enumerate(pairs):
            prefix = "" if len(pairs) == 1 else f"scale_{index}_"
            tokens = _backbone(
                x,
                {"patch_length": p, "stride": s, "padding": padding},
                num_channels=num_channels,
                prefix=prefix,
                **options,
            )
            forecast = _forecast_head(
                tokens, horizon, num_channels, head_dropout_rate, prefix
            )
            if normaliser is not None:
                forecast = normaliser(forecast, reference=series)
            forecasts.append(forecast)
        if len(forecasts) == 1:
            outputs = forecasts[0]
        else:
            outputs = MultiScalePatchFusion(fusion, name="fusion")(forecasts)
        self._finish(
            series, outputs, config, name or self._default_name, kwargs
        )


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PatchTSTForecaster(MSPatchTST):
    """PatchTST long-horizon forecaster (Nie et al., ICLR 2023).

    RevIN -> per-channel patching (P=16, S=8, end padding) -> shared
    encoder -> flatten head (N·D -> T per channel) -> RevIN inverse.
    Defaults are the official PatchTST's (its Weather/ETT scripts): width
    128, 16 heads, 3 layers, FFN 256, dropout 0.2, and its encoder
    (BatchNorm, post-norm, residual attention scores, which its paper does
    not mention); pass `normalization="layer_norm", norm_first=True,
    residual_attention=False` for ViT blocks.

    Args:
        sequence_length: look-back L.
        horizon: forecast length T.
        num_channels: C.
        patch_length, stride, padding: patching.
        head_dropout_rate: dropout after the head.
        revin: bool, reversible instance normalisation.
        revin_affine, subtract_last: RevIN options.
        hidden_dim, num_heads, depth, mlp_dim, dropout_rate,
        attention_dropout_rate, drop_path_rate, normalization,
        norm_first, residual_attention, layer_norm_epsilon, activation:
            the encoder (official PatchTST defaults).
        name: model name.

    The model maps `(batch, L, C)` to `(batch, T, C)`. It is `MSPatchTST`
    with the one scale `"medium"` (`scales` is fixed).

    Example:
    >>> model = PatchTSTForecaster(96, 24, 3, hidden_dim=16, num_heads=2)
    >>> model(np.zeros((2, 96, 3))).shape
    (2, 24, 3)
    """

    _default_name = "patchtst_forecaster"

    def __init__(
        self,
        sequence_length=336,
        horizon=96,
        num_channels=7,
        *,
        scales=("medium",),
        **kwargs,
    ):
        if tuple(scales) != ("medium",):
            raise ValueError(
                "PatchTSTForecaster has the one scale 'medium' (use "
                f"MSPatchTST for several). Received: scales={scales!r}"
            )
        super().__init__(
            sequence_length, horizon, num_channels, scales=scales, **kwargs
        )
