import math

import keras
from keras import ops

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo.layers.jumbo_block import JumboBlock
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.patchtst_encoder_block import PatchTSTEncoderBlock
from keras_jumbo.layers.vit_block import ViTBlock

# Backends on which the encoder, at inference, runs its blocks on slices
# of the batch, each slice through every block, and concatenates the
# results (`TransformerEncoder.call`). XLA's CPU runtime runs the
# attention's batched products, LayerNorms and slices on one thread each;
# two independent chains of blocks let one chain's single-threaded work
# overlap the other's two-threaded products. The numbers are those of one
# chain (blocks are per sample). Only when every slice holds at least
# `MIN_MICRO_BATCH_TOKENS` tokens (batch x length): smaller slices made the
# predict step slower (2-core CPU; benchmarks/README.md).
MICRO_BATCH_INFERENCE_BACKENDS = ("jax",)
INFERENCE_MICRO_BATCHES = 2
MIN_MICRO_BATCH_TOKENS = 2048
# At most this many numbers (tokens x width) in a slice: a larger batch is
# cut into more slices, run two at a time (a pair of chains per step of a
# loop). Two slices of 64 x 70 x 128 numbers took 1.37x as long as four of
# 32 (nano, batch 128), ViT-Tiny at batch 64 1.43x (benchmarks/README.md,
# twenty-first session). `math.inf`: two slices at most.
MAX_MICRO_BATCH_ELEMENTS = 3 * 2**17


