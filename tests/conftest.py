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


def official_fixture():
    """The official Jumbo pico fixture: state dict, input, outputs, config.

    Returns `(state, input_nchw, logits, features, config)`.
    """
    import ast

    data = np.load(os.path.join(FIXTURES, "jumbo_official_pico_seed0.npz"))
    state = {
        key.removeprefix("state_dict/"): data[key]
        for key in data.files
        if key.startswith("state_dict/")
    }
    config = ast.literal_eval(str(data["config"]))
    return state, data["input_nchw"], data["logits"], data["features"], config


def numpy(x):
    return keras.ops.convert_to_numpy(x)
