"""Load the official PyTorch Jumbo release into a keras_jumbo `JumboViT`.

Official code and weights: github.com/antofuller/jumbo (MIT). Its model is
`JumboViT(size, head="official", share_jumbo_mlp=True,
layer_norm_epsilon=1e-5)` here: one Jumbo FFN shared by all blocks, a
LayerNorm of width J*D per block before it, no LayerScale, exact GELU,
position embeddings on patches only, PyTorch's LayerNorm epsilon 1e-5, and
a head reading the flattened Jumbo token concatenated with the mean patch
token after a final LayerNorm of width D. The checkpoint's `cls_token` is
never used by the official forward pass and is ignored.
"""

import os

import numpy as np

from keras_jumbo.models.base import check_not_quantized
from keras_jumbo.models.vision_transformer import JumboViT
from keras_jumbo.models.vit_sizes import VIT_SIZES

OFFICIAL_LAYER_NORM_EPSILON = 1e-5
IGNORED_KEYS = ("cls_token",)


def official_jumbo_model(
    size="pico", *, num_classes=1000, image_size=224, **kwargs
):
    """A `JumboViT` configured like the official release (see module doc)."""
    return JumboViT(
        size,
        num_classes=num_classes,
        image_size=image_size,
        head="official",
        share_jumbo_mlp=True,
        layer_norm_epsilon=OFFICIAL_LAYER_NORM_EPSILON,
        **kwargs,
    )


def read_state_dict(state_dict):
    """A checkpoint (path or mapping) as `{name: float32 numpy array}`."""
    if isinstance(state_dict, (str, os.PathLike)):
        try:
            import torch
        except ImportError as error:
            raise ImportError(
                "Reading a .pth checkpoint needs PyTorch: "
                "`pip install torch==2.13.0` (or pass a dict of arrays)."
            ) from error
        path = os.fspath(state_dict)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"No checkpoint file at state_dict={path!r}"
            )
        try:
            state_dict = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise ValueError(
                f"Could not read the checkpoint {path!r}: the file is "
                "corrupt, truncated or not a PyTorch state dict "
                f"({type(error).__name__}: {str(error)[:200]})"
            ) from error
        if not isinstance(state_dict, dict):
            raise ValueError(
                f"The checkpoint {path!r} holds a "
                f"{type(state_dict).__name__}, not a state dict"
            )
        if "model" in state_dict and isinstance(state_dict["model"], dict):
            state_dict = state_dict["model"]
    if not hasattr(state_dict, "items"):
        raise TypeError(
            "`state_dict` must be a mapping name -> array or a path to a "
            f".pth file. Received: {type(state_dict).__name__}"
        )
    arrays = {}
    for key, value in state_dict.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        key = key.removeprefix("module.").removeprefix("_orig_mod.")
        arrays[key] = np.asarray(value, dtype=np.float32)
    return arrays


