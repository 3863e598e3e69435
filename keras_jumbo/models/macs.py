"""One multiply-accumulate (MAC) counter for every keras_jumbo model.

What is counted (one example, batch 1): every matrix product and
convolution of the forward pass at inference --

- linear maps (`Dense`, `EinsumDense`, the q/k/v/output projections, both
  FFN layers, the Jumbo FFN, LoRA adapters, the classifier head),
- convolutions (patch projections, stems): `out_positions * k * C_in *
  C_out / groups`,
- attention products: `QKᵀ` (`heads * T_q * T_k * d_k`) and `AV`
  (`heads * T_q * T_k * d_v`).

Not counted: normalisation, softmax, activations, residual additions,
biases, position embeddings, pooling, token concatenation. These are the
conventions of fvcore / timm's profilers and of the ViT-ResNAS reference
(which reports "MACs"); FLOPs in the vision literature usually mean these
MACs. Each layer is counted at the token count it really sees in the
model's graph (e.g. after token dropping at inference: all tokens).

A model's layers are walked through its functional graph; each layer type
has a rule `(layer, input_shapes, output_shape) -> MACs` evaluated at
batch 1. Layers that move a data axis into the batch (`FoldChannels`:
channel independence, C series per example) scale the MACs of every layer
after them by C, until the matching unfold. Composite
keras_jumbo layers (`ViTBlock`, `JumboBlock`, `ParallelBranchBlock`, ...) have
rules that follow their own computation. A layer with weights but no rule
raises, rather than being silently counted as free; register one with
`register_mac_rule`.
"""

import math

import keras

from keras_jumbo._keras_internals import graph_nodes
from keras_jumbo._keras_internals import is_functional
from keras_jumbo.layers import MLP
from keras_jumbo.layers import BlockwiseMHSA
from keras_jumbo.layers import FoldChannels
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import LayerScale
from keras_jumbo.layers import MaskedLayerNorm
from keras_jumbo.layers import MultiHeadSelfAttention
from keras_jumbo.layers import MultiScalePatchFusion
from keras_jumbo.layers import ParallelBranchBlock
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PatchEmbedding1D
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import PrefixTokens
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers import RevIN
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers import ViTBlock

_RULES = {}

# Layers with weights that do no multiply-accumulate work (elementwise).
_FREE_WITH_WEIGHTS = (
    keras.layers.LayerNormalization,
    keras.layers.BatchNormalization,
    keras.layers.GroupNormalization,
    keras.layers.Embedding,
    MaskedLayerNorm,
    PositionEmbedding,
    PrefixTokens,
    LayerScale,
    RevIN,
)


def register_mac_rule(layer_cls, rule=None):
    """Register `rule(layer, input_shapes, output_shape) -> int`.

    `input_shapes` is a list of shape tuples (batch axis set to 1),
    `output_shape` the first output's shape. Usable as a decorator:
    `@register_mac_rule(MyLayer)`.
    """
    if rule is None:
        return lambda fn: register_mac_rule(layer_cls, fn)
    _RULES[layer_cls] = rule
    return rule


def _tokens(shape):
    """Number of vectors a last-axis linear map is applied to."""
    return math.prod(shape[:-1])


def dense_macs(tokens, fan_in, fan_out):
    return tokens * fan_in * fan_out


def attention_macs(q_len, k_len, heads, key_dim, value_dim):
    """QKᵀ and AV of one attention."""
    return heads * q_len * k_len * (key_dim + value_dim)


def _shape(shape):
    """Concrete shape with the batch axis set to 1."""
    dims = tuple(shape)
    if not dims:
        return dims
    rest = dims[1:]
    if any(d is None for d in rest):
        raise ValueError(
            "count_macs needs static shapes (apart from the batch axis). "
            f"Received: shape={dims}"
        )
    return (1, *rest)


def _rule_for(layer):
    for cls in type(layer).__mro__:
        if cls in _RULES:
            return _RULES[cls]
    return None


def layer_macs(layer, input_shapes, output_shape=None):
    """MACs of one call of `layer` on inputs of `input_shapes`."""
    if not isinstance(input_shapes, list):
        input_shapes = [input_shapes]
    input_shapes = [_shape(s) for s in input_shapes]
    if output_shape is None:
        output_shape = layer.compute_output_shape(
            input_shapes[0] if len(input_shapes) == 1 else input_shapes
        )
    output_shape = _shape(output_shape)
    if isinstance(layer, keras.Model) and is_functional(layer):
        return count_macs(layer)
    rule = _rule_for(layer)
    if rule is not None:
        return int(rule(layer, input_shapes, output_shape))
    if isinstance(layer, _FREE_WITH_WEIGHTS) or not layer.weights:
        return 0
    raise TypeError(
        f"count_macs has no rule for layer '{layer.name}' of type "
        f"{type(layer).__name__}, which has weights. Register one with "
        "keras_jumbo.models.register_mac_rule. Received: "
        f"layer={type(layer).__name__}"
    )