@keras.saving.register_keras_serializable(package="keras_jumbo")
class TransformerEncoder(keras.layers.Layer):
    """A stack of encoder blocks, owning the shared Jumbo FFN.

    The model builds its blocks (`ViTBlock`, `JumboBlock`,
    `PatchTSTEncoderBlock`) from its own config and hands them over; the
    encoder runs them in order. Holding them in one layer (as keras-hub's
    `ViTEncoder` does) lets one Jumbo FFN be shared by every block
    (`JumboBlock(share_jumbo_mlp=True)`; official release, Jumbo Table 3
    "layer share") and still save and reload as one set of weights, and
    carries each `PatchTSTEncoderBlock`'s attention scores to the next
    (residual attention).

    On JAX, a call at inference on at least `2 * MIN_MICRO_BATCH_TOKENS`
    tokens (batch x length, 4096: pico at batch 64) runs the blocks on
    slices of the batch, each slice through every block, and concatenates
    them: the same numbers (blocks are per sample; tested), and two
    independent chains that XLA's CPU runtime overlaps (the attention's
    batched products run on one thread). Two halves, or, when a half would
    hold more than `MAX_MICRO_BATCH_ELEMENTS` numbers (tokens x width:
    nano at batch 128, ViT-Tiny at 224 px from batch 32), an even number
    of slices run a pair at a time in a loop (`keras.ops.map`), so every
    slice stays small enough to be fast and the compiled step holds the
    blocks twice, whatever the batch.

    Args:
        blocks: a non-empty list of `ViTBlock` (or subclass) /
            `PatchTSTEncoderBlock` layers (or their serialised configs).
        shared_jumbo_mlp: an `MLP` mapping `J * D -> J * D` (or its
            serialised config), given exactly when some block has
            `share_jumbo_mlp=True`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)`.
        training: bool.

    Returns:
        `(batch, length, D)`.

    Example:
    >>> encoder = TransformerEncoder([ViTBlock(2, 16), ViTBlock(2, 16)])
    >>> encoder(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(self, blocks, shared_jumbo_mlp=None, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(blocks, (list, tuple)) or not blocks:
            raise TypeError(
                "`blocks` must be a non-empty list of encoder blocks. "
                f"Received: blocks={blocks!r}"
            )
        blocks = [_deserialize(block) for block in blocks]
        shared_jumbo_mlp = _deserialize(shared_jumbo_mlp)
        for block in blocks:
            if not isinstance(block, (ViTBlock, PatchTSTEncoderBlock)):
                raise TypeError(
                    "Every block must be a ViTBlock, JumboBlock or "
                    "PatchTSTEncoderBlock. Received: a "
                    f"{type(block).__name__} ({block!r})"
                )
        sharing = [
            block.name
            for block in blocks
            if isinstance(block, JumboBlock) and block.share_jumbo_mlp
        ]
        if sharing and shared_jumbo_mlp is None:
            raise ValueError(
                f"Blocks {sharing} share a Jumbo FFN; pass it as "
                "`shared_jumbo_mlp`. Received: shared_jumbo_mlp=None"
            )
        if shared_jumbo_mlp is not None:
            if not isinstance(shared_jumbo_mlp, MLP):
                raise TypeError(
                    "`shared_jumbo_mlp` must be an MLP. Received: "
                    f"{type(shared_jumbo_mlp).__name__}"
                )
            if not sharing:
                raise ValueError(
                    "`shared_jumbo_mlp` is given but no block has "
                    "share_jumbo_mlp=True; it would never be used."
                )
        self.blocks = list(blocks)
        self.shared_jumbo_mlp = shared_jumbo_mlp

    @property
    def depth(self):
        return len(self.blocks)

    def build(self, input_shape):
        # Blocks deserialised from a config come built (their build
        # config is saved with them).
        for block in self.blocks:
            if not block.built:
                block.build(input_shape)
        if (
            self.shared_jumbo_mlp is not None
            and not self.shared_jumbo_mlp.built
        ):
            jumbo_dim = self.blocks[0].jumbo_multiplier * input_shape[-1]
            self.shared_jumbo_mlp.build((input_shape[0], jumbo_dim))

    def call(self, inputs, training=None):
        slices = self._micro_batches(inputs.shape, training)
        if slices == 1:
            return self._run_blocks(inputs, training)
        batch = inputs.shape[0]
        size = -(-batch // slices)
        if slices == 2:
            return self._run_slices(inputs, size, training)
        # Whole pairs of slices in a loop, the rest (fewer than two
        # slices' worth) in at most two more slices.
        pair = 2 * size
        pairs = batch // pair
        looped = pairs * pair
        outputs = ops.map(
            lambda x: self._run_slices(x, size, training),
            ops.reshape(inputs[:looped], (pairs, pair) + inputs.shape[1:]),
        )
        outputs = [ops.reshape(outputs, (looped,) + outputs.shape[2:])]
        rest = batch - looped
        if rest:
            rest_slices = self._micro_batches(
                (rest,) + tuple(inputs.shape[1:]), training
            )
            outputs.append(
                self._run_slices(
                    inputs[looped:], -(-rest // min(rest_slices, 2)), training
                )
            )
        return ops.concatenate(outputs, axis=0)

    def _run_slices(self, inputs, size, training):
        """The blocks on consecutive slices of `size` samples,
        concatenated."""
        if size >= inputs.shape[0]:
            return self._run_blocks(inputs, training)
        return ops.concatenate(
            [
                self._run_blocks(inputs[start : start + size], training)
                for start in range(0, inputs.shape[0], size)
            ],
            axis=0,
        )

    def _micro_batches(self, input_shape, training):
        """How many slices of the batch run as separate chains (1: the
        whole batch at once)."""
        batch, length, width = input_shape[0], input_shape[1], input_shape[-1]
        if (
            training
            or batch is None
            or length is None
            or keras.backend.backend() not in MICRO_BATCH_INFERENCE_BACKENDS
        ):
            return 1
        fitting = batch * length // MIN_MICRO_BATCH_TOKENS
        slices = min(INFERENCE_MICRO_BATCHES, fitting, batch)
        if slices < INFERENCE_MICRO_BATCHES:
            return max(1, slices)
        numbers = batch * length * (width or 1)
        pairs = math.ceil(numbers / (2 * MAX_MICRO_BATCH_ELEMENTS))
        return min(batch, 2 * max(1, pairs))

    def _run_blocks(self, inputs, training):
        x, scores = inputs, None
        for block in self.blocks:
            if isinstance(block, PatchTSTEncoderBlock):
                x, scores = call_sublayer(
                    block,
                    x,
                    training=training,
                    attention_scores=(
                        scores if block.residual_attention else None
                    ),
                )
            elif isinstance(block, JumboBlock):
                x = call_sublayer(
                    block,
                    x,
                    training=training,
                    shared_jumbo_mlp=self.shared_jumbo_mlp,
                )
            else:
                x = call_sublayer(block, x, training=training)
        return x

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "blocks": [
                    keras.saving.serialize_keras_object(block)
                    for block in self.blocks
                ],
                "shared_jumbo_mlp": (
                    None
                    if self.shared_jumbo_mlp is None
                    else keras.saving.serialize_keras_object(
                        self.shared_jumbo_mlp
                    )
                ),
            }
        )
        return config


def _deserialize(layer):
    """A layer, or the layer of a serialised config (`get_config` keeps
    blocks serialised, as keras wrappers do)."""
    if isinstance(layer, dict):
        return keras.saving.deserialize_keras_object(layer)
    return layer
