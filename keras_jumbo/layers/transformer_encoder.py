import keras

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo._torch_kernels import summed_gradients
from keras_jumbo.layers._micro_batch import run_in_slices
from keras_jumbo.layers.jumbo_block import JumboBlock
from keras_jumbo.layers.mlp import MLP
from keras_jumbo.layers.patchtst_encoder_block import PatchTSTEncoderBlock
from keras_jumbo.layers.vit_block import ViTBlock


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

    On JAX, a call at inference on at least 4096 tokens (batch x length:
    pico at batch 64) runs the blocks on slices of the batch, each slice
    through every block, and concatenates them: the same numbers (blocks
    are per sample; tested), and two independent chains that XLA's CPU
    runtime overlaps (the attention's batched products run on one thread).
    Two halves, or, from more than `2 * 3 * 2**17` numbers (tokens x width:
    nano at batch 128, ViT-Tiny at 224 px from batch 32), an even number of
    slices run a pair at a time in a loop, so that every slice stays small
    (`keras_jumbo.layers._micro_batch`). A `JumboBlock` runs its Jumbo FFN
    once on the Jumbo tokens of the slices it runs side by side
    (`JumboBlock.call_on_slices`), so that its wide weights are read once
    for all of their rows.

    In eager PyTorch training, the shared Jumbo FFN's kernels get their
    gradients from one product over the rows of all the blocks' uses
    (`keras_jumbo._torch_kernels.summed_gradients`) instead of one product
    and one kernel-sized addition per block: the same gradients to float
    rounding (tested), an eager pico training step 1.02-1.05x faster.

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
        # The shared Jumbo FFN's kernel gradients, one product each rather
        # than one per block (eager PyTorch; `_torch_kernels.
        # summed_gradients`).
        shared = (
            []
            if self.shared_jumbo_mlp is None
            else self.shared_jumbo_mlp.trainable_variables
        )
        return summed_gradients(
            shared,
            lambda: run_in_slices(
                lambda x: self._run_blocks(x, training),
                inputs,
                training,
                on_slices=lambda slices: self._run_blocks_on_slices(
                    slices, training
                ),
                numbers_per_sample=self._numbers_per_sample(inputs.shape),
            ),
        )

    def _numbers_per_sample(self, input_shape):
        """What one sample holds at once along the blocks, for the size of
        inference slices (`run_in_slices`): its tokens, plus every head's
        attention map where a `PatchTSTEncoderBlock` writes them all out
        and passes them on. Counting the maps cuts PatchTST's forecaster
        (16 heads, 42 patches) into slices of ~11 series instead of 56:
        its predict step 1.11-1.14x faster, MS-PatchTST's 1.09-1.12x (JAX,
        2-core CPU; benchmarks/README.md). Other encoders keep the count
        of tokens."""
        length, width = input_shape[1], input_shape[-1]
        if length is None or width is None:
            return None
        # A loop, not `max(..., default=0)`: Dynamo breaks its graph at
        # that call (torch.compile; tested).
        heads = 0
        for block in self.blocks:
            if isinstance(block, PatchTSTEncoderBlock):
                heads = max(heads, block.num_heads)
        return length * (width + heads * length)

    def _run_blocks_on_slices(self, slices, training):
        """`[self._run_blocks(s) for s in slices]`: each slice through
        every block, except that a `JumboBlock` runs its Jumbo FFN on all
        the slices' Jumbo tokens at once (`JumboBlock.call_on_slices`)."""
        if not any(isinstance(block, JumboBlock) for block in self.blocks):
            return [self._run_blocks(x, training) for x in slices]
        xs = list(slices)
        for block in self.blocks:
            if isinstance(block, JumboBlock):
                xs = block.call_on_slices(
                    xs, training, shared_jumbo_mlp=self.shared_jumbo_mlp
                )
            else:
                xs = [call_sublayer(block, x, training=training) for x in xs]
        return xs

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