def mac_report(model):
    """`[(layer_name, layer_type, macs), ...]` in graph order (batch 1)."""
    if not isinstance(model, keras.Model) or not is_functional(model):
        raise TypeError(
            "count_macs takes a functional keras.Model (every keras_jumbo "
            f"builder returns one). Received: model={type(model).__name__}"
        )
    rows = []
    # Examples per model example that each tensor's batch axis holds.
    factors = {}
    for node in graph_nodes(model):
        layer = node.operation
        factor = max(
            (factors.get(id(t), 1) for t in node.input_tensors),
            default=1,
        )
        if isinstance(layer, FoldChannels):
            if layer.inverse:
                factor //= layer.num_channels
            else:
                factor *= layer.num_channels
        for tensor in node.output_tensors:
            factors[id(tensor)] = factor
        if not isinstance(layer, keras.layers.Layer):
            continue
        inputs = [t.shape for t in node.input_tensors]
        if not inputs:
            continue
        outputs = [t.shape for t in node.output_tensors]
        macs = layer_macs(layer, inputs, outputs[0])
        if not isinstance(layer, FoldChannels):
            macs *= max(
                (factors.get(id(t), 1) for t in node.input_tensors),
                default=1,
            )
        rows.append((layer.name, type(layer).__name__, macs))
    return rows


def count_macs(model):
    """Multiply-accumulates of one example through `model` (batch 1).

    Args:
        model: a functional `keras.Model` with static input shapes (all
            keras_jumbo builders return one), nested models included.

    Returns:
        int, the MACs (see the module docstring for what is counted;
        FLOPs are usually quoted as these MACs in vision papers, or as
        2 * MACs).

    Example:
    >>> from keras_jumbo.models import ViT
    >>> count_macs(ViT("tiny", head="avg", use_class_token=False))
    1246563840
    """
    return sum(macs for _, _, macs in mac_report(model))


# --- stock Keras layers ------------------------------------------------
@register_mac_rule(keras.layers.Dense)
def _dense_rule(layer, input_shapes, output_shape):
    return dense_macs(
        _tokens(input_shapes[0]), input_shapes[0][-1], layer.units
    )


@register_mac_rule(keras.layers.EinsumDense)
def _einsum_dense_rule(layer, input_shapes, output_shape):
    # Every output element sums over the contracted kernel axes.
    kernel = tuple(layer.kernel.shape)
    equation = layer.equation.replace(" ", "")
    inputs, out = equation.split("->")
    _, kernel_axes = inputs.split(",")
    contracted = math.prod(
        size
        for axis, size in zip(kernel_axes, kernel, strict=True)
        if axis not in out
    )
    return math.prod(output_shape) * contracted


def _conv_rule(layer, input_shapes, output_shape):
    kernel = tuple(layer.kernel.shape)  # (*k, C_in / groups, C_out)
    positions = math.prod(output_shape[1:-1])
    if layer.data_format == "channels_first":
        positions = math.prod(output_shape[2:])
    return positions * math.prod(kernel)


for _conv in (
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.DepthwiseConv2D,
):
    register_mac_rule(_conv, _conv_rule)


@register_mac_rule(keras.layers.MultiHeadAttention)
def _mha_rule(layer, input_shapes, output_shape):
    query = input_shapes[0]
    value = input_shapes[1] if len(input_shapes) > 1 else query
    key = input_shapes[2] if len(input_shapes) > 2 else value
    heads, key_dim = layer.num_heads, layer.key_dim
    value_dim = layer.value_dim or key_dim
    q_len, k_len = _tokens(query), _tokens(key)
    return (
        dense_macs(q_len, query[-1], heads * key_dim)
        + dense_macs(k_len, key[-1], heads * key_dim)
        + dense_macs(_tokens(value), value[-1], heads * value_dim)
        + attention_macs(q_len, k_len, heads, key_dim, value_dim)
        + dense_macs(q_len, heads * value_dim, output_shape[-1])
    )


# --- keras_jumbo layers ------------------------------------------------
@register_mac_rule(PatchEmbedding)
def _patch_embedding_rule(layer, input_shapes, output_shape):
    return _conv_rule(layer.projection, input_shapes, output_shape)


