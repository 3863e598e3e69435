"""Presets: pretrained weights by name (`JumboViT.from_preset(...)`).

`list_presets()` names them; `load_preset` / `save_to_preset` read and
write preset directories; `imagenet_classes` / `decode_predictions` turn
ImageNet-1K logits into class names.
"""

from keras_jumbo.presets.imagenet import decode_predictions
from keras_jumbo.presets.imagenet import imagenet_classes
from keras_jumbo.presets.loader import PRESETS
from keras_jumbo.presets.loader import cache_root
from keras_jumbo.presets.loader import list_presets
from keras_jumbo.presets.loader import load_preset
from keras_jumbo.presets.loader import preset_info
from keras_jumbo.presets.loader import save_to_preset

__all__ = [
    "PRESETS",
    "cache_root",
    "decode_predictions",
    "imagenet_classes",
    "list_presets",
    "load_preset",
    "preset_info",
    "save_to_preset",
]
