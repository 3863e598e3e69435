import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_jumbo.layers import BlockwiseMHSA
from keras_jumbo.layers import ParallelBranchBlock
from keras_jumbo.layers import ProgressiveJoin
from keras_jumbo.layers import _micro_batch
from keras_jumbo.layers import blockwise_mhsa
from keras_jumbo.layers.blockwise_mhsa import pairwise_cosine_squared
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.layers import reference
from tests.layers.micro_batching import micro_batching_here
from tests.layers.reference import value


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def reference_branch_attention(x, layer, lam, return_maps=False):
    """Non-Deep ViT eq. 4-7 / Algorithm 1 for n branches, values joined.

    With `return_maps`, also the attention maps averaged over branches."""
    n, h = layer.num_branches, layer.num_heads
    wq, wk, wv = (
        value(k)
        for k in (layer.query_kernel, layer.key_kernel, layer.value_kernel)
    )
    bq, bk, bv = (
        value(b) for b in (layer.query_bias, layer.key_bias, layer.value_bias)
    )
    wo, bo = value(layer.output_kernel), value(layer.output_bias)
    dk = wq.shape[-1]
    scores, values = [], []
    for b in range(n):
        q = np.einsum("sd,dhk->hsk", x, wq[b]) + bq[b][:, None]
        k = np.einsum("sd,dhk->hsk", x, wk[b]) + bk[b][:, None]
        scores.append(np.einsum("hqk,hsk->hqs", q, k))  # X W_b X^T per head
        values.append(np.einsum("sd,dhk->hsk", x, wv[b]) + bv[b][:, None])
    out = maps = 0
    for b in range(n):
        others = sum(scores[c] for c in range(n) if c != b)
        joined = (scores[b] + lam * others) / (
            math.sqrt(1 + (n - 1) * lam**2) * math.sqrt(dk)
        )
        v = values[b] + lam * sum(values[c] for c in range(n) if c != b)
        heads = np.einsum("hqs,hsk->hqk", softmax(joined), v)
        out = out + sum(heads[i] @ wo[b, i] for i in range(h)) + bo[b]
        maps = maps + softmax(joined) / n
    return (out, maps) if return_maps else out


def test_progressive_join_numbers():
    join = ProgressiveJoin(3, initial_lambda=0.25, branch_axis=0)
    z = np.array([[1.0], [2.0], [4.0]], "float32")
    # z_b + λ Σ_{b'≠b} z_b'
    expected = [[1 + 0.25 * 6], [2 + 0.25 * 5], [4 + 0.25 * 3]]
    assert_allclose(join(z), expected, atol=1e-6)
    join.join_lambda.assign(1.0)
    assert_allclose(join(z), [[7.0], [7.0], [7.0]], atol=1e-6)
    assert float(join.score_scale(4)) == pytest.approx(1 / math.sqrt(12))
    with pytest.raises(ValueError, match="initial_lambda"):
        ProgressiveJoin(2, initial_lambda=1.5)


def test_blockwise_mhsa_layer_checks():
    run_layer_test(
        BlockwiseMHSA,
        {"num_heads": 2, "num_branches": 2, "initial_lambda": 0.5},
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=8,
        expected_num_non_trainable_weights=1,
    )


