import keras
import numpy as np
import pytest

from keras_jumbo.callbacks import JoinSchedule
from keras_jumbo.convert import get_join_lambda
from keras_jumbo.convert import reparameterize
from keras_jumbo.convert import set_join_lambda
from keras_jumbo.layers import BlockwiseMHSA
from keras_jumbo.layers import MultiHeadSelfAttention
from keras_jumbo.layers import ParallelBranchBlock
from keras_jumbo.models import NonDeepViT
from keras_jumbo.models import ViT
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights

TINY = dict(
    hidden_dim=16, num_heads=2, image_size=16, patch_size=8, num_classes=5
)


def images(batch=3):
    rng = np.random.default_rng(0)
    return rng.normal(size=(batch, 16, 16, 3)).astype("float32")


@pytest.mark.parametrize(
    "depth,branches,kwargs",
    [
        (2, 2, {}),
        (2, 1, {}),
        (1, 3, {"head": "token", "use_class_token": True}),
        (2, 4, {"include_top": False}),
    ],
)
@pytest.mark.parametrize("absorb", [True, False])
def test_reparameterized_model_equals_branchy_model_at_lambda_one(
    depth, branches, kwargs, absorb
):
    model = NonDeepViT(depth, branches, **TINY, **kwargs)
    randomize_weights(model)
    set_join_lambda(model, 1.0)
    plain = reparameterize(model, absorb_layer_norm=absorb)
    x = images()
    assert_allclose(plain(x), model(x), atol=1e-5, rtol=0)
    # No branch code left: plain attention, depth blocks.
    kinds = {type(layer) for layer in plain._flatten_layers()}
    assert ParallelBranchBlock not in kinds and BlockwiseMHSA not in kinds
    attention = [
        layer
        for layer in plain.layers
        if isinstance(layer, MultiHeadSelfAttention)
    ]
    assert len(attention) == depth
    assert attention[0].key_dim == branches * 8  # n · d_k
    assert attention[0].head_dim == 8  # d_v: the values stay lean


def test_reparameterized_model_has_a_plain_vit_parameter_budget(tmp_path):
    model = NonDeepViT(2, 2, **TINY)
    randomize_weights(model)
    set_join_lambda(model, 1.0)
    plain = reparameterize(model, absorb_layer_norm=False)
    baseline = ViT("tiny", depth=2, head="avg", use_class_token=False, **TINY)
    # Only the query/key widths grow (n·d_k); values, FFN, norms are plain.
    extra_qk = 2 * (2 - 1) * (16 * 16 + 16)  # per block: q and k, n-1 extra
    assert plain.count_params() == baseline.count_params() + 2 * extra_qk
    # The same lean architecture on every backend (JAX included).
    plain = reparameterize(model)
    assert plain.count_params() < baseline.count_params() + 2 * extra_qk
    padded = reparameterize(model, pad_values=True)
    assert_allclose(padded(images()), plain(images()), atol=1e-5, rtol=0)
    path = str(tmp_path / "reparameterized.keras")
    x = images()
    plain.save(path)
    reloaded = keras.saving.load_model(path)
    assert_allclose(reloaded(x), plain(x), atol=0, rtol=0)


def test_lambda_below_one_raises_unless_forced():
    model = NonDeepViT(1, 2, **TINY)
    randomize_weights(model)
    set_join_lambda(model, 0.5)
    with pytest.raises(ValueError, match="λ=1"):
        reparameterize(model)
    plain = reparameterize(model, force=True)
    set_join_lambda(model, 1.0)
    assert_allclose(plain(images()), model(images()), atol=1e-5, rtol=0)
    with pytest.raises(TypeError, match="NonDeepViT.*type ViT"):
        reparameterize(ViT("pico", depth=1, **TINY))
    with pytest.raises(TypeError, match="model='m.keras'"):
        reparameterize("m.keras")
    with pytest.raises(TypeError, match="model=None"):
        reparameterize(None)
    with pytest.raises(TypeError, match="pad_values"):
        reparameterize(model, force=True, pad_values="maybe")
    with pytest.raises(ValueError, match="λ"):
        set_join_lambda(model, 2.0)
    # No branches, no λ: refused instead of silently doing nothing.
    with pytest.raises(ValueError, match="no ProgressiveJoin.*ViT"):
        set_join_lambda(ViT("pico", depth=1, **TINY), 1.0)
    with pytest.raises(ValueError, match="num_branches"):
        NonDeepViT(2, 0, **TINY)


def test_join_schedule_reaches_one_inside_fit_then_collapses_exactly():
    model = NonDeepViT(1, 2, **TINY, diversity_weight=0.05)
    randomize_weights(model)
    model.compile(
        optimizer=keras.optimizers.SGD(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = images(8), np.arange(8) % 5
    schedule = JoinSchedule("linear", warmup_steps=3)
    history = model.fit(
        x, y, batch_size=2, epochs=2, verbose=0, callbacks=[schedule]
    )
    assert history.history["join_lambda"] == [1.0, 1.0]
    assert get_join_lambda(model) == [1.0, 1.0]
    plain = reparameterize(model)
    assert_allclose(plain(x), model(x), atol=1e-5, rtol=0)


def test_mixed_precision_model_reparameterizes_in_its_policy(tmp_path):
    """The plain model keeps the branchy model's dtype policy (its new
    layers used to take Keras' global float32 policy, silently)."""
    model = NonDeepViT(2, 2, **TINY, dtype="mixed_bfloat16")
    randomize_weights(model, scale=0.2)
    set_join_lambda(model, 1.0)
    plain = reparameterize(model)
    assert {layer.dtype_policy.name for layer in plain._flatten_layers()} == {
        "mixed_bfloat16"
    }
    x = images()
    out = keras.ops.convert_to_numpy(keras.ops.cast(plain(x), "float32"))
    expected = keras.ops.convert_to_numpy(keras.ops.cast(model(x), "float32"))
    assert np.abs(out - expected).max() < 0.05 * np.abs(expected).max()
    plain.save(tmp_path / "plain.keras")
    reloaded = keras.saving.load_model(tmp_path / "plain.keras")
    assert reloaded.layers[-1].dtype_policy.name == "mixed_bfloat16"
