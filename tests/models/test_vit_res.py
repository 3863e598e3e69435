import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo.models import count_macs
from keras_jumbo.models import mac_report
from keras_jumbo.models.vit_res import ARCHITECTURES
from keras_jumbo.models.vit_res import build_vit_res
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_model_test
from tests.conftest import numpy

# A tiny 3-stage architecture at 56 px: 4x4, 2x2, 1x1 token grids.
TINY_ARCH = dict(
    stem_filters=4,
    embed_dims=(8, 12, 16),
    head_dims=(4, 4, 8),
    blocks=(((2, 16),), ((3, 24), (2, 12)), ((2, 32),)),
)


def images(batch=2, size=56, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, size, size, 3)).astype("float32")


def test_channels_first_and_token_labeling_model_checks():
    model = models.ViTRes(
        TINY_ARCH, num_classes=5, image_size=56, data_format="channels_first"
    )
    run_model_test(model, np.transpose(images(), (0, 3, 1, 2)))
    labeled = models.ViTRes(
        TINY_ARCH, num_classes=5, image_size=56, token_labeling=True
    )
    randomize_weights(labeled)
    out = labeled(images())
    assert out["logits"].shape == (2, 5)
    assert out["patch_logits"].shape == (2, 1, 5)  # 1x1 grid in stage 3


def test_stage_token_counts_follow_table_4():
    model = models.ViTRes(TINY_ARCH, num_classes=5, image_size=112)
    # 112 px: stem /2, patch /7 -> 8x8, then 4x4, 2x2 (+ CLS each).
    assert model.get_layer("stage_0_block_0").output.shape == (None, 65, 8)
    assert model.get_layer("stage_1_block_1").output.shape == (None, 17, 12)
    assert model.get_layer("stage_2_block_0").output.shape == (None, 5, 16)


def test_conv_stem_matches_reference_padding(rng):
    model = models.ViTRes(TINY_ARCH, num_classes=5, image_size=56)
    randomize_weights(model)
    x = images(1)
    conv = model.get_layer("stem_conv1")
    out = numpy(conv(model.get_layer("stem_pad1")(x)))
    kernel = numpy(conv.kernel).astype("float64")
    padded = np.pad(x[0].astype("float64"), ((1, 1), (1, 1), (0, 0)))
    # PyTorch Conv2d(k=3, s=2, p=1): output (i, j) reads rows 2i-1..2i+1.
    for i, j in [(0, 0), (5, 7), (27, 27)]:
        window = padded[2 * i : 2 * i + 3, 2 * j : 2 * j + 3]
        expected = np.einsum("xyc,xyco->o", window, kernel)
        assert_allclose(out[0, i, j], expected, atol=1e-4)


# Paper Table 3 (params in M, MACs in G). Ours: the classifier with and
# without the token-labelling patch head (the paper's models are trained
# with it); see README "ViT-ResNAS counts".
TABLE_3 = {
    "vit_res_tiny": (43, 1.8),
    "vit_resnas_tiny": (41, 1.8),
    "vit_resnas_small": (65, 2.8),
    "vit_resnas_medium": (97, 4.5),
}


@pytest.mark.large
@pytest.mark.parametrize("name", sorted(TABLE_3))
def test_parameters_and_macs_reproduce_table_3_within_5_percent(name):
    params, macs = TABLE_3[name]
    model = models.create_model(name, token_labeling=True)
    assert abs(model.count_params() / 1e6 / params - 1) < 0.05
    assert abs(count_macs(model) / 1e9 / macs - 1) < 0.05
    # Without the token-labelling patch head (inference classifier):
    # 1000 * (D + 1) fewer parameters, 16 * D * 1000 fewer MACs.
    width = ARCHITECTURES[name]["embed_dims"][-1]
    head = dict((n, m) for n, _, m in mac_report(model))["patch_head"]
    assert head == 16 * width * 1000
    plain_params = model.count_params() - 1000 * (width + 1)
    assert abs(plain_params / 1e6 / params - 1) < 0.05
    assert abs((count_macs(model) - head) / 1e9 / macs - 1) < 0.05


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="image_size"):
        models.ViTRes(TINY_ARCH, image_size=60)
    with pytest.raises(ValueError, match="size"):
        models.ViTRes("huge")
    with pytest.raises(ValueError, match="size"):
        models.ViTResNAS("large")
    shrinking = {**TINY_ARCH, "embed_dims": (8, 6, 16)}
    with pytest.raises(ValueError, match="shrink"):
        models.ViTRes(shrinking)
    with pytest.raises(ValueError, match="num_heads"):
        models.ViTRes(
            {**TINY_ARCH, "blocks": (((0, 8),), ((2, 8),), ((2, 8),))}
        )
    with pytest.raises(TypeError, match="architecture"):
        build_vit_res([8, 12, 16])
