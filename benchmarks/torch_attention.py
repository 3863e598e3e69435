"""PyTorch's fused attention kernel against two matmuls and a softmax.

Why `keras_jumbo._torch_kernels.dot_product_attention` computes short
sequences as matmuls on a CPU (`SHORT_ATTENTION_LENGTH`, issue #15): for
each `(batch, length, heads, head_dim)` it times, eagerly and in one
process, both forms on strided heads-first views of one fused q/k/v
tensor (as `MultiHeadSelfAttention` passes them), at inference (no
gradient) and forward + backward, and prints the fused kernel's time
over the matmuls' (above 1: the matmuls are faster) and which form the
library picks.

    python benchmarks/torch_attention.py [--threads 2 --rounds 3]
        [--shapes 32,197,3,64 16,257,6,64]
"""

import argparse
import os
import time

os.environ["KERAS_BACKEND"] = "torch"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional  # noqa: E402

from keras_jumbo import _torch_kernels  # noqa: E402

# (batch, length, heads, head_dim): pico at 128 px (64 patches + Jumbo's
# tokens) at the training and inference batch, ViT-Tiny/Small/Base at
# 224 px, 384 px, PatchTST's patches (16 heads of 8), long sequences.
SHAPES = (
    (32, 70, 3, 32),
    (64, 70, 3, 32),
    (32, 65, 3, 64),
    (32, 100, 3, 32),
    (32, 130, 3, 32),
    (32, 130, 6, 64),
    (32, 197, 3, 32),
    (32, 197, 3, 64),
    (32, 197, 6, 64),
    (16, 197, 12, 64),
    (8, 577, 12, 64),
    (224, 42, 16, 8),
    (32, 260, 16, 8),
)


def _views(qkv, heads, head_dim):
    batch, length = qkv.shape[:2]
    qkv = qkv.reshape(batch, length, 3, heads, head_dim)
    return [qkv[:, :, i].transpose(1, 2) for i in range(3)]


def fused(qkv, heads, head_dim):
    q, k, v = _views(qkv, heads, head_dim)
    return functional.scaled_dot_product_attention(
        q, k, v, scale=head_dim**-0.5
    )


def matmuls(qkv, heads, head_dim):
    q, k, v = _views(qkv, heads, head_dim)
    scores = torch.matmul(q * head_dim**-0.5, k.transpose(-1, -2))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def best_ms(form, qkv, upstream, heads, head_dim, train, repeats):
    times = []
    for _ in range(repeats):
        inputs = qkv.clone().requires_grad_(train)
        start = time.perf_counter()
        if train:
            form(inputs, heads, head_dim).backward(upstream)
        else:
            with torch.no_grad():
                form(inputs, heads, head_dim)
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def _shape(text):
    """`"32,197,3,64"` as `(32, 197, 3, 64)`."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(
            "a shape is four positive integers batch,length,heads,head_dim; "
            f"received {text!r}"
        )
    return shape


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=_shape,
        default=SHAPES,
        help="batch,length,heads,head_dim of each attention to time "
        "(default: the built-in list)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    limit = _torch_kernels.SHORT_ATTENTION_LENGTH
    print(
        f"{args.threads} threads; best of {args.rounds} x {args.repeats}; "
        f"the library uses matmuls below {limit} queries (CPU, eager)"
    )
    print(
        "batch length heads head_dim | fused ms  matmuls ms  ratio "
        "(inference) | fused ms  matmuls ms  ratio (fwd+bwd) | library"
    )
    for batch, length, heads, head_dim in args.shapes:
        width = heads * head_dim
        qkv = torch.tensor(
            rng.normal(size=(batch, length, 3 * width)), dtype=torch.float32
        )
        upstream = torch.tensor(
            rng.normal(size=(batch, heads, length, head_dim)),
            dtype=torch.float32,
        )
        expected = fused(qkv, heads, head_dim)
        error = (matmuls(qkv, heads, head_dim) - expected).abs().max()
        if error > 1e-4:
            raise SystemExit(f"forms differ by {float(error)}")
        row = []
        for train in (False, True):
            best = {form: float("inf") for form in (fused, matmuls)}
            for _ in range(args.rounds):
                for form in best:
                    best[form] = min(
                        best[form],
                        best_ms(
                            form, qkv, upstream, heads, head_dim, train,
                            args.repeats,
                        ),
                    )  # fmt: skip
            row.append(
                f"{best[fused]:8.2f}  {best[matmuls]:10.2f}  "
                f"{best[fused] / best[matmuls]:5.2f}"
            )
        chosen = "matmuls" if length < limit else "fused"
        print(
            f"{batch:5d} {length:6d} {heads:5d} {head_dim:8d} | "
            f"{row[0]}             | {row[1]}           | {chosen}",
            flush=True,
        )


if __name__ == "__main__":
    main()