def test_blockwise_mhsa_equals_keras_multi_head_attention(rng):
    d, heads = 12, 3
    ours = BlockwiseMHSA(num_heads=heads)
    x = rng.normal(size=(2, 6, d)).astype("float32")
    ours(x)
    randomize_weights(ours)
    core = keras.layers.MultiHeadAttention(num_heads=heads, key_dim=d // heads)
    core(x, x)
    core._query_dense.set_weights(
        [value(ours.query_kernel)[0], value(ours.query_bias)[0]]
    )
    core._key_dense.set_weights(
        [value(ours.key_kernel)[0], value(ours.key_bias)[0]]
    )
    core._value_dense.set_weights(
        [value(ours.value_kernel)[0], value(ours.value_bias)[0]]
    )
    core._output_dense.set_weights(
        [value(ours.output_kernel)[0], value(ours.output_bias)[0]]
    )
    assert_allclose(ours(x), core(x, x), atol=1e-5)


@pytest.mark.parametrize("n,lam", [(2, 0.0), (2, 0.3), (3, 0.7), (2, 1.0)])
def test_branch_attention_matches_the_papers_formulas(rng, n, lam):
    layer = BlockwiseMHSA(num_heads=2, num_branches=n, initial_lambda=lam)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    layer(x)
    randomize_weights(layer)
    layer.join.join_lambda.assign(lam)
    expected = np.stack(
        [
            reference_branch_attention(x[i].astype("float64"), layer, lam)
            for i in range(2)
        ]
    )
    assert_allclose(layer(x), expected, atol=1e-4)
    maps = np.stack(
        [
            reference_branch_attention(
                x[i].astype("float64"), layer, lam, return_maps=True
            )[1]
            for i in range(2)
        ]
    )
    # The branch-averaged maps (attention-map distillation, §4).
    assert_allclose(layer.attention_probabilities(x), maps, atol=1e-5)


class _EinsumOnly(BlockwiseMHSA):
    def _uses_linear_projections(self):
        return False


def test_blockwise_mhsa_linear_projections_where_its_backend_uses_them():
    layer = BlockwiseMHSA(num_heads=2)
    on_torch = keras.backend.backend() == "torch"
    assert blockwise_mhsa.LINEAR_PROJECTION_BACKENDS == ("torch",)
    assert layer._uses_linear_projections() == on_torch
    assert not _EinsumOnly(num_heads=2)._uses_linear_projections()


@pytest.mark.parametrize("n,lam", [(1, 0.0), (3, 0.4)])
def test_blockwise_mhsa_training_step_equals_the_einsums(rng, n, lam):
    # One SGD step (a Dense before the layer, so the input gradient counts
    # too) through the layer as each backend runs it (PyTorch: the q/k/v
    # and output projections as 2-D `linear` products) against the
    # per-head einsums: the same outputs and weights after; every
    # trainable weight moved but the key bias, whose gradient is zero (it
    # adds the same q·b to every score of a query's row).
    kwargs = {"num_heads": 2, "num_branches": n, "initial_lambda": lam}
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    target = rng.normal(size=(2, 5, 8)).astype("float32")
    ours, stock = BlockwiseMHSA(**kwargs), _EinsumOnly(**kwargs)
    ours.build(x.shape)
    randomize_weights(ours)
    stock.build(x.shape)
    stock.set_weights(ours.get_weights())
    assert_allclose(ours(x), stock(x), atol=1e-5)
    before = [np.asarray(w) for w in ours.get_weights()]
    got = reference.weights_after_one_sgd_step(ours, x, target)
    want = reference.weights_after_one_sgd_step(stock, x, target)
    for g, w in zip(got, want, strict=True):
        assert_allclose(g, w, atol=1e-5, rtol=1e-4)
    trainable = [
        np.abs(np.asarray(a) - b).max()
        for a, b, weight in zip(got[2:], before, ours.weights, strict=True)
        if weight.trainable and weight is not ours.key_bias
    ]
    assert len(trainable) == 7 and min(trainable) > 1e-4


def test_parallel_branch_block_layer_checks():
    run_layer_test(
        ParallelBranchBlock,
        {
            "num_heads": 2,
            "mlp_dim": 16,
            "num_branches": 3,
            "diversity_weight": 0.1,
            "drop_path_rate": 0.1,
        },
        input_shape=(2, 5, 8),
        expected_output_shape=(2, 5, 8),
        # norms 4, attention 8, FFN 4; λ of attention and FFN.
        expected_num_trainable_weights=16,
        expected_num_non_trainable_weights=2,
    )


def test_parallel_branch_block_matches_reference(rng):
    n, lam = 2, 0.4
    block = ParallelBranchBlock(num_heads=2, mlp_dim=12, num_branches=n)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    for join in (block.attention.join, block.mlp_join):
        join.join_lambda.assign(lam)
    x64 = x.astype("float64")
    h = reference.norm(x64, block.norm1)
    x1 = x64 + np.stack(
        [
            reference_branch_attention(h[i], block.attention, lam)
            for i in range(2)
        ]
    )
    h2 = reference.norm(x1, block.norm2)
    w1, b1 = value(block.fc1_kernel), value(block.fc1_bias)
    w2, b2 = value(block.fc2_kernel), value(block.fc2_bias)
    pre = [h2 @ w1[b] + b1[b] for b in range(n)]
    out = 0
    for b in range(n):
        joined = pre[b] + lam * sum(pre[c] for c in range(n) if c != b)
        out = out + reference.gelu(joined) @ w2[b] + b2[b]
    assert_allclose(block(x), x1 + out, atol=1e-4)


@pytest.mark.parametrize("batch", [3, 7])
def test_parallel_branch_block_on_slices_is_the_whole_batch(
    rng, monkeypatch, batch
):
    # Every backend: at inference a large batch runs on slices (here from
    # 2 x 5 tokens, at most 2 samples a slice: 2 + 1, and for 7 a loop over
    # one pair of 2 + 2, the rest 2 + 1), the same numbers as the whole.
    micro_batching_here(monkeypatch, min_tokens=5, max_elements=2 * 5 * 8)
    block = ParallelBranchBlock(num_heads=2, mlp_dim=12, num_branches=3)
    x = rng.normal(size=(batch, 5, 8)).astype("float32")
    block(x)
    randomize_weights(block)
    for join in (block.attention.join, block.mlp_join):
        join.join_lambda.assign(0.3)
    assert _micro_batch.micro_batches(x.shape, False) == (
        2 if batch == 3 else 4
    )
    whole = block._forward(ops.convert_to_tensor(x), training=False)
    assert_allclose(block(x, training=False), whole, atol=2e-5)
    assert_allclose(block(x), whole, atol=2e-5)


def test_diversity_loss_is_mean_squared_pairwise_cosine(rng):
    f = rng.normal(size=(2, 4, 3, 6)).astype("float32")  # (..., n=3, D)
    unit = f / np.linalg.norm(f, axis=-1, keepdims=True)
    pairs = [(0, 1), (0, 2), (1, 2)]
    expected = np.mean(
        [
            np.mean(np.sum(unit[..., i, :] * unit[..., j, :], -1) ** 2)
            for i, j in pairs
        ]
    )
    assert float(pairwise_cosine_squared(f)) == pytest.approx(expected, 1e-5)
    # the layers pass the branch outputs as a list (no stacked tensor)
    as_list = [f[..., i, :] for i in range(3)]
    assert float(pairwise_cosine_squared(as_list)) == pytest.approx(
        expected, 1e-5
    )
    block = ParallelBranchBlock(2, 8, num_branches=2, diversity_weight=0.2)
    x = ops.convert_to_tensor(rng.normal(size=(1, 3, 8)).astype("float32"))
    block(x)
    randomize_weights(block)
    inference = block(x)
    assert len(block.losses) == 0  # a training objective only
    trained = block(x, training=True)
    assert len(block.losses) == 2  # attention and FFN terms
    # the terms are the formula on the branch outputs, times the weights
    attention_branches = block.attention.branch_outputs(block.norm1(x))
    x1 = x + ops.sum(attention_branches, axis=2)
    ffn_branches = block.mlp_branch_outputs(block.norm2(x1))
    expected = [
        0.1 * float(pairwise_cosine_squared(branches))
        for branches in (attention_branches, ffn_branches)
    ]
    assert sorted(float(loss) for loss in block.losses) == pytest.approx(
        sorted(expected), 1e-4
    )
    assert all(float(loss) >= 0 for loss in block.losses)
    # both paths compute the same block output
    assert_allclose(trained, inference, atol=1e-5)


def test_non_deep_layer_errors():
    with pytest.raises(ValueError, match="num_branches"):
        BlockwiseMHSA(2, num_branches=0)
    with pytest.raises(ValueError, match="num_heads"):
        BlockwiseMHSA(3).build((1, 4, 8))
    with pytest.raises(ValueError, match="diversity_weight"):
        BlockwiseMHSA(2, diversity_weight=-1.0)
    with pytest.raises(ValueError, match="mlp_dim"):
        ParallelBranchBlock(2, 0)
