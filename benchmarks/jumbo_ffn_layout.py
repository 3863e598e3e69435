"""The Jumbo FFN's products with the kernels stored (in, out) or (out, in).

keras_jumbo's dense layers are `keras.layers.Dense`: the kernel is stored
`(in, out)` and a layer computes `x @ W`. PyTorch's `nn.Linear` (and the
official Jumbo code) stores `(out, in)` and computes `x @ Wᵀ`. The values
are the same; what differs is the memory order of the weight the matrix
kernel reads, which matters most where the rows are few and the weights
large: the Jumbo FFN, whose rows are the batch's Jumbo tokens (one per
image) and whose weights are `J * D x 4 J * D`.

This script times the Jumbo FFN stack of a JumboViT size alone, in plain
JAX (jitted, XLA:CPU's kernels), in both layouts, with the same weights:
`depth` residual layers `x + fc2(gelu(fc1(LN(x))))` on `(batch, J * D)`
rows, each layer with its own weights (the paper's and `JumboViT`'s
default) or one FFN shared by every layer (the official release,
`share_jumbo_mlp=True`). Per round, interleaved in one process, medians
of `--steps` calls:

- `forward`: the stack at `--batch` rows (inference);
- `gradient`: `jax.value_and_grad` of a random projection of the output
  with respect to the input and every weight, at `--train-batch` rows.

It prints each layout's milliseconds, `(in, out)` / `(out, in)` (above 1:
`(out, in)` faster) and the largest relative difference between the two
layouts' outputs and gradients (the same function: 0 up to float32
round-off).

    KERAS_BACKEND=jax python benchmarks/jumbo_ffn_layout.py [--rounds 5]

A measurement, not a library feature: results and what they say in
`benchmarks/README.md` (forty-eighth session).
"""

import argparse
import os
import statistics

os.environ.setdefault("KERAS_BACKEND", "jax")

from _rounds import largest_relative_difference  # noqa: E402
from _rounds import median_ms  # noqa: E402

LAYOUTS = ("in_out", "out_in")


def ffn_stack(layout, shared, depth):
    """`f(x, weights)`: the Jumbo FFN stack; `weights` is a list of
    `(gamma, beta, w1, b1, w2, b2)`, one per layer (one for all when
    `shared`), kernels in `layout`."""
    import jax
    import jax.numpy as jnp

    def linear(x, kernel, bias):
        return (x @ kernel if layout == "in_out" else x @ kernel.T) + bias

    def f(x, weights):
        for i in range(depth):
            gamma, beta, w1, b1, w2, b2 = weights[0 if shared else i]
            mean = jnp.mean(x, axis=-1, keepdims=True)
            var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
            h = (x - mean) * jax.lax.rsqrt(var + 1e-6) * gamma + beta
            h = jax.nn.gelu(linear(h, w1, b1), approximate=False)
            x = x + linear(h, w2, b2)
        return x

    return f


def make_weights(rng, width, hidden, count):
    """`count` layers of random weights in the `(in, out)` layout."""
    import numpy as np

    def normal(*shape, scale=1.0):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    return [
        (
            1.0 + normal(width, scale=0.1),
            normal(width, scale=0.1),
            normal(width, hidden, scale=width**-0.5),
            normal(hidden, scale=0.1),
            normal(hidden, width, scale=hidden**-0.5),
            normal(width, scale=0.1),
        )
        for _ in range(count)
    ]


def in_layout(weights, layout):
    """The `(in, out)` weights as JAX arrays in `layout`, contiguous: the
    kernels are each layer's entries 2 and 4."""
    import jax.numpy as jnp
    import numpy as np

    def array(index, w):
        if index in (2, 4) and layout == "out_in":
            w = np.ascontiguousarray(w.T)
        return jnp.asarray(w)

    return [tuple(array(i, w) for i, w in enumerate(ws)) for ws in weights]


def as_in_out(grads, layout):
    """Gradients of the `(out, in)` weights transposed back, to compare."""
    if layout == "in_out":
        return grads
    dx, layers = grads
    return dx, [(g, b, w1.T, b1, w2.T, b2) for g, b, w1, b1, w2, b2 in layers]


