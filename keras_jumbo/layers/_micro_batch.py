"""Inference on slices of a batch, for layers that act on each sample
alone (`TransformerEncoder`'s chain of blocks, `ParallelBranchBlock`).

On the backends in `MICRO_BATCH_INFERENCE_BACKENDS`, a call at inference
on at least `2 * MIN_MICRO_BATCH_TOKENS` tokens (batch x length) runs on
slices of the batch and concatenates the results: the same numbers (every
sample on its own; tested), and independent chains of work. XLA's CPU
runtime runs the attention's batched products, LayerNorms and slices on
one thread each; two chains let one chain's single-threaded work overlap
the other's two-threaded products. Smaller slices made the predict step
slower (2-core CPU; benchmarks/README.md).

Two halves, or, when a half would hold more than `MAX_MICRO_BATCH_ELEMENTS`
numbers (tokens x width: nano at batch 128, ViT-Tiny at 224 px from batch
32; PatchTST's encoder also counts the attention maps its blocks pass on),
an even number of slices run a pair at a time in a loop
(`keras.ops.map`): every slice stays small enough for the caches, and the
compiled step holds the work at most four times (the loop's pair, and at
most two more slices for the rest of the batch), whatever the batch. Two
slices of 64 x 70 x 128 numbers took 1.37x as long as four of 32 (nano,
batch 128), ViT-Tiny at batch 64 1.46x as long as eight slices, the
branchy Non-Deep ViT at batch 64 1.61x (benchmarks/README.md,
twenty-first session).
`MAX_MICRO_BATCH_ELEMENTS = math.inf`: two halves at most.
"""

import math

import keras
from keras import ops

MICRO_BATCH_INFERENCE_BACKENDS = ("jax",)
MIN_MICRO_BATCH_TOKENS = 2048
MAX_MICRO_BATCH_ELEMENTS = 3 * 2**17


def micro_batches(input_shape, training, numbers_per_sample=None):
    """How many slices of a `(batch, length, width)` batch run as separate
    chains (1: the whole batch at once).

    `numbers_per_sample`: how many numbers one sample holds at once along
    the chain, which sizes the slices (default `length * width`). A chain
    that also keeps every head's attention map (PatchTST's blocks pass
    their scores on, `heads x length x length` a sample) counts them."""
    batch, length, width = input_shape[0], input_shape[1], input_shape[-1]
    if (
        training
        or batch is None
        or length is None
        or keras.backend.backend() not in MICRO_BATCH_INFERENCE_BACKENDS
    ):
        return 1
    if batch < 2 or batch * length < 2 * MIN_MICRO_BATCH_TOKENS:
        return 1
    numbers = batch * (numbers_per_sample or length * (width or 1))
    pairs = math.ceil(numbers / (2 * MAX_MICRO_BATCH_ELEMENTS))
    return min(batch, 2 * max(1, pairs))


def run_in_slices(
    fn, inputs, training, on_slices=None, numbers_per_sample=None
):
    """`fn(inputs)` for an `fn` that acts on each sample alone, run on the
    `micro_batches` slices of `inputs` (the same numbers).

    `on_slices`, if given, is `[fn(s) for s in slices]` for a list of
    slices run side by side (two, or a loop's pair and the rest's): for a
    layer that does part of its work on all of them at once
    (`TransformerEncoder`: the Jumbo FFN on every slice's Jumbo tokens).
    `numbers_per_sample` as in `micro_batches`."""
    slices = micro_batches(inputs.shape, training, numbers_per_sample)
    if slices == 1:
        return fn(inputs)
    batch = inputs.shape[0]
    size = -(-batch // slices)
    if slices == 2:
        return _consecutive(fn, on_slices, inputs, size)
    # Whole pairs of slices in a loop, the rest (fewer than two slices'
    # worth) in at most two more slices.
    pair = 2 * size
    pairs = batch // pair
    looped = pairs * pair
    outputs = ops.map(
        lambda x: _consecutive(fn, on_slices, x, size),
        ops.reshape(inputs[:looped], (pairs, pair) + tuple(inputs.shape[1:])),
    )
    outputs = [ops.reshape(outputs, (looped,) + tuple(outputs.shape[2:]))]
    rest = batch - looped
    if rest:
        rest_shape = (rest,) + tuple(inputs.shape[1:])
        halves = micro_batches(rest_shape, training, numbers_per_sample) > 1
        rest_size = -(-rest // 2) if halves else rest
        outputs.append(_consecutive(fn, on_slices, inputs[looped:], rest_size))
    return ops.concatenate(outputs, axis=0)


def _consecutive(fn, on_slices, inputs, size):
    """`fn` on consecutive slices of `size` samples (through `on_slices`
    if given), concatenated."""
    if size >= inputs.shape[0]:
        return fn(inputs)
    slices = [
        inputs[start : start + size]
        for start in range(0, inputs.shape[0], size)
    ]
    if on_slices is None:
        outputs = [fn(piece) for piece in slices]
    else:
        outputs = on_slices(slices)
    return ops.concatenate(outputs, axis=0)
