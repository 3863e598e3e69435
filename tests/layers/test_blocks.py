"""The encoder blocks (ViTBlock, JumboBlock, PatchTSTEncoderBlock) and the
TransformerEncoder, against numpy references of the papers' formulas."""

import math

import keras
import numpy as np
import pytest

from keras_jumbo.layers import MLP
from keras_jumbo.layers import JumboBlock
from keras_jumbo.layers import PatchTSTEncoderBlock
from keras_jumbo.layers import TransformerEncoder
from keras_jumbo.layers import ViTBlock
from keras_jumbo.layers import _micro_batch
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers import reference
from tests.layers.micro_batching import micro_batching_here


def reference_plain_block(x, block):
    x = x + reference.attention(reference.norm(x, block.norm1), block.attention)
    return x + reference.mlp(reference.norm(x, block.norm2), block.mlp)


def reference_jumbo_block(x, block, shared_mlp=None):
    """Jumbo paper §3.2 written out with numpy."""
    j = block.jumbo_multiplier
    b, n, d = x.shape
    x = x + reference.attention(reference.norm(x, block.norm1), block.attention)
    jumbo = x[:, :j].reshape(b, j * d)  # concatenate the J split tokens
    if block.use_jumbo_mlp:
        hidden = reference.norm(jumbo, block.norm3)
        mlp = shared_mlp if block.share_jumbo_mlp else block.jumbo_mlp
        branch = reference.mlp(hidden, mlp)
        if block.jumbo_lora_rank:
            branch = branch + reference.dense(
                reference.dense(hidden, block.jumbo_lora_down),
                block.jumbo_lora_up,
            )
        jumbo = jumbo + branch
    patches = x[:, j:]
    if block.use_patch_mlp:
        patches = patches + reference.mlp(
            reference.norm(patches, block.norm2), block.mlp
        )
    return np.concatenate([jumbo.reshape(b, j, d), patches], axis=1)


def test_vit_block_layer_checks():
    for kwargs, num_weights in (
        ({}, 12),
        ({"layer_scale_init_value": 0.1}, 14),
    ):
        run_layer_test(
            ViTBlock,
            {"num_heads": 2, "mlp_dim": 16, "drop_path_rate": 0.1, **kwargs},
            input_shape=(2, 6, 8),
            expected_output_shape=(2, 6, 8),
            expected_num_trainable_weights=num_weights,
        )


@pytest.mark.parametrize(
    "kwargs,num_weights",
    [
        ({}, 18),
        ({"use_patch_mlp": False}, 12),
        ({"use_jumbo_mlp": False, "jumbo_mlp_dim": None}, 12),
        ({"layer_scale_init_value": 0.1}, 21),
    ],
)
def test_jumbo_block_layer_checks(kwargs, num_weights):
    run_layer_test(
        JumboBlock,
        {
            "num_heads": 2,
            "mlp_dim": 16,
            "jumbo_multiplier": 2,
            "jumbo_mlp_dim": 24,
            "drop_path_rate": 0.1,
            **kwargs,
        },
        input_shape=(2, 6, 8),
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=num_weights,
    )


def test_patchtst_block_layer_checks():
    run_layer_test(
        PatchTSTEncoderBlock,
        {"num_heads": 2, "mlp_dim": 16, "drop_path_rate": 0.1},
        input_shape=(2, 6, 8),
        expected_output_shape=((2, 6, 8), (2, 2, 6, 6)),
        # attention 4, FFN 4, two BatchNorms 2 + 2 (and 4 moving stats)
        expected_num_trainable_weights=12,
        expected_num_non_trainable_weights=4,
    )


def test_every_block_attribute_is_present():
    """One set of attributes per class, None where an option leaves a part
    out, never missing."""
    x = np.zeros((1, 4, 8), "float32")
    vit = ViTBlock(2, 8)
    vit(x)
    for name in (
        "norm1",
        "attention",
        "layer_scale1",
        "drop_path1",
        "norm2",
        "mlp",
        "layer_scale2",
        "drop_path2",
    ):
        assert hasattr(vit, name), name
    jumbo_names = (
        "norm3",
        "jumbo_mlp",
        "jumbo_lora_down",
        "jumbo_lora_up",
        "layer_scale3",
        "drop_path3",
        "norm2",
        "mlp",
    )
    for kwargs in (
        {"jumbo_mlp_dim": 8},
        {"jumbo_mlp_dim": 8, "use_patch_mlp": False},
        {"use_jumbo_mlp": False},
    ):
        block = JumboBlock(2, 8, 2, **kwargs)
        block(x)
        for name in jumbo_names:
            assert hasattr(block, name), (kwargs, name)
    assert block.norm3 is None and block.jumbo_mlp is None


