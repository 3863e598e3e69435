import keras
import numpy as np
import pytest

from keras_jumbo.layers import TransformerBlock
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers import reference


def reference_plain_block(x, block):
    x = x + reference.attention(reference.norm(x, block.norm1), block.attention)
    if block.use_patch_mlp:
        x = x + reference.mlp(reference.norm(x, block.norm2), block.mlp)
    return x


def reference_jumbo_block(x, block, shared_mlp=None):
    """Jumbo paper §3.2 written out with numpy."""
    j = block.jumbo_multiplier
    b, n, d = x.shape
    x = x + reference.attention(reference.norm(x, block.norm1), block.attention)
    jumbo = x[:, :j].reshape(b, j * d)  # concatenate the J split tokens
    hidden = reference.norm(jumbo, block.norm3)
    mlp = shared_mlp if block.share_jumbo_mlp else block.jumbo_mlp
    branch = reference.mlp(hidden, mlp)
    if block.jumbo_lora_rank:
        branch = branch + reference.dense(
            reference.dense(hidden, block.jumbo_lora_down), block.jumbo_lora_up
        )
    jumbo = jumbo + branch
    patches = x[:, j:]
    if block.use_patch_mlp:
        patches = patches + reference.mlp(
            reference.norm(patches, block.norm2), block.mlp
        )
    return np.concatenate([jumbo.reshape(b, j, d), patches], axis=1)


@pytest.mark.parametrize(
    "kwargs,num_weights",
    [
        ({}, 12),
        ({"jumbo_multiplier": 2, "jumbo_mlp_dim": 24}, 18),
        ({"layer_scale_init_value": 0.1}, 14),
        (
            {
                "jumbo_multiplier": 2,
                "jumbo_mlp_dim": 24,
                "use_patch_mlp": False,
            },
            12,
        ),
    ],
)
def test_block_layer_checks(kwargs, num_weights):
    run_layer_test(
        TransformerBlock,
        {"num_heads": 2, "mlp_dim": 16, "drop_path_rate": 0.1, **kwargs},
        input_shape=(2, 6, 8),
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=num_weights,
    )


def test_plain_block_matches_reference(rng):
    block = TransformerBlock(num_heads=2, mlp_dim=16)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    assert_allclose(block(x), reference_plain_block(x, block), atol=1e-4)


