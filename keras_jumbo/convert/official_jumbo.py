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

from keras_jumbo.layers import JumboToken
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.models.vision_transformer import JumboViT
from keras_jumbo.models.vision_transformer import TokenPooling

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


def _read_state_dict(state_dict):
    if isinstance(state_dict, (str, os.PathLike)):
        try:
            import torch
        except ImportError as error:
            raise ImportError(
                "Reading a .pth checkpoint needs PyTorch: "
                "`pip install torch==2.13.0` (or pass a dict of arrays)."
            ) from error
        state_dict = torch.load(
            os.fspath(state_dict), map_location="cpu", weights_only=True
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


def _find(model, kind):
    found = [layer for layer in model.layers if isinstance(layer, kind)]
    if len(found) != 1:
        raise ValueError(
            f"Expected one {kind.__name__} layer in the model. Received: "
            f"model with {len(found)}"
        )
    return found[0]


def load_official_jumbo(model, state_dict):
    """Copy an official Jumbo state dict into `model`, exactly.

    Args:
        model: a `JumboViT` built with `head="official"` and
            `share_jumbo_mlp=True` (e.g. `official_jumbo_model(size, ...)`)
            with the checkpoint's sizes; LayerNorm epsilon must be 1e-5 to
            reproduce the official outputs.
        state_dict: mapping name -> array (numpy or torch tensors), or the
            path to a `.pth` file (read with torch when installed).

    Returns:
        `model`, with its weights set.

    Raises:
        ValueError: the model's structure or a tensor's shape does not
            match the checkpoint (the message names the key), or keys are
            missing/unexpected.
    """
    sd = _read_state_dict(state_dict)
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

    pooling = _find(model, TokenPooling)
    encoder = _find(model, TransformerEncoder)
    if pooling.mode != "official" or encoder.shared_jumbo_mlp is None:
        raise ValueError(
            "The official checkpoint needs JumboViT(head='official', "
            "share_jumbo_mlp=True). Received: head="
            f"{pooling.mode!r}, share_jumbo_mlp={encoder.share_jumbo_mlp}"
        )
    if encoder.layer_scale_init_value is not None:
        raise ValueError(
            "The official Jumbo blocks have no LayerScale. Received: "
            f"layer_scale_init_value={encoder.layer_scale_init_value}"
        )

    patch = _find(model, PatchEmbedding)
    weight = take("patch_embed.proj.weight")  # (D, C, ph, pw)
    assign(
        patch.projection.kernel,
        weight.transpose(2, 3, 1, 0),
        "patch_embed.proj.weight",
    )
    assign(
        patch.projection.bias,
        take("patch_embed.proj.bias"),
        "patch_embed.proj.bias",
    )
    position = _find(model, PositionEmbedding)
    pos = take("pos_embed")[0]
    assign(
        position.embeddings,
        pos.reshape(*position.grid_size, -1),
        "pos_embed",
    )
    jumbo = _find(model, JumboToken)
    assign(jumbo.tokens, take("jumbo_token").reshape(-1), "jumbo_token")

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
    norm(model.get_layer("final_norm"), "norm")
    linear(model.get_layer("head"), "head")

    unexpected = sorted(set(sd) - used)
    if unexpected:
        raise ValueError(
            "Unexpected keys in state_dict (the model has no place for "
            f"them; check depth and sizes): {unexpected[:8]}"
        )
    return model
