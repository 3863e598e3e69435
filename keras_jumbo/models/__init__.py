"""Model classes, the model registry, presets and MAC counting."""

from keras_jumbo.layers import TokenPooling
from keras_jumbo.models.macs import count_macs
from keras_jumbo.models.macs import mac_report
from keras_jumbo.models.macs import register_mac_rule
from keras_jumbo.models.non_deep_vit import NonDeepViT
from keras_jumbo.models.patchtst import MSPatchTST
from keras_jumbo.models.patchtst import PatchTSTClassifier
from keras_jumbo.models.patchtst import PatchTSTForecaster
from keras_jumbo.models.patchtst import registers_matching_jumbo_flops
from keras_jumbo.models.patchtst import resolve_scales
from keras_jumbo.models.registry import create_model
from keras_jumbo.models.registry import list_models
from keras_jumbo.models.registry import register_model
from keras_jumbo.models.vision_transformer import JumboViT
from keras_jumbo.models.vision_transformer import RegistersViT
from keras_jumbo.models.vision_transformer import ViT
from keras_jumbo.models.vision_transformer import with_config
from keras_jumbo.models.vision_transformer import with_image_size
from keras_jumbo.models.vit_res import ViTRes
from keras_jumbo.models.vit_res import ViTResNAS
from keras_jumbo.models.vit_sizes import VIT_SIZES
from keras_jumbo.presets import list_presets

__all__ = [
    "JumboViT",
    "MSPatchTST",
    "PatchTSTClassifier",
    "PatchTSTForecaster",
    "NonDeepViT",
    "RegistersViT",
    "TokenPooling",
    "VIT_SIZES",
    "ViT",
    "ViTRes",
    "ViTResNAS",
    "count_macs",
    "mac_report",
    "register_mac_rule",
    "create_model",
    "list_models",
    "register_model",
    "registers_matching_jumbo_flops",
    "resolve_scales",
    "list_presets",
    "with_config",
    "with_image_size",
]
