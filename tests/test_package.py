"""Package-level rules: public surface, and no backend imports in layers."""

import pathlib
import re

import keras_jumbo

PACKAGE = pathlib.Path(keras_jumbo.__file__).parent
BACKEND_IMPORT = re.compile(
    r"^\s*(import|from)\s+(tensorflow|torch|jax)\b", re.M
)
ALLOWED = {"convert", "data"}  # export and data loading may need a backend
# Each file here imports a backend only when it is the running backend:
# - distribution.py: tf.distribute.MirroredStrategy has no
#   keras.distribution equivalent;
# - optimizers.py: torch's fused AdamW kernel has no keras.ops equivalent;
# - _keras_internals.py: skipping `Layer.__call__` on PyTorch must still
#   honour torch module hooks and tracing, which only torch can report;
# - _torch_kernels.py: ops whose PyTorch kernels `keras.ops` does not
#   reach (fused linear, reshape, LayerNorm and attention on strided views,
#   GELU and concatenation without Keras' per-op dispatch); the keras.ops
#   formula elsewhere;
# - runtime.py: JAX's CPU dispatch setting (`keep_freed_memory`), a
#   process setting with no Keras equivalent;
# - _half_precision.py: on JAX's CPU, half-precision products asked for
#   a float32 result (`preferred_element_type`, which `keras.ops` does not
#   take) and their gradients (`jax.custom_vjp`); `keras.ops` elsewhere.
ALLOWED_FILES = {
    "_half_precision.py",
    "distribution.py",
    "optimizers.py",
    "_keras_internals.py",
    "_torch_kernels.py",
    "runtime.py",
}


def test_library_code_imports_no_backend_outside_convert_and_data():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        top = path.relative_to(PACKAGE).parts[0]
        if top in ALLOWED or top in ALLOWED_FILES:
            continue
        if BACKEND_IMPORT.search(path.read_text()):
            offenders.append(str(path.relative_to(PACKAGE)))
    assert not offenders, offenders


def test_public_surface():
    for name in (
        "JumboViT",
        "RegistersViT",
        "ViT",
        "list_models",
        "create_model",
    ):
        assert hasattr(keras_jumbo.models, name)
    for name in (
        "JumboToken",
        "Registers",
        "TokenDropping",
        "ViTBlock",
        "JumboBlock",
        "PatchTSTEncoderBlock",
        "MaskedViTBlock",
        "TransformerEncoder",
    ):
        assert hasattr(keras_jumbo.layers, name)
    assert hasattr(keras_jumbo.callbacks, "TokenDropSchedule")
    assert callable(keras_jumbo.runtime.keep_freed_memory)
    assert hasattr(keras_jumbo.convert, "load_official_jumbo")
    assert keras_jumbo.__version__
