import keras
import numpy as np
import pytest

from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import JumboToken
from keras_jumbo.layers import Registers
from keras_jumbo.layers import jumbo_merge
from keras_jumbo.layers import jumbo_split
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test
from tests.layers.reference import value


@pytest.mark.parametrize(
    "cls,kwargs,count",
    [
        (ClassToken, {}, 1),
        (Registers, {"num_registers": 3}, 3),
        (JumboToken, {"jumbo_multiplier": 4}, 4),
    ],
)
def test_prefix_layer_checks(cls, kwargs, count):
    run_layer_test(
        cls,
        kwargs,
        input_shape=(2, 5, 6),
        expected_output_shape=(2, 5 + count, 6),
        expected_num_trainable_weights=1,
    )


def test_registers_prepend_tokens_and_keep_inputs(rng):
    layer = Registers(num_registers=3)
    x = rng.normal(size=(2, 4, 5)).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    tokens = value(layer.tokens)
    np.testing.assert_allclose(y[:, :3], np.broadcast_to(tokens, (2, 3, 5)))
    np.testing.assert_allclose(y[:, 3:], x)


def test_zero_registers_is_identity(rng):
    x = rng.normal(size=(2, 4, 5)).astype("float32")
    assert_allclose(Registers(0)(x), x, atol=0)


def test_jumbo_token_is_split_into_j_tokens(rng):
    layer = JumboToken(jumbo_multiplier=3)
    x = rng.normal(size=(2, 4, 5)).astype("float32")
    y = keras.ops.convert_to_numpy(layer(x))
    wide = value(layer.tokens)
    assert wide.shape == (15,)
    for j in range(3):
        expected = np.tile(wide[5 * j : 5 * j + 5], (2, 1))
        np.testing.assert_allclose(y[:, j], expected, rtol=1e-6)
    np.testing.assert_allclose(y[:, 3:], x)


def test_split_and_merge_are_exact_inverses(rng):
    wide = rng.normal(size=(2, 12)).astype("float32")
    split = jumbo_split(wide, 3)
    assert tuple(split.shape) == (2, 3, 4)
    assert_allclose(split[:, 1], wide[:, 4:8], atol=0)
    assert_allclose(jumbo_merge(split), wide, atol=0)


def test_prefix_errors():
    with pytest.raises(ValueError, match="num_registers"):
        Registers(-1)
    with pytest.raises(TypeError, match="num_registers"):
        Registers(2.5)
    with pytest.raises(ValueError, match="jumbo_multiplier"):
        JumboToken(0)
    with pytest.raises(ValueError, match="rank 3"):
        ClassToken().build((2, 4))