def test_plain_block_matches_reference(rng):
    block = ViTBlock(num_heads=2, mlp_dim=16)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    assert_allclose(block(x), reference_plain_block(x, block), atol=1e-4)


@pytest.mark.parametrize("use_patch_mlp", [True, False])
def test_jumbo_block_matches_reference(rng, use_patch_mlp):
    block = JumboBlock(
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
    jumbo = JumboBlock(
        num_heads=2, mlp_dim=hidden, jumbo_multiplier=1, jumbo_mlp_dim=hidden
    )
    plain = ViTBlock(num_heads=2, mlp_dim=hidden)
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


def shared_lora_encoder(depth=2, last_block_patch_mlp=True):
    blocks = [
        JumboBlock(
            2,
            16,
            2,
            share_jumbo_mlp=True,
            jumbo_lora_rank=3,
            use_patch_mlp=last_block_patch_mlp or i < depth - 1,
            drop_path_rate=0.1 * i,
            name=f"block_{i}",
        )
        for i in range(depth)
    ]
    return TransformerEncoder(
        blocks, shared_jumbo_mlp=MLP(20, name="shared_jumbo_mlp")
    )


def test_shared_jumbo_mlp_with_lora_matches_reference(rng):
    encoder = shared_lora_encoder()
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
    assert all(block.jumbo_mlp is None for block in encoder.blocks)


def test_encoder_layer_checks():
    # Round trips through get_config/from_config (blocks and shared FFN
    # serialised), saving and every backend's harness.
    config = shared_lora_encoder(last_block_patch_mlp=False).get_config()
    run_layer_test(
        TransformerEncoder,
        {key: config[key] for key in ("blocks", "shared_jumbo_mlp")},
        input_shape=(2, 6, 8),
        # per block: norm1, attn (4), norm3 (2), lora (2) = 10, norm2 and
        # mlp (6) only in block 0; shared Jumbo FFN 4.
        expected_output_shape=(2, 6, 8),
        expected_num_trainable_weights=2 * 10 + 6 + 4,
        # The blocks keep their own dtype policy (as keras wrappers do);
        # each block passes the mixed-precision check on its own.
        run_mixed_precision_check=False,
    )


def test_encoder_of_plain_blocks_is_the_blocks_in_order(rng):
    blocks = [ViTBlock(2, 16, name=f"block_{i}") for i in range(3)]
    encoder = TransformerEncoder(blocks)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    encoder(x)
    randomize_weights(encoder)
    expected = x.astype("float64")
    for block in blocks:
        expected = reference_plain_block(expected, block)
    assert_allclose(encoder(x), expected, atol=1e-4)
    assert encoder.depth == 3


@pytest.mark.parametrize("kind", ["jumbo", "patchtst"])
@pytest.mark.parametrize(
    "batch, slices",
    [
        (3, 2),  # two halves: 2 + 1
        (8, 4),  # a loop over two pairs of 2 + 2
        (7, 4),  # a loop over one pair of 2 + 2, the rest 3 as 2 + 1
        (9, 6),  # a loop over two pairs of 2 + 2, the rest 1 as one slice
    ],
)
def test_encoder_micro_batches_are_the_whole_batch(
    rng, monkeypatch, kind, batch, slices
):
    # Every backend: the slices through the blocks, concatenated, are the
    # whole batch through the blocks; PatchTST's residual scores are
    # carried within each slice. A slice holds at most 2 samples' numbers
    # (2 x 6 x 8), so from 5 samples on the batch is cut into an even
    # number of slices run a pair at a time (`keras.ops.map`). (PatchTST's
    # encoder also counts its attention maps: one sample a slice, in the
    # same loop.)
    micro_batching_here(monkeypatch, min_tokens=3, max_elements=2 * 6 * 8)
    if kind == "jumbo":
        encoder = shared_lora_encoder()
    else:
        encoder = TransformerEncoder(
            [PatchTSTEncoderBlock(2, 16, name=f"block_{i}") for i in range(2)]
        )
    x = rng.normal(size=(batch, 6, 8)).astype("float32")
    encoder(x)
    randomize_weights(encoder)
    assert _micro_batch.micro_batches(x.shape, training=False) == slices
    whole = encoder._run_blocks(x, training=False)
    assert_allclose(encoder(x, training=False), whole, atol=2e-5)
    assert_allclose(encoder(x), whole, atol=2e-5)


def test_patchtst_encoder_slices_count_the_attention_maps(rng, monkeypatch):
    # PatchTST's blocks keep every head's attention map beside the tokens:
    # 4 samples of 6 x 8 numbers and 2 maps of 6 x 6 (120 a sample), at
    # most 96 numbers a slice -> 4 slices of one sample; a ViT encoder of
    # the same input counts tokens alone -> 2 slices of 2. The output is
    # the whole batch through the blocks.
    micro_batching_here(monkeypatch, min_tokens=3, max_elements=96)
    counts, count = [], _micro_batch.micro_batches

    def spy(*args):
        counts.append(count(*args))
        return counts[-1]

    monkeypatch.setattr(_micro_batch, "micro_batches", spy)
    x = rng.normal(size=(4, 6, 8)).astype("float32")
    for block, slices in ((PatchTSTEncoderBlock, 4), (ViTBlock, 2)):
        encoder = TransformerEncoder(
            [block(2, 16, name=f"block_{i}") for i in range(2)]
        )
        encoder(x)
        randomize_weights(encoder)
        counts.clear()
        output = encoder(x, training=False)
        assert counts[0] == slices
        whole = encoder._run_blocks(x, training=False)
        assert_allclose(output, whole, atol=2e-5)


def _rows_seen_by(layer, monkeypatch):
    """The batch sizes of `layer`'s calls from now on."""
    rows, call = [], layer.call

    def spy(inputs, *args, **kwargs):
        rows.append(int(inputs.shape[0]))
        return call(inputs, *args, **kwargs)

    monkeypatch.setattr(layer, "call", spy)
    return rows


@pytest.mark.parametrize("use_patch_mlp", [True, False])
@pytest.mark.parametrize("use_jumbo_mlp", [True, False])
def test_jumbo_block_on_slices_is_the_block_on_each_slice(
    rng, monkeypatch, use_patch_mlp, use_jumbo_mlp
):
    # The Jumbo FFN runs once on every slice's Jumbo token (6 rows), and
    # each slice's output is the block on that slice (against the numpy
    # formula): uneven slices, randomised norms.
    block = JumboBlock(
        2,
        16,
        2,
        jumbo_mlp_dim=24,
        use_patch_mlp=use_patch_mlp,
        use_jumbo_mlp=use_jumbo_mlp,
    )
    x = rng.normal(size=(6, 2 + 4, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    if use_jumbo_mlp:
        rows = _rows_seen_by(block.jumbo_mlp, monkeypatch)
    slices = [x[:3], x[3:4], x[4:]]
    outputs = block.call_on_slices(
        [keras.ops.convert_to_tensor(piece) for piece in slices],
        training=False,
    )
    assert len(outputs) == 3
    for piece, output in zip(slices, outputs, strict=True):
        assert_allclose(output, reference_jumbo_block(piece, block), atol=1e-4)
    if use_jumbo_mlp:
        assert rows == [6]
    assert_allclose(block(x), keras.ops.concatenate(outputs, axis=0), atol=2e-6)


def test_encoder_slices_share_one_jumbo_ffn_call(rng, monkeypatch):
    # Two halves (2 + 1): in each block the shared Jumbo FFN sees the
    # whole batch's 3 Jumbo rows at once; the output is the whole batch
    # through the blocks.
    micro_batching_here(monkeypatch, min_tokens=3)
    encoder = shared_lora_encoder()
    x = rng.normal(size=(3, 6, 8)).astype("float32")
    encoder(x)
    randomize_weights(encoder)
    assert _micro_batch.micro_batches(x.shape, training=False) == 2
    whole = encoder._run_blocks(x, training=False)
    rows = _rows_seen_by(encoder.shared_jumbo_mlp, monkeypatch)
    assert_allclose(encoder(x, training=False), whole, atol=2e-5)
    assert rows == [3, 3]


def test_micro_batches_only_for_large_inference_on_jax(monkeypatch):
    count = _micro_batch.micro_batches
    on = keras.backend.backend() in _micro_batch.MICRO_BATCH_INFERENCE_BACKENDS
    # 64 x 70 tokens: two slices of 2240 >= 2048 (pico, batch 64).
    assert count((64, 70, 96), False) == (2 if on else 1)
    # Registers nano at batch 64: two halves of 2592 x 128 numbers
    # (<= 3 * 2**17); at batch 128, 4 slices; ViT-Tiny (197 x 192) at
    # batch 64, 8 slices of 8.
    assert count((64, 81, 128), False) == (2 if on else 1)
    assert count((128, 81, 128), False) == (4 if on else 1)
    assert count((64, 197, 192), False) == (8 if on else 1)
    assert count((64, 70, 96), True) == 1
    assert count((32, 70, 96), False) == 1
    assert count((None, 70, 96), False) == 1
    micro_batching_here(monkeypatch, min_tokens=1)
    assert count((1, 70, 96), False) == 1
    assert count((3, 70, 96), None) == 2
    # No more than one slice a sample.
    micro_batching_here(monkeypatch, min_tokens=1, max_elements=1)
    assert count((3, 70, 96), None) == 3
    # math.inf: two halves at most.
    micro_batching_here(monkeypatch, min_tokens=1, max_elements=math.inf)
    assert count((128, 81, 128), False) == 2


def test_drop_path_changes_training_output_only(rng):
    block = ViTBlock(num_heads=2, mlp_dim=8, drop_path_rate=0.5)
    x = rng.normal(size=(64, 3, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    assert_allclose(block(x), reference_plain_block(x, block), atol=1e-4)
    trained = keras.ops.convert_to_numpy(block(x, training=True))
    assert not np.allclose(trained, reference_plain_block(x, block), atol=1e-3)


def test_block_errors():
    with pytest.raises(ValueError, match="num_heads"):
        ViTBlock(num_heads=3, mlp_dim=8).build((1, 4, 8))
    with pytest.raises(ValueError, match="jumbo_multiplier"):
        JumboBlock(2, 8, jumbo_multiplier=0, jumbo_mlp_dim=8)
    with pytest.raises(ValueError, match="jumbo_mlp_dim"):
        JumboBlock(2, 8, jumbo_multiplier=2)
    with pytest.raises(ValueError, match="drop_path_rate"):
        ViTBlock(2, 8, drop_path_rate=1.0)
    with pytest.raises(ValueError, match="dropout_rate"):
        JumboBlock(2, 8, 2, jumbo_mlp_dim=8, dropout_rate=-0.1)
    with pytest.raises(ValueError, match="layer_norm_epsilon=-1"):
        ViTBlock(2, 8, layer_norm_epsilon=-1)
    with pytest.raises(TypeError, match="qkv_bias"):
        ViTBlock(2, 8, qkv_bias="yes")
    with pytest.raises(ValueError, match="share_jumbo_mlp"):
        JumboBlock(2, 8, jumbo_multiplier=2, jumbo_mlp_dim=8, jumbo_lora_rank=2)
    with pytest.raises(ValueError, match="at least"):
        JumboBlock(2, 8, jumbo_multiplier=4, jumbo_mlp_dim=8).build((1, 3, 8))
    shared = JumboBlock(2, 8, jumbo_multiplier=1, share_jumbo_mlp=True)
    with pytest.raises(ValueError, match="shared_jumbo_mlp"):
        shared(np.zeros((1, 3, 8), "float32"))
    with pytest.raises(ValueError, match="normalization"):
        PatchTSTEncoderBlock(2, 8, normalization="masked_layer_norm")
    single = PatchTSTEncoderBlock(2, 8, residual_attention=False)
    with pytest.raises(ValueError, match="attention_scores"):
        single(np.zeros((1, 3, 8)), attention_scores=np.zeros((1, 2, 3, 3)))


def test_encoder_errors():
    with pytest.raises(TypeError, match="blocks"):
        TransformerEncoder([])
    with pytest.raises(TypeError, match="Dense"):
        TransformerEncoder([keras.layers.Dense(8)])
    with pytest.raises(ValueError, match="shared_jumbo_mlp=None"):
        TransformerEncoder([JumboBlock(2, 8, 1, share_jumbo_mlp=True)])
    with pytest.raises(ValueError, match="never be used"):
        TransformerEncoder([ViTBlock(2, 8)], shared_jumbo_mlp=MLP(8))
