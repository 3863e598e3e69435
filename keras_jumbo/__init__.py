"""keras_jumbo: Jumbo-CLS ViTs and friends for Keras 3 on every backend."""

from keras_jumbo import callbacks
from keras_jumbo import convert
from keras_jumbo import distribution
from keras_jumbo import layers
from keras_jumbo import losses
from keras_jumbo import models
from keras_jumbo import nas
from keras_jumbo import optimizers
from keras_jumbo import presets
from keras_jumbo import runtime
from keras_jumbo import schedules
from keras_jumbo.version import __version__

__all__ = [
    "__version__",
    "callbacks",
    "convert",
    "distribution",
    "layers",
    "losses",
    "models",
    "nas",
    "optimizers",
    "presets",
    "runtime",
    "schedules",
]
