"""Offline dataset loaders (no downloads at run time unless asked)."""

from keras_jumbo.data.augment import BatchAugmentation
from keras_jumbo.data.augment import MixUpOrCutMix
from keras_jumbo.data.augment import OneOf
from keras_jumbo.data.augment import PadAndRandomCrop
from keras_jumbo.data.augment import RandomGaussianBlur
from keras_jumbo.data.augment import TrainingModeModel
from keras_jumbo.data.augment import gaussian_blur
from keras_jumbo.data.augment import rand_augment
from keras_jumbo.data.augment import reseed
from keras_jumbo.data.augment import three_augment
from keras_jumbo.data.fashion_mnist import FASHION_MNIST_DIR
from keras_jumbo.data.fashion_mnist import load_fashion_mnist
from keras_jumbo.data.fashion_mnist import read_idx
from keras_jumbo.data.host_augment import HostRandAugment
from keras_jumbo.data.host_augment import HostRandomFlip
from keras_jumbo.data.host_augment import HostThreeAugment
from keras_jumbo.data.host_augment import pil_rand_augment_op
from keras_jumbo.data.images import ImageBatches
from keras_jumbo.data.images import augmented_batches
from keras_jumbo.data.images import image_directory_dataset
from keras_jumbo.data.images import tfds_dataset
from keras_jumbo.data.randaugment import RAND_AUGMENT_OPS
from keras_jumbo.data.randaugment import RandAugment
from keras_jumbo.data.randaugment import apply_rand_augment_op
from keras_jumbo.data.time_series import ForecastingWindows
from keras_jumbo.data.time_series import forecasting_splits
from keras_jumbo.data.time_series import load_appliances_energy
from keras_jumbo.data.time_series import load_electricity_hourly
from keras_jumbo.data.time_series import load_forecasting_csv
from keras_jumbo.data.time_series import load_ucr_uea
from keras_jumbo.data.time_series import split_half
from keras_jumbo.data.time_series import ucr_uea_offline

__all__ = [
    "BatchAugmentation",
    "HostRandAugment",
    "HostRandomFlip",
    "HostThreeAugment",
    "ImageBatches",
    "MixUpOrCutMix",
    "OneOf",
    "PadAndRandomCrop",
    "RAND_AUGMENT_OPS",
    "RandAugment",
    "RandomGaussianBlur",
    "TrainingModeModel",
    "gaussian_blur",
    "apply_rand_augment_op",
    "augmented_batches",
    "image_directory_dataset",
    "pil_rand_augment_op",
    "rand_augment",
    "reseed",
    "tfds_dataset",
    "three_augment",
    "FASHION_MNIST_DIR",
    "ForecastingWindows",
    "forecasting_splits",
    "load_appliances_energy",
    "load_electricity_hourly",
    "load_fashion_mnist",
    "load_forecasting_csv",
    "load_ucr_uea",
    "ucr_uea_offline",
    "read_idx",
    "split_half",
]