@pytest.mark.parametrize("use_patch_mlp", [True, False])
def test_jumbo_block_matches_reference(rng, use_patch_mlp):
    block = TransformerBlock(
        num_heads=2,
        mlp_dim=16,
        jumbo_multiplier=3,
        jumbo_mlp_dim=40,
        use_patch_mlp=use_patch_mlp,
    )
    x = rng.normal(size=(2, 3 + 5, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    assert_allclose(block(x), reference_jumbo_block(x, block), atol=1e-4)


def test_jumbo_block_j1_equals_plain_block_with_cls_token(rng):
    """J=1, Jumbo FFN := patch FFN  ==  plain block with a CLS token."""
    d, hidden = 8, 24
    jumbo = TransformerBlock(
        num_heads=2, mlp_dim=hidden, jumbo_multiplier=1, jumbo_mlp_dim=hidden
    )
    plain = TransformerBlock(num_heads=2, mlp_dim=hidden)
    x = rng.normal(size=(3, 1 + 6, d)).astype("float32")
    jumbo(x)
    plain(x)
    randomize_weights(plain, seed=3)
    jumbo.norm1.set_weights(plain.norm1.get_weights())
    jumbo.attention.set_weights(plain.attention.get_weights())
    jumbo.norm2.set_weights(plain.norm2.get_weights())
    jumbo.mlp.set_weights(plain.mlp.get_weights())
    jumbo.norm3.set_weights(plain.norm2.get_weights())
    jumbo.jumbo_mlp.set_weights(plain.mlp.get_weights())
    assert_allclose(jumbo(x), plain(x), atol=1e-5)


def test_shared_jumbo_mlp_with_lora_matches_reference(rng):
    encoder = TransformerEncoder(
        depth=2,
        num_heads=2,
        mlp_dim=16,
        jumbo_multiplier=2,
        jumbo_mlp_dim=20,
        share_jumbo_mlp=True,
        jumbo_lora_rank=3,
    )
    x = rng.normal(size=(2, 2 + 4, 8)).astype("float32")
    encoder(x)
    randomize_weights(encoder)
    expected = x.astype("float64")
    for block in encoder.blocks:
        expected = reference_jumbo_block(
            expected, block, shared_mlp=encoder.shared_jumbo_mlp
        )
    assert_allclose(encoder(x), expected, atol=1e-4)
    # One Jumbo FFN for all blocks: 4 weights, not 4 per block.
    names = [w.path for w in encoder.weights if "jumbo_mlp" in w.path]
    assert len(names) == 4, names


def test_encoder_layer_checks():
    run_layer_test(
        TransformerEncoder,
        {
            "depth": 2,
            "num_heads": 2,
            "mlp_dim": 16,
            "jumbo_multiplier": 2,
            "jumbo_mlp_dim": 32,
            "share_jumbo_mlp": True,
            "jumbo_lora_rank": 2,
            "last_block_patch_mlp": False,
            "drop_path_rate": 0.2,
        },
        input_shape=(2, 6, 8),
        # per block: norm1, attn (4), norm3 (2), lora (2) = 10, norm2 and
        # mlp (6) only in block 0; shared Jumbo FFN 4.
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=2 * 10 + 6 + 4,
    )


def test_encoder_drop_path_schedules():
    linear = TransformerEncoder(3, 2, 8, drop_path_rate=0.2)
    assert [b.drop_path_rate for b in linear.blocks] == pytest.approx(
        [0.0, 0.1, 0.2]
    )
    constant = TransformerEncoder(
        3, 2, 8, drop_path_rate=0.2, drop_path_schedule="constant"
    )
    assert [b.drop_path_rate for b in constant.blocks] == [0.2] * 3


def test_drop_path_changes_training_output_only(rng):
    block = TransformerBlock(num_heads=2, mlp_dim=8, drop_path_rate=0.5)
    x = rng.normal(size=(64, 3, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    assert_allclose(block(x), reference_plain_block(x, block), atol=1e-4)
    trained = keras.ops.convert_to_numpy(block(x, training=True))
    assert not np.allclose(trained, reference_plain_block(x, block), atol=1e-3)


def test_block_errors():
    with pytest.raises(ValueError, match="num_heads"):
        TransformerBlock(num_heads=3, mlp_dim=8).build((1, 4, 8))
    with pytest.raises(ValueError, match="jumbo_multiplier"):
        TransformerBlock(2, 8, jumbo_multiplier=-1)
    with pytest.raises(ValueError, match="jumbo_mlp_dim"):
        TransformerBlock(2, 8, jumbo_multiplier=2)
    with pytest.raises(ValueError, match="drop_path_rate"):
        TransformerBlock(2, 8, drop_path_rate=1.0)
    with pytest.raises(ValueError, match="dropout_rate"):
        TransformerBlock(2, 8, dropout_rate=-0.1)
    with pytest.raises(ValueError, match="share_jumbo_mlp"):
        TransformerBlock(
            2, 8, jumbo_multiplier=2, jumbo_mlp_dim=8, jumbo_lora_rank=2
        )
    with pytest.raises(ValueError, match="at least"):
        TransformerBlock(2, 8, jumbo_multiplier=4, jumbo_mlp_dim=8).build(
            (1, 3, 8)
        )
    shared = TransformerBlock(2, 8, jumbo_multiplier=1, share_jumbo_mlp=True)
    with pytest.raises(ValueError, match="shared_jumbo_mlp"):
        shared(np.zeros((1, 3, 8), "float32"))
    with pytest.raises(ValueError, match="drop_path_schedule"):
        TransformerEncoder(2, 2, 8, drop_path_schedule="cosine")
