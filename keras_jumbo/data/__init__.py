"""Offline dataset loaders (no downloads at run time unless asked)."""

from keras_jumbo.data.fashion_mnist import FASHION_MNIST_DIR
from keras_jumbo.data.fashion_mnist import load_fashion_mnist
from keras_jumbo.data.fashion_mnist import read_idx

__all__ = ["FASHION_MNIST_DIR", "load_fashion_mnist", "read_idx"]
