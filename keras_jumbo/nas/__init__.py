"""Weight-sharing NAS for multi-stage ViTs (ViT-ResNAS)."""

from keras_jumbo.layers import ApplyChannelMask
from keras_jumbo.layers import ChannelMask
from keras_jumbo.models.macs import count_macs
from keras_jumbo.nas.evolution import evolutionary_search
from keras_jumbo.nas.search_space import SearchSpace
from keras_jumbo.nas.supernet import MultiArchitectureBatches
from keras_jumbo.nas.supernet import ViTResSuperNet
from keras_jumbo.nas.supernet import architecture_codes
from keras_jumbo.nas.supernet import build_supernet
from keras_jumbo.nas.supernet import evaluate_subnet
from keras_jumbo.nas.supernet import extract_subnet
from keras_jumbo.nas.supernet import slice_layer_weights
from keras_jumbo.nas.token_labeling import TokenLabelingMix
from keras_jumbo.nas.token_labeling import token_labeling_losses

__all__ = [
    "ApplyChannelMask",
    "ChannelMask",
    "MultiArchitectureBatches",
    "SearchSpace",
    "TokenLabelingMix",
    "architecture_codes",
    "ViTResSuperNet",
    "build_supernet",
    "count_macs",
    "evaluate_subnet",
    "evolutionary_search",
    "extract_subnet",
    "slice_layer_weights",
    "token_labeling_losses",
]
