"""Keras layers of keras_jumbo (one public layer per module)."""

from keras_jumbo.layers.attention import MultiHeadSelfAttention
from keras_jumbo.layers.batch_norm import BatchNormalization
from keras_jumbo.layers.blockwise_mhsa import BlockwiseMHSA
from keras_jumbo.layers.channel_mask import ApplyChannelMask
from keras_jumbo.layers.channel_mask import ChannelMask
from keras_jumbo.layers.class_token import ClassToken
from keras_jumbo.layers.closed_form import closed_form_layer_norm
from keras_jumbo.layers.conv2d import Conv2D
from keras_jumbo.layers.dropout import Dropout
from keras_jumbo.layers.fold_channels import FoldChannels
from keras_jumbo.layers.imagenet_preprocessing import ImageNetPreprocessing
from keras_jumbo.layers.jumbo_block import JumboBlock
from keras_jumbo.layers.jumbo_token import JumboToken
from keras_jumbo.layers.jumbo_token import jumbo_merge
from keras_jumbo.layers.jumbo_token import jumbo_split
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.layers.layer_scale import LayerScale
from keras_jumbo.layers.masked_layer_norm import MaskedLayerNorm
from keras_jumbo.layers.masked_vit_block import MaskedViTBlock
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.multi_scale_patch_fusion import MultiScalePatchFusion
from keras_jumbo.layers.parallel_branch_block import ParallelBranchBlock
from keras_jumbo.layers.patch_embedding import PatchEmbedding
from keras_jumbo.layers.patch_embedding_1d import PatchEmbedding1D
from keras_jumbo.layers.patch_embedding_1d import num_patches
from keras_jumbo.layers.patch_embedding_1d import patching_for_num_patches
from keras_jumbo.layers.patchtst_encoder_block import PatchTSTEncoderBlock
from keras_jumbo.layers.position_embedding import PositionEmbedding
from keras_jumbo.layers.prefix_tokens import PrefixTokens
from keras_jumbo.layers.progressive_join import ProgressiveJoin
from keras_jumbo.layers.registers import Registers
from keras_jumbo.layers.residual_spatial_reduction import (
    ResidualSpatialReduction,
)
from keras_jumbo.layers.revin import RevIN
from keras_jumbo.layers.stochastic_depth import StochasticDepth
from keras_jumbo.layers.token_dropping import TokenDropping
from keras_jumbo.layers.token_pooling import TokenPooling
from keras_jumbo.layers.transformer_encoder import TransformerEncoder
from keras_jumbo.layers.vit_block import ViTBlock

__all__ = [
    "ApplyChannelMask",
    "BatchNormalization",
    "ChannelMask",
    "BlockwiseMHSA",
    "ParallelBranchBlock",
    "ProgressiveJoin",
    "ClassToken",
    "Conv2D",
    "Dropout",
    "FoldChannels",
    "ImageNetPreprocessing",
    "MultiScalePatchFusion",
    "PatchEmbedding1D",
    "PatchTSTEncoderBlock",
    "RevIN",
    "num_patches",
    "patching_for_num_patches",
    "JumboBlock",
    "JumboToken",
    "LayerScale",
    "LayerNormalization",
    "MaskedLayerNorm",
    "MaskedViTBlock",
    "ResidualSpatialReduction",
    "MLP",
    "MultiHeadSelfAttention",
    "PatchEmbedding",
    "PositionEmbedding",
    "PrefixTokens",
    "Registers",
    "StochasticDepth",
    "TokenDropping",
    "TokenPooling",
    "TransformerEncoder",
    "ViTBlock",
    "closed_form_layer_norm",
    "jumbo_merge",
    "jumbo_split",
]
