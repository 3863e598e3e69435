"""Multi-device training: Keras' own `keras.distribution` on JAX, and
`tf.distribute.MirroredStrategy` on TensorFlow.

Usage on a multi-GPU node (the recipes' `--distribution` flag does this):

    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k --distribution data
    # Jumbo FFN weights split over the devices as well:
    KERAS_BACKEND=jax python -m recipes.jumbo_imagenet1k --distribution model
    KERAS_BACKEND=tensorflow python -m recipes.jumbo_imagenet1k \\
        --distribution mirrored

The global batch (`--batch-size`) is split over the devices; build and
compile the model inside `distribution_scope(...)`.
"""

import contextlib

import keras

DISTRIBUTIONS = ("none", "data", "model", "mirrored")

# The wide Jumbo FFN (J*D -> ratio*J*D -> J*D) dominates a Jumbo model's
# parameters; shard its hidden units over the "model" axis (Megatron-style:
# first kernel by columns, second by rows), replicate everything else.
JUMBO_FFN_LAYOUT = {
    r".*jumbo_mlp.*fc1/kernel": (None, "model"),
    r".*jumbo_mlp.*fc1/bias": ("model",),
    r".*jumbo_mlp.*fc2/kernel": ("model", None),
}


def _require_jax(what):
    if keras.backend.backend() != "jax":
        raise ValueError(
            f"{what} uses keras.distribution, which needs the JAX backend. "
            f"Received: KERAS_BACKEND={keras.backend.backend()!r}"
        )


def data_parallel(devices=None):
    """`keras.distribution.DataParallel` over `devices` (default: all)."""
    _require_jax("data_parallel")
    return keras.distribution.DataParallel(devices=devices)


def jumbo_layout_map(device_mesh):
    """A `keras.distribution.LayoutMap` sharding the Jumbo FFNs over the
    mesh's `"model"` axis (`JUMBO_FFN_LAYOUT`); other weights replicate."""
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for pattern, axes in JUMBO_FFN_LAYOUT.items():
        layout_map[pattern] = axes
    return layout_map


def model_parallel(model_axis_size=None, devices=None):
    """`keras.distribution.ModelParallel` on a (batch, model) device mesh
    with the Jumbo FFN layout map.

    Args:
        model_axis_size: devices per model replica (default: all devices,
            i.e. one replica); must divide the device count.
        devices: device list (default: `keras.distribution.list_devices()`).
    """
    _require_jax("model_parallel")
    devices = devices or keras.distribution.list_devices()
    model_axis_size = model_axis_size or len(devices)
    if (
        isinstance(model_axis_size, bool)
        or not isinstance(model_axis_size, int)
        or model_axis_size < 1
        or len(devices) % model_axis_size
    ):
        raise ValueError(
            "`model_axis_size` must be a positive int dividing the number "
            f"of devices ({len(devices)}). "
            f"Received: model_axis_size={model_axis_size!r}"
        )
    mesh = keras.distribution.DeviceMesh(
        shape=(len(devices) // model_axis_size, model_axis_size),
        axis_names=("batch", "model"),
        devices=devices,
    )
    return keras.distribution.ModelParallel(
        layout_map=jumbo_layout_map(mesh), batch_dim_name="batch"
    )


def distribution_scope(kind="none", model_axis_size=None, devices=None):
    """A context manager in which to build and compile the model.

    Args:
        kind: `"none"`; `"data"` (JAX `DataParallel`); `"model"` (JAX
            `ModelParallel` with the Jumbo FFN layout); `"mirrored"`
            (TensorFlow `MirroredStrategy`).
        model_axis_size: for `"model"`.
        devices: device list (default: every local device; for
            `"mirrored"`, TensorFlow's default: all GPUs, else the CPU).
    """
    if kind not in DISTRIBUTIONS:
        raise ValueError(
            f"`kind` must be one of {DISTRIBUTIONS}. Received: kind={kind!r}"
        )
    if kind == "none":
        return contextlib.nullcontext()
    if kind == "data":
        return data_parallel(devices).scope()
    if kind == "model":
        return model_parallel(model_axis_size, devices).scope()
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "kind='mirrored' is tf.distribute.MirroredStrategy and needs the "
            "TensorFlow backend. "
            f"Received: KERAS_BACKEND={keras.backend.backend()!r}"
        )
    # Unavoidable backend import: MirroredStrategy is TensorFlow's own API
    # (keras.distribution covers JAX only); the backend check above means
    # TensorFlow is installed.
    import tensorflow as tf

    return tf.distribute.MirroredStrategy(devices).scope()