def load_official_jumbo(model, state_dict, *, skip_head=False):
    """Copy an official Jumbo state dict into `model`, exactly.

    Args:
        model: a `JumboViT` built with `head="official"` and
            `share_jumbo_mlp=True` (e.g. `official_jumbo_model(size, ...)`)
            with the checkpoint's sizes; LayerNorm epsilon must be 1e-5 to
            reproduce the official outputs.
        state_dict: mapping name -> array (numpy or torch tensors), or the
            path to a `.pth` file (read with torch when installed).
        skip_head: bool; with `include_top=False` models, leave the
            checkpoint's head out instead of raising.

    Returns:
        `model`, with its weights set.

    Raises:
        TypeError: `model` is not a `JumboViT`.
        ValueError: the model's structure or a tensor's shape does not
            match the checkpoint (the message names the key), or keys are
            missing/unexpected.
    """
    sd = read_state_dict(state_dict)
    used = set(IGNORED_KEYS) & set(sd)

    def take(key, shape=None):
        if key not in sd:
            raise ValueError(f"Missing key in state_dict: {key!r}")
        used.add(key)
        value = sd[key]
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise ValueError(
                f"Shape mismatch for {key!r}: the model expects "
                f"{tuple(shape)}. Received: {tuple(value.shape)}"
            )
        return value

    def assign(variable, value, key):
        if tuple(variable.shape) != tuple(value.shape):
            raise ValueError(
                f"Shape mismatch for {key!r}: the model expects "
                f"{tuple(variable.shape)}. Received: {tuple(value.shape)}"
            )
        variable.assign(value)

    def linear(dense, prefix):
        assign(dense.kernel, take(prefix + ".weight").T, prefix + ".weight")
        assign(dense.bias, take(prefix + ".bias"), prefix + ".bias")

    def norm(layer, prefix):
        assign(layer.gamma, take(prefix + ".weight"), prefix + ".weight")
        assign(layer.beta, take(prefix + ".bias"), prefix + ".bias")

    if not isinstance(model, JumboViT):
        raise TypeError(
            "`model` must be a JumboViT built like the official release "
            "(`official_jumbo_model(size, ...)`). Received: "
            f"{type(model).__name__}"
        )
    check_not_quantized(model, "load_official_jumbo")
    if model.head != "official" or not model.share_jumbo_mlp:
        raise ValueError(
            "The official checkpoint needs JumboViT(head='official', "
            f"share_jumbo_mlp=True). Received: head={model.head!r}, "
            f"share_jumbo_mlp={model.share_jumbo_mlp}"
        )
    if model.layer_scale_init_value is not None:
        raise ValueError(
            "The official Jumbo blocks have no LayerScale. Received: "
            f"layer_scale_init_value={model.layer_scale_init_value}"
        )

    # Checkpoint shapes first, as stored (before any reshape), so an error
    # names the checkpoint's own shape.
    dim = model.hidden_dim
    rows, cols = model.grid_size
    pos = take("pos_embed", (1, rows * cols, dim))
    jumbo = take("jumbo_token", (1, model.jumbo_multiplier, dim))

    weight = take("patch_embed.proj.weight")  # (D, C, ph, pw)
    projection = model.patch_embedding.projection
    assign(
        projection.kernel,
        weight.transpose(2, 3, 1, 0),
        "patch_embed.proj.weight",
    )
    assign(
        projection.bias, take("patch_embed.proj.bias"), "patch_embed.proj.bias"
    )
    assign(
        model.position_embedding.embeddings,
        pos[0].reshape(rows, cols, dim),
        "pos_embed",
    )
    assign(model.jumbo_token.tokens, jumbo.reshape(-1), "jumbo_token")

    encoder = model.encoder
    for index, block in enumerate(encoder.blocks):
        prefix = f"blocks.{index}."
        norm(block.norm1, prefix + "norm1")
        linear(block.attention.qkv, prefix + "attn.qkv")
        linear(block.attention.proj, prefix + "attn.proj")
        norm(block.norm2, prefix + "norm2")
        linear(block.mlp.fc1, prefix + "mlp.fc1")
        linear(block.mlp.fc2, prefix + "mlp.fc2")
        norm(block.norm3, prefix + "norm3")
    linear(encoder.shared_jumbo_mlp.fc1, "jumbo_mlp.fc1")
    linear(encoder.shared_jumbo_mlp.fc2, "jumbo_mlp.fc2")
    norm(model.final_norm, "norm")
    if model.classifier is not None:
        linear(model.classifier, "head")
    elif not skip_head:
        raise ValueError(
            "The model has no head (include_top=False) but the checkpoint "
            "has one; pass skip_head=True to leave it out."
        )
    else:
        used.update(key for key in ("head.weight", "head.bias") if key in sd)

    unexpected = sorted(set(sd) - used)
    if unexpected:
        raise ValueError(
            "Unexpected keys in state_dict (the model has no place for "
            f"them; check depth and sizes): {unexpected[:8]}"
        )
    return model


def official_config(state_dict):
    """The `official_jumbo_model` arguments a checkpoint was trained with.

    Read from the tensor shapes: width from the patch projection (the size
    of that width in `VIT_SIZES`), J from `jumbo_token`, classes from
    `head.weight`, image size from `pos_embed` (square grid, patch 16 as
    every official size). Returns `{"size", "num_classes", "image_size"}`.
    """
    sd = read_state_dict(state_dict)
    missing = [
        key
        for key in ("patch_embed.proj.weight", "pos_embed", "jumbo_token")
        if key not in sd
    ]
    if missing:
        raise ValueError(
            "Not an official Jumbo checkpoint: missing keys "
            f"{missing}. Received keys: {sorted(sd)[:8]}"
        )
    dim, _, patch, _ = sd["patch_embed.proj.weight"].shape
    sizes = [
        name for name, spec in VIT_SIZES.items() if spec["hidden_dim"] == dim
    ]
    if not sizes:
        raise ValueError(
            "The checkpoint's width matches no Jumbo size "
            f"({ {k: v['hidden_dim'] for k, v in VIT_SIZES.items()} }). "
            f"Received: width {dim}"
        )
    num_tokens = sd["pos_embed"].shape[1]
    side = int(round(num_tokens**0.5))
    if side * side != num_tokens:
        raise ValueError(
            "The checkpoint's position embedding is not a square grid. "
            f"Received: pos_embed of shape {tuple(sd['pos_embed'].shape)}"
        )
    config = {"size": sizes[0], "image_size": side * patch}
    if "head.weight" in sd:
        config["num_classes"] = int(sd["head.weight"].shape[0])
    return config
