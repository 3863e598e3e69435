"""Attention formulations side by side in one run (JAX, jit, forward).

Why `MultiHeadSelfAttention` and `BlockwiseMHSA` are written as they are
(issue #15): on a CPU the layout of the activations, not the arithmetic,
dominated. Prints ms per call and ratios for

- one 12-head attention layer: q/k/v sliced from the fused projection and
  `jax.nn.dot_product_attention` (what `keras.ops.dot_product_attention`
  runs), the same with einsums on (batch, length, heads, dim), the
  heads-first einsums the library trains with, and the library layer
  itself in both modes: at inference (each head on column slices of one
  q/k/v matmul on JAX) and in training (the einsums);
- two-branch joined attention (Non-Deep ViT): 5-D einsums over (branch,
  head) with the join applied to the score tensors, the branch-by-branch
  form with the joined scores as one matmul of λ-weighted queries with all
  keys (what `BlockwiseMHSA` does now), and the library layer itself.

    python benchmarks/attention_layouts.py [--batch 16 --tokens 197]
"""

import argparse
import os

os.environ["KERAS_BACKEND"] = "jax"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _rounds import median_ms  # noqa: E402

from keras_jumbo.layers import BlockwiseMHSA  # noqa: E402
from keras_jumbo.layers import MultiHeadSelfAttention  # noqa: E402


def layer_fn(layer, x, training=False):
    """The layer's forward pass, jitted; `training=True` is the form a
    training step differentiates (the einsums), `False` the inference
    form (head by head on JAX)."""
    layer(x)
    trainable = [v.value for v in layer.trainable_variables]
    other = [v.value for v in layer.non_trainable_variables]

    def forward(v):
        return layer.stateless_call(trainable, other, v, training=training)[0]

    return jax.jit(forward)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=197)
    parser.add_argument("--width", type=int, default=192)
    parser.add_argument("--heads", type=int, default=12)
    args = parser.parse_args(argv)
    b, s, d, h = args.batch, args.tokens, args.width, args.heads
    k = d // h
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(b, s, d)), jnp.float32)
    w_qkv = jnp.asarray(rng.normal(size=(d, 3 * d)) * 0.05, jnp.float32)
    w_out = jnp.asarray(rng.normal(size=(d, d)) * 0.05, jnp.float32)

    def split(x):
        qkv = x @ w_qkv
        return [
            qkv[..., i * d : (i + 1) * d].reshape(b, s, h, k) for i in (0, 1, 2)
        ]

    @jax.jit
    def sliced_dpa(x):
        q, key, v = split(x)
        return jax.nn.dot_product_attention(q, key, v).reshape(b, s, d) @ w_out

    @jax.jit
    def sliced_einsum(x):
        q, key, v = split(x)
        p = jax.nn.softmax(
            jnp.einsum("bqhd,bkhd->bhqk", q / np.sqrt(k), key), -1
        )
        return jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, d) @ w_out

    @jax.jit
    def heads_first(x):
        w = w_qkv.reshape(d, 3, h, k)
        q, key, v = (jnp.einsum("bsd,dhk->bhsk", x, w[:, i]) for i in (0, 1, 2))
        p = jax.nn.softmax(
            jnp.einsum("bhqk,bhsk->bhqs", q / np.sqrt(k), key), -1
        )
        heads = jnp.einsum("bhqs,bhsk->bhqk", p, v)
        return jnp.einsum("bhqk,hkd->bqd", heads, w_out.reshape(h, k, d))

    one = {
        "sliced + dot_product_attention": median_ms(sliced_dpa, x),
        "sliced + einsums": median_ms(sliced_einsum, x),
        "heads-first einsums": median_ms(heads_first, x),
        "MultiHeadSelfAttention (library, inference)": median_ms(
            layer_fn(MultiHeadSelfAttention(h), x), x
        ),
        "MultiHeadSelfAttention (library, training)": median_ms(
            layer_fn(MultiHeadSelfAttention(h), x, training=True), x
        ),
    }
    assert np.allclose(sliced_dpa(x), heads_first(x), atol=1e-4)

    n = 2
    w = [
        jnp.asarray(rng.normal(size=(n, d, h, k)) * 0.05, jnp.float32)
        for _ in range(3)
    ]
    wo = jnp.asarray(rng.normal(size=(n, h, k, d)) * 0.05, jnp.float32)
    lam = jnp.float32(0.3)
    scale = 1.0 / np.sqrt((1 + (n - 1) * 0.09) * k)

    @jax.jit
    def five_d(x):
        q, key, v = (jnp.einsum("bsd,ndhk->bsnhk", x, wi) for wi in w)
        scores = jnp.einsum("bqnhk,bsnhk->bnhqs", q, key)
        scores = (1 - lam) * scores + lam * scores.sum(1, keepdims=True)
        v = (1 - lam) * v + lam * v.sum(2, keepdims=True)
        p = jax.nn.softmax(scores * scale, -1)
        heads = jnp.einsum("bnhqs,bsnhk->bqnhk", p, v)
        return jnp.einsum("bqnhk,nhkd->bqnd", heads, wo).sum(2)

    @jax.jit
    def by_branch(x):
        wv = (1 - lam) * w[2] + lam * w[2].sum(0, keepdims=True)
        qs = [jnp.einsum("bsd,dhk->bhsk", x, w[0][i]) for i in range(n)]
        keys = jnp.concatenate(
            [jnp.einsum("bsd,dhk->bhsk", x, w[1][i]) for i in range(n)], -1
        )
        out = 0.0
        for i in range(n):
            mixed = jnp.concatenate(
                [q if j == i else lam * q for j, q in enumerate(qs)], -1
            )
            p = jax.nn.softmax(
                jnp.einsum("bhqc,bhsc->bhqs", mixed, keys) * scale, -1
            )
            v = jnp.einsum("bsd,dhk->bhsk", x, wv[i])
            heads = jnp.einsum("bhqs,bhsk->bhqk", p, v)
            out = out + jnp.einsum("bhqk,hkd->bqd", heads, wo[i])
        return out

    two = {
        "5-D einsums, join on score tensors": median_ms(five_d, x),
        "branch by branch, joined scores as one matmul": median_ms(
            by_branch, x
        ),
        "BlockwiseMHSA n=2 (library)": median_ms(
            layer_fn(BlockwiseMHSA(h, num_branches=n), x), x
        ),
    }
    assert np.allclose(five_d(x), by_branch(x), atol=1e-4)

    for title, rows, base in (
        (
            f"one attention layer, {h} heads",
            one,
            "sliced + dot_product_attention",
        ),
        (
            "two-branch joined attention",
            two,
            "5-D einsums, join on score tensors",
        ),
    ):
        print(f"{title} (batch {b}, {s} tokens, width {d}):")
        for name, ms in rows.items():
            print(f"  {name:<48} {ms:7.1f} ms  {rows[base] / ms:5.2f}x")


if __name__ == "__main__":
    main()
