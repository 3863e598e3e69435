import os

import keras
import numpy as np
import pytest

FIXTURES = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "fixtures"
)


def pytest_report_header(config):
    return f"keras {keras.__version__}, backend {keras.backend.backend()}"


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def numpy(x):
    return keras.ops.convert_to_numpy(x)
