"""Fashion-MNIST from local IDX files (Debian `dataset-fashion-mnist`)."""

import gzip
import os
import struct

import numpy as np

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FILES = {
    "x_train": "train-images-idx3-ubyte.gz",
    "y_train": "train-labels-idx1-ubyte.gz",
    "x_test": "t10k-images-idx3-ubyte.gz",
    "y_test": "t10k-labels-idx1-ubyte.gz",
}
_DTYPES = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def read_idx(path):
    """Read an IDX file (optionally gzipped) into a numpy array."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"Not an IDX file: path={path!r}")
    dtype, rank = data[2], data[3]
    if dtype not in _DTYPES:
        raise ValueError(f"Unknown IDX element type {dtype:#x} in {path!r}")
    shape = struct.unpack(f">{rank}I", data[4 : 4 + 4 * rank])
    array = np.frombuffer(data, dtype=_DTYPES[dtype], offset=4 + 4 * rank)
    if array.size != int(np.prod(shape)):
        raise ValueError(
            f"Truncated IDX file {path!r}: header shape {shape}, "
            f"{array.size} values"
        )
    return array.reshape(shape).astype(
        np.dtype(_DTYPES[dtype]).newbyteorder("=")
    )


def load_fashion_mnist(directory=None, allow_download=True):
    """Fashion-MNIST as `(x_train, y_train), (x_test, y_test)` uint8 arrays.

    Reads the gzipped IDX files from `directory` (default: the
    `KERAS_JUMBO_FASHION_MNIST` environment variable, else
    `/usr/share/datasets/fashion-mnist`, where Debian's
    `dataset-fashion-mnist` package installs them). When they are absent
    and `allow_download` is True, falls back to
    `keras.datasets.fashion_mnist.load_data()` (needs the network).

    Returns:
        Images `(n, 28, 28)` and labels `(n,)`; 60,000 train, 10,000 test.
    """
    directory = directory or os.environ.get(
        "KERAS_JUMBO_FASHION_MNIST", FASHION_MNIST_DIR
    )
    paths = {key: os.path.join(directory, name) for key, name in _FILES.items()}
    if all(os.path.exists(path) for path in paths.values()):
        arrays = {key: read_idx(path) for key, path in paths.items()}
        return (arrays["x_train"], arrays["y_train"]), (
            arrays["x_test"],
            arrays["y_test"],
        )
    if not allow_download:
        raise FileNotFoundError(
            f"Fashion-MNIST IDX files not found in directory={directory!r}; "
            "install Debian's `dataset-fashion-mnist` or set "
            "KERAS_JUMBO_FASHION_MNIST."
        )
    import keras

    return keras.datasets.fashion_mnist.load_data()
