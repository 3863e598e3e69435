"""Every public layer goes through `run_layer_test`; a new one cannot slip.

The check reads the test sources: a layer counts as covered when its name
appears in a test function (or that function's decorators, e.g. a
`parametrize` list) that calls `run_layer_test`. Base classes that are not
used on their own are listed with the reason.
"""

import ast
import pathlib

import keras
import numpy as np

import keras_jumbo.layers
from keras_jumbo.layers import ApplyChannelMask
from keras_jumbo.layers import ProgressiveJoin
from keras_jumbo.layers import TokenPooling
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import run_layer_test

TESTS = pathlib.Path(__file__).resolve().parents[1]
# Abstract bases: only their subclasses are layers one uses.
BASES = {"PrefixTokens": "base of ClassToken, Registers, JumboToken"}


def public_layers():
    return sorted(
        name
        for name in keras_jumbo.layers.__all__
        if isinstance(getattr(keras_jumbo.layers, name), type)
        and issubclass(getattr(keras_jumbo.layers, name), keras.layers.Layer)
    )


def names_run_through_the_harness():
    covered = set()
    for path in TESTS.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            calls = {
                n.func.id
                for n in ast.walk(node)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            }
            if "run_layer_test" not in calls:
                continue
            for part in [node, *node.decorator_list]:
                for n in ast.walk(part):
                    if isinstance(n, ast.Name):
                        covered.add(n.id)
                    elif isinstance(n, ast.Attribute):  # e.g. nas.ChannelMask
                        covered.add(n.attr)
    return covered


def test_every_public_layer_runs_through_the_harness():
    missing = [
        name
        for name in public_layers()
        if name not in BASES and name not in names_run_through_the_harness()
    ]
    assert not missing, f"public layers never run by run_layer_test: {missing}"


def test_token_pooling_layer_checks():
    for mode, prefix, width in (
        ("token", 1, 6),
        ("avg", 1, 6),
        ("jumbo", 2, 12),
        ("official", 2, 18),
        ("jumbo_avg", 2, 6),
    ):
        run_layer_test(
            TokenPooling,
            {"mode": mode, "num_prefix_tokens": prefix},
            input_shape=(2, 5, 6),
            expected_output_shape=(2, width),
            expected_num_trainable_weights=0,
            run_training_check=False,
        )
    x = np.random.default_rng(0).normal(size=(2, 5, 6)).astype("float32")
    official = TokenPooling("official", 2)(x)
    expected = np.concatenate([x[:, :2].reshape(2, 12), x[:, 2:].mean(1)], 1)
    assert_allclose(official, expected, atol=1e-6)


def test_progressive_join_layer_checks():
    run_layer_test(
        ProgressiveJoin,
        {"num_branches": 2, "initial_lambda": 0.5},
        input_shape=(3, 2, 4),
        expected_output_shape=(3, 2, 4),
        expected_num_trainable_weights=0,
        expected_num_non_trainable_weights=1,
        run_training_check=False,
    )


def test_apply_channel_mask_layer_checks():
    run_layer_test(
        ApplyChannelMask,
        {},
        input_shape=[(3, 2, 4), (3, 1, 4)],
        expected_output_shape=(3, 2, 4),
        expected_num_trainable_weights=0,
        run_training_check=False,
    )