def measure(size, shared, opts, rng):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from keras_jumbo.models import VIT_SIZES

    config = VIT_SIZES[size]
    width = config["hidden_dim"] * config["jumbo"]
    hidden = int(opts.mlp_ratio * width)
    depth = config["depth"]
    weights = make_weights(rng, width, hidden, 1 if shared else depth)
    x = jnp.asarray(rng.standard_normal((opts.batch, width)).astype(np.float32))
    xt = jnp.asarray(
        rng.standard_normal((opts.train_batch, width)).astype(np.float32)
    )
    probe = jnp.asarray(
        rng.standard_normal((opts.train_batch, width)).astype(np.float32)
    )
    runs = {}
    for layout in LAYOUTS:
        f = ffn_stack(layout, shared, depth)
        params = in_layout(weights, layout)
        forward = jax.jit(f)
        gradient = jax.jit(
            jax.value_and_grad(
                lambda x, w, f=f: jnp.sum(f(x, w) * probe), argnums=(0, 1)
            )
        )
        runs[layout] = {
            "forward": (forward, (x, params)),
            "gradient": (gradient, (xt, params)),
        }
    outputs = {
        layout: (
            run["forward"][0](*run["forward"][1]),
            as_in_out(run["gradient"][0](*run["gradient"][1])[1], layout),
        )
        for layout, run in runs.items()
    }
    difference = largest_relative_difference(*outputs.values())
    times = {(layout, step): [] for layout in LAYOUTS for step in runs[layout]}
    for round_index in range(opts.rounds):
        order = LAYOUTS if round_index % 2 == 0 else LAYOUTS[::-1]
        for layout in order:
            for step, (fn, args) in runs[layout].items():
                ms = median_ms(fn, *args, calls=opts.steps)
                times[(layout, step)].append(ms)
    rows = []
    for step in ("forward", "gradient"):
        a = statistics.median(times[("in_out", step)])
        b = statistics.median(times[("out_in", step)])
        rows.append((step, a, b))
    return width, hidden, depth, rows, difference


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["pico", "nano"])
    parser.add_argument("--batch", type=int, default=64, help="forward rows")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--mlp-ratio", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="calls per round")
    opts = parser.parse_args(argv)
    for name in ("batch", "train_batch", "rounds", "steps"):
        if getattr(opts, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be >= 1; received "
                f"{getattr(opts, name)}"
            )
    if opts.mlp_ratio <= 0:
        parser.error(f"--mlp-ratio must be > 0; received {opts.mlp_ratio}")

    import keras
    import numpy as np

    from keras_jumbo.models import VIT_SIZES

    if keras.backend.backend() != "jax":
        raise SystemExit("jumbo_ffn_layout.py measures JAX: KERAS_BACKEND=jax")
    for size in opts.sizes:
        if size not in VIT_SIZES:
            parser.error(
                f"--sizes: unknown size {size!r}; known: {sorted(VIT_SIZES)}"
            )
    import jax

    print(
        f"jax {jax.__version__}, batch {opts.batch} (forward), "
        f"{opts.train_batch} (gradient), {opts.rounds} rounds of "
        f"{opts.steps} calls, medians"
    )
    print(
        f"{'size':<5} {'weights':<9} {'rows x J*D -> hidden':<22} "
        f"{'step':<9} {'(in,out) ms':>11} {'(out,in) ms':>11} {'ratio':>6}  "
        "relative difference"
    )
    rng = np.random.default_rng(0)
    for size in opts.sizes:
        for shared in (False, True):
            width, hidden, depth, rows, difference = measure(
                size, shared, opts, rng
            )
            for step, a, b in rows:
                batch = opts.batch if step == "forward" else opts.train_batch
                shape = f"{batch} x {width} -> {hidden}"
                print(
                    f"{size:<5} {'shared' if shared else 'per-layer':<9} "
                    f"{shape:<22} {step:<9} {a:>11.3f} {b:>11.3f} "
                    f"{a / b:>6.3f}  {difference:.1e}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
