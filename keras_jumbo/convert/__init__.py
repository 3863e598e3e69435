"""Converters: official checkpoints in; (later) reparameterisation, export."""

from keras_jumbo.convert.official_jumbo import load_official_jumbo
from keras_jumbo.convert.official_jumbo import official_jumbo_model

__all__ = ["load_official_jumbo", "official_jumbo_model"]
