import gzip
import struct

import numpy as np
import pytest

from keras_jumbo.data import load_fashion_mnist
from keras_jumbo.data import read_idx


def write_idx(path, array):
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_round_trip(tmp_path, rng):
    images = rng.integers(0, 256, size=(5, 28, 28), dtype=np.uint8)
    write_idx(tmp_path / "x.gz", images)
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), images)


def test_load_fashion_mnist_from_a_directory(tmp_path, rng):
    names = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (6, 28, 28)),
        "train-labels-idx1-ubyte.gz": rng.integers(0, 10, (6,)),
        "t10k-images-idx3-ubyte.gz": rng.integers(0, 256, (4, 28, 28)),
        "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, (4,)),
    }
    for name, array in names.items():
        write_idx(tmp_path / name, array)
    (x, y), (xt, yt) = load_fashion_mnist(str(tmp_path), allow_download=False)
    np.testing.assert_array_equal(x, names["train-images-idx3-ubyte.gz"])
    np.testing.assert_array_equal(yt, names["t10k-labels-idx1-ubyte.gz"])
    assert x.dtype == np.uint8 and xt.shape == (4, 28, 28) and y.shape == (6,)


def test_missing_files_without_download_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="directory"):
        load_fashion_mnist(str(tmp_path), allow_download=False)


def test_bad_idx_file_raises(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x01\x02\x03\x04")
    with pytest.raises(ValueError, match="IDX"):
        read_idx(tmp_path / "bad")
