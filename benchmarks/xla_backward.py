"""How much a JAX gradient costs over its forward pass on this CPU.

A training step whose time is in its matmuls costs about 3x its forward
pass (the forward, then one matmul for the input gradient and one for the
weight gradient per forward matmul). On XLA:CPU it costs much more, and
this script prints, measured in one run, where that comes from:

1. a chain of plain matmuls (12 x (x @ W1) @ W2, pico's shapes: 2272 rows,
   96 <-> 384): forward, gradient w.r.t. the input only, and w.r.t. the
   weights. The input-gradient matmuls cost what the forward ones do; the
   weight-gradient ones cost more than twice as much inside the graph as
   the same matmul timed alone (printed too);
2. a minimal hand-written JAX ViT of pico's shape (12 blocks, width 96,
   3 heads, 71 tokens, batch 32): gradient / forward;
3. keras_jumbo's `convert.official_jumbo_model("pico")` (the
   `vs_official.py` model, 128 px, batch 32): gradient of the loss /
   forward.

    KERAS_BACKEND=jax python benchmarks/xla_backward.py [--rounds 5]

JAX only. Results and what they say: `benchmarks/README.md`.
"""

import argparse
import os
import time

os.environ.setdefault("KERAS_BACKEND", "jax")

BATCH, TOKENS, WIDTH, HIDDEN, DEPTH, HEADS = 32, 71, 96, 384, 12, 3


def best_ms(function, args, rounds, calls=5):
    import jax

    jax.block_until_ready(function(*args))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            out = function(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls * 1e3)
    return min(times)


def matmul_chain(rounds):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    rows = BATCH * TOKENS

    def normal(*shape):
        return jnp.asarray(0.05 * rng.normal(size=shape), "float32")

    weights = [(normal(WIDTH, HIDDEN), normal(HIDDEN, WIDTH))] * DEPTH
    x = normal(rows, WIDTH)

    def chain(weights, x):
        for w1, w2 in weights:
            x = (x @ w1) @ w2
        return x

    def loss(weights, x):
        return jnp.mean(chain(weights, x) ** 2)

    forward = best_ms(jax.jit(chain), (weights, x), rounds)
    wrt_input = best_ms(jax.jit(jax.grad(loss, 1)), (weights, x), rounds)
    wrt_weights = best_ms(jax.jit(jax.grad(loss, 0)), (weights, x), rounds)
    g = normal(rows, HIDDEN)
    alone = best_ms(
        jax.jit(lambda x, g: x.T @ g), (x, g), rounds, calls=20
    ) + best_ms(jax.jit(lambda h, g: h.T @ g), (g, x), rounds, calls=20)
    matmuls = 2 * DEPTH
    print(
        f"matmul chain ({matmuls} matmuls, {rows} rows): forward "
        f"{forward:.1f} ms; gradient w.r.t. input {wrt_input:.1f} ms "
        f"({wrt_input / forward:.2f}x forward); w.r.t. weights "
        f"{wrt_weights:.1f} ms ({wrt_weights / forward:.2f}x; a matmul-bound "
        "gradient is 3x)"
    )
    in_graph = (wrt_weights - wrt_input) / matmuls
    print(
        f"  one weight-gradient matmul: {in_graph:.2f} ms in the graph vs "
        f"{alone / 2:.2f} ms alone ({in_graph / (alone / 2):.1f}x)"
    )
    return wrt_weights / forward


def minimal_vit(rounds):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    head_dim = WIDTH // HEADS

    def normal(*shape, mean=0.0):
        return jnp.asarray(mean + 0.05 * rng.normal(size=shape), "float32")

    blocks = [
        {
            "g1": normal(WIDTH, mean=1.0),
            "b1": normal(WIDTH),
            "qkv": normal(WIDTH, 3 * WIDTH),
            "qkv_b": normal(3 * WIDTH),
            "out": normal(WIDTH, WIDTH),
            "out_b": normal(WIDTH),
            "g2": normal(WIDTH, mean=1.0),
            "b2": normal(WIDTH),
            "fc1": normal(WIDTH, HIDDEN),
            "fc1_b": normal(HIDDEN),
            "fc2": normal(HIDDEN, WIDTH),
            "fc2_b": normal(WIDTH),
        }
        for _ in range(DEPTH)
    ]
    x = normal(BATCH, TOKENS, WIDTH)

    def norm(x, gamma, beta):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(var + 1e-6) * gamma + beta

    def attention(x, p):
        qkv = x @ p["qkv"] + p["qkv_b"]
        qkv = qkv.reshape(BATCH, TOKENS, 3, HEADS, head_dim)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q * head_dim**-0.5, k)
        out = jnp.einsum("bhqk,bhkd->bqhd", jax.nn.softmax(scores), v)
        return out.reshape(BATCH, TOKENS, WIDTH) @ p["out"] + p["out_b"]

    def vit(blocks, x):
        for p in blocks:
            x = x + attention(norm(x, p["g1"], p["b1"]), p)
            h = norm(x, p["g2"], p["b2"]) @ p["fc1"] + p["fc1_b"]
            x = x + jax.nn.gelu(h, approximate=False) @ p["fc2"] + p["fc2_b"]
        return x

    def loss(blocks, x):
        return jnp.mean(vit(blocks, x) ** 2)

    forward = best_ms(jax.jit(vit), (blocks, x), rounds)
    gradient = best_ms(jax.jit(jax.grad(loss)), (blocks, x), rounds)
    print(
        f"minimal JAX ViT (pico shape): forward {forward:.1f} ms, gradient "
        f"{gradient:.1f} ms ({gradient / forward:.2f}x)"
    )
    return gradient / forward


def library_model(rounds):
    import jax
    import keras
    import numpy as np

    from keras_jumbo import convert

    model = convert.official_jumbo_model("pico", image_size=128)
    trainable = [v.value for v in model.trainable_variables]
    fixed = [v.value for v in model.non_trainable_variables]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, 128, 128, 3)).astype("float32")
    y = rng.integers(0, 1000, BATCH)

    def forward(trainable, x):
        return model.stateless_call(trainable, fixed, x, training=True)[0]

    def loss(trainable, x):
        logits = forward(trainable, x)
        return keras.ops.mean(
            keras.losses.sparse_categorical_crossentropy(
                y, logits, from_logits=True
            )
        )

    forward_ms = best_ms(jax.jit(forward), (trainable, x), rounds)
    gradient_ms = best_ms(jax.jit(jax.grad(loss)), (trainable, x), rounds)
    print(
        f"keras_jumbo official_jumbo_model('pico'), 128 px: forward "
        f"{forward_ms:.1f} ms, gradient {gradient_ms:.1f} ms "
        f"({gradient_ms / forward_ms:.2f}x)"
    )
    return gradient_ms / forward_ms


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import keras

    if keras.backend.backend() != "jax":
        raise SystemExit("xla_backward.py measures JAX: KERAS_BACKEND=jax")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1. Received: {args.rounds}")
    print(f"{os.cpu_count()} CPU cores, batch {BATCH}, best of {args.rounds}")
    matmul_chain(args.rounds)
    minimal = minimal_vit(args.rounds)
    library = library_model(args.rounds)
    print(
        f"gradient / forward: keras_jumbo {library:.2f}x vs minimal JAX ViT "
        f"{minimal:.2f}x (matmul-bound: 3x)"
    )


if __name__ == "__main__":
    main()
