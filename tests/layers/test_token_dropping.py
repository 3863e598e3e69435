import keras
import numpy as np
import pytest

from keras_jumbo.layers import TokenDropping
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test


def test_token_dropping_layer_checks():
    run_layer_test(
        TokenDropping,
        {"rate": 0.5, "num_prefix_tokens": 2},
        input_shape=(2, 10, 4),
        expected_output_shape=(2, 10, 4),
        expected_num_trainable_weights=0,
        # Training output is shorter than the symbolic (inference) shape;
        # fitting with token dropping is tested on whole models instead.
        run_training_check=False,
    )


def test_token_dropping_keeps_prefix_and_a_random_ordered_subset(rng):
    prefix, patches, dim = 3, 20, 2
    layer = TokenDropping(rate=0.75, num_prefix_tokens=prefix, seed=0)
    x = rng.normal(size=(8, prefix + patches, dim)).astype("float32")
    x[:, prefix:, 0] = np.arange(patches)  # mark each patch by its index
    y = keras.ops.convert_to_numpy(layer(x, training=True))
    assert y.shape == (8, prefix + 5, dim)
    np.testing.assert_array_equal(y[:, :prefix], x[:, :prefix])
    chosen = []
    for example in range(8):
        index = y[example, prefix:, 0].astype(int)
        assert np.all(np.diff(index) > 0)  # distinct, original order
        np.testing.assert_array_equal(
            y[example, prefix:], x[example, prefix + index]
        )
        chosen.append(tuple(index))
    assert len(set(chosen)) > 1  # a different subset per example


def test_token_dropping_is_identity_at_inference_and_rate_zero(rng):
    x = rng.normal(size=(2, 6, 3)).astype("float32")
    assert_allclose(TokenDropping(0.5)(x), x, atol=0)
    assert_allclose(TokenDropping(0.0)(x, training=True), x, atol=0)


def test_set_rate_reports_kept_count_changes():
    layer = TokenDropping(0.9)
    layer.build((None, 10, 4))
    assert TokenDropping.num_kept(10, 0.9) == 1
    assert not layer.set_rate(0.88)  # still 1 kept
    assert layer.set_rate(0.5)
    assert layer.rate == 0.5
    with pytest.raises(ValueError, match="rate"):
        layer.set_rate(1.0)


def test_token_dropping_errors():
    with pytest.raises(ValueError, match="rate"):
        TokenDropping(1.0)
    with pytest.raises(ValueError, match="rate"):
        TokenDropping(-0.1)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        TokenDropping(0.5, num_prefix_tokens=-1)
    with pytest.raises(ValueError, match="prefix"):
        TokenDropping(0.5, num_prefix_tokens=4).build((1, 4, 2))
