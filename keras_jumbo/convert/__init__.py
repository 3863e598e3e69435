"""Converters: official checkpoints in, branchy models collapsed."""

from keras_jumbo.convert.export import export_onnx
from keras_jumbo.convert.export import export_tflite
from keras_jumbo.convert.export import run_tflite
from keras_jumbo.convert.join import get_join_lambda
from keras_jumbo.convert.join import join_layers
from keras_jumbo.convert.join import set_join_lambda
from keras_jumbo.convert.official_jumbo import load_official_jumbo
from keras_jumbo.convert.official_jumbo import official_jumbo_model
from keras_jumbo.convert.reparameterize import merged_block_weights
from keras_jumbo.convert.reparameterize import reparameterize

__all__ = [
    "export_onnx",
    "export_tflite",
    "get_join_lambda",
    "join_layers",
    "load_official_jumbo",
    "merged_block_weights",
    "official_jumbo_model",
    "reparameterize",
    "run_tflite",
    "set_join_lambda",
]
