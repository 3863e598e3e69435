"""Model registry: `list_models()` and `create_model(name, **overrides)`."""

from keras_jumbo.models.non_deep_vit import NonDeepViT
from keras_jumbo.models.patchtst import MSPatchTST
from keras_jumbo.models.patchtst import PatchTSTClassifier
from keras_jumbo.models.patchtst import PatchTSTForecaster
from keras_jumbo.models.vision_transformer import JumboViT
from keras_jumbo.models.vision_transformer import RegistersViT
from keras_jumbo.models.vision_transformer import ViT
from keras_jumbo.models.vit_res import ViTRes
from keras_jumbo.models.vit_res import ViTResNAS
from keras_jumbo.models.vit_sizes import VIT_SIZES

_REGISTRY = {}


def register_model(name, builder, **defaults):
    """Register `builder(**defaults, **overrides)` under `name`."""
    if name in _REGISTRY:
        raise ValueError(f"Model name already registered: name={name!r}")
    _REGISTRY[name] = (builder, defaults)


for _size in VIT_SIZES:
    register_model(f"vit_{_size}", ViT, size=_size)
    register_model(f"registers_vit_{_size}", RegistersViT, size=_size)
    register_model(f"jumbo_vit_{_size}", JumboViT, size=_size)

# Non-Deep ViT, Tables 1 and 6: L=12 folded into depth x branches.
for _depth, _branches in ((6, 2), (4, 3), (3, 4)):
    register_model(
        f"non_deep_vit_{_depth}x{_branches}",
        NonDeepViT,
        depth=_depth,
        num_branches=_branches,
    )

# Time series: Jumbo paper §4.3 / A.2.2-A.2.3 (classification), PatchTST and
# MS-PatchTST (forecasting).
register_model("patchtst", PatchTSTClassifier)
register_model("patchtst_registers", PatchTSTClassifier, num_registers="auto")
register_model("patchtst_jumbo", PatchTSTClassifier, jumbo_multiplier=4)
register_model("patchtst_forecaster", PatchTSTForecaster)
register_model("ms_patchtst", MSPatchTST)

# Multi-stage ViT-Res (Table 4) and the searched ViT-ResNAS (Tables 6-8).
register_model("vit_res_tiny", ViTRes, size="tiny")
for _size in ("tiny", "small", "medium"):
    register_model(f"vit_resnas_{_size}", ViTResNAS, size=_size)


def list_models(pattern=None):
    """Sorted registered names, optionally those containing `pattern`."""
    names = sorted(_REGISTRY)
    if pattern:
        names = [name for name in names if pattern in name]
    return names


def create_model(name, **overrides):
    """Build a registered model, e.g. `create_model("jumbo_vit_nano")`."""
    if name not in _REGISTRY:
        raise ValueError(
            f"Unknown model name. Known: {list_models()}. Received: "
            f"name={name!r}"
        )
    builder, defaults = _REGISTRY[name]
    return builder(**{**defaults, **overrides})
