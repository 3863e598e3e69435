import keras
import numpy as np
import pytest

from keras_jumbo.convert import load_official_jumbo
from keras_jumbo.convert import official_jumbo_model
from keras_jumbo.models import JumboViT
from keras_jumbo.testing import assert_allclose
from tests.conftest import official_fixture


@pytest.fixture(scope="module")
def official():
    return official_fixture()


def _model(config, **kwargs):
    return official_jumbo_model(
        config["size"],
        num_classes=config["num_classes"],
        image_size=config["img_size"],
        **kwargs,
    )


def test_fixture_config_matches_our_size_table(official):
    *_, config = official
    model = _model(config)
    assert model.depth == model.encoder.depth == config["depth"]
    assert model.num_heads == config["num_heads"]
    assert model.jumbo_multiplier == config["J"]
    for block in model.encoder.blocks:
        assert block.num_heads == config["num_heads"]
        assert block.jumbo_multiplier == config["J"]
    assert model.final_norm.gamma.shape[0] == config["embed_dim"]


def test_ported_weights_reproduce_official_logits(official):
    state, images, logits, features, config = official
    model = load_official_jumbo(_model(config), state)
    nhwc = np.transpose(images, (0, 2, 3, 1))
    assert_allclose(model(nhwc), logits, atol=1e-4, rtol=0)
    # The official `forward_features`: final LayerNorm on every token.
    body = keras.Model(model.input, model.get_layer("final_norm").output)
    assert_allclose(body(nhwc), features, atol=1e-4, rtol=0)


def test_channels_first_model_takes_the_official_nchw_input(official):
    state, images, logits, _, config = official
    model = load_official_jumbo(
        _model(config, data_format="channels_first"), state
    )
    assert_allclose(model(images), logits, atol=1e-4, rtol=0)


def test_load_from_a_pth_file(official, tmp_path):
    import torch  # part of the test install (.ci/install.sh)

    state, images, logits, _, config = official
    path = tmp_path / "official.pth"
    torch.save({k: torch.from_numpy(v) for k, v in state.items()}, path)
    model = load_official_jumbo(_model(config), str(path))
    assert_allclose(
        model(np.transpose(images, (0, 2, 3, 1))), logits, atol=1e-4, rtol=0
    )


def test_ported_model_saves_and_reloads(official, tmp_path):
    state, images, logits, _, config = official
    model = load_official_jumbo(_model(config), state)
    path = str(tmp_path / "official.keras")
    model.save(path)
    reloaded = keras.saving.load_model(path)
    nhwc = np.transpose(images, (0, 2, 3, 1))
    assert_allclose(reloaded(nhwc), logits, atol=1e-4, rtol=0)


def test_loader_errors(official):
    state, *_, config = official
    with pytest.raises(ValueError, match="head='official'"):
        load_official_jumbo(
            JumboViT("pico", num_classes=10, image_size=64), state
        )
    missing = {k: v for k, v in state.items() if k != "blocks.3.norm1.weight"}
    with pytest.raises(ValueError, match="blocks.3.norm1.weight"):
        load_official_jumbo(_model(config), missing)
    with pytest.raises(ValueError, match="head.weight"):
        load_official_jumbo(
            official_jumbo_model("pico", num_classes=7, image_size=64), state
        )
    extra = dict(state, **{"blocks.12.norm1.weight": np.ones(96, "float32")})
    with pytest.raises(ValueError, match="Unexpected"):
        load_official_jumbo(_model(config), extra)
    with pytest.raises(TypeError, match="state_dict"):
        load_official_jumbo(_model(config), 42)