@register_mac_rule(PatchEmbedding1D)
def _patch_embedding_1d_rule(layer, input_shapes, output_shape):
    # (1, C, N, D): C * N patches of length P projected to D.
    _, channels, patches, dim = output_shape
    return channels * patches * layer.patch_length * dim


@register_mac_rule(MultiScalePatchFusion)
def _fusion_rule(layer, input_shapes, output_shape):
    _, horizon, channels = output_shape
    k = len(input_shapes)
    if layer.mode == "per_step":
        return horizon * channels * k
    return channels * k * horizon * horizon


@register_mac_rule(MLP)
def _mlp_rule(layer, input_shapes, output_shape):
    shape = input_shapes[0]
    out = layer.output_dim or shape[-1]
    return _tokens(shape) * layer.hidden_dim * (shape[-1] + out)


@register_mac_rule(MultiHeadSelfAttention)
def _self_attention_rule(layer, input_shapes, output_shape):
    shape = input_shapes[0]
    length, dim = shape[1], shape[-1]
    heads, key_dim, head_dim = layer.num_heads, layer.key_dim, layer.head_dim
    return (
        dense_macs(length, dim, heads * (2 * key_dim + head_dim))
        + attention_macs(length, length, heads, key_dim, head_dim)
        + dense_macs(length, heads * head_dim, dim)
    )


@register_mac_rule(ViTBlock)
@register_mac_rule(PatchTSTEncoderBlock)
def _vit_block_rule(layer, input_shapes, output_shape):
    # MaskedViTBlock too (a ViTBlock): the full-size block, masks aside.
    shape = input_shapes[0]
    return _self_attention_rule(layer.attention, [shape], shape) + _mlp_rule(
        layer.mlp, [shape], shape
    )


@register_mac_rule(JumboBlock)
def _jumbo_block_rule(layer, input_shapes, output_shape, shared=None):
    shape = input_shapes[0]
    batch, length, dim = shape
    macs = _self_attention_rule(layer.attention, [shape], shape)
    num_jumbo = layer.jumbo_multiplier
    if layer.use_patch_mlp:
        patches = (batch, length - num_jumbo, dim)
        macs += _mlp_rule(layer.mlp, [patches], patches)
    if layer.use_jumbo_mlp:
        jumbo = (batch, num_jumbo * dim)
        mlp = shared if layer.share_jumbo_mlp else layer.jumbo_mlp
        if mlp is None:
            raise ValueError(
                f"Block '{layer.name}' shares its Jumbo FFN; count it through "
                "its TransformerEncoder. Received: shared FFN=None"
            )
        macs += _mlp_rule(mlp, [jumbo], jumbo)
        if layer.jumbo_lora_rank is not None:
            macs += 2 * dense_macs(1, num_jumbo * dim, layer.jumbo_lora_rank)
    return macs


@register_mac_rule(TransformerEncoder)
def _encoder_rule(layer, input_shapes, output_shape):
    return sum(
        _jumbo_block_rule(
            block, input_shapes, output_shape, shared=layer.shared_jumbo_mlp
        )
        if isinstance(block, JumboBlock)
        else _vit_block_rule(block, input_shapes, output_shape)
        for block in layer.blocks
    )


@register_mac_rule(BlockwiseMHSA)
def _blockwise_rule(layer, input_shapes, output_shape):
    shape = input_shapes[0]
    length, dim = shape[1], shape[-1]
    heads = layer.num_heads
    key_dim = layer.query_kernel.shape[-1]
    value_dim = layer.value_kernel.shape[-1]
    per_branch = (
        dense_macs(length, dim, heads * (2 * key_dim + value_dim))
        + attention_macs(length, length, heads, key_dim, value_dim)
        + dense_macs(length, heads * value_dim, dim)
    )
    return layer.num_branches * per_branch


@register_mac_rule(ParallelBranchBlock)
def _parallel_block_rule(layer, input_shapes, output_shape):
    shape = input_shapes[0]
    ffn = 2 * dense_macs(shape[1], shape[-1], layer.mlp_dim)
    return (
        _blockwise_rule(layer.attention, input_shapes, output_shape)
        + layer.num_branches * ffn
    )


@register_mac_rule(ResidualSpatialReduction)
def _reduction_rule(layer, input_shapes, output_shape):
    # The 3x3 stride-2 convolution over the patch grid and the Linear on
    # each prefix token (ViT-ResNAS reference `compute_sr_block`); pooling
    # and zero padding are free.
    _, length, dim = output_shape
    patches = length - layer.num_prefix_tokens
    conv = patches * 9 * layer.input_dim * dim
    return conv + dense_macs(layer.num_prefix_tokens, layer.input_dim, dim)
