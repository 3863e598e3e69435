import keras

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo.layers.masked_layer_norm import MaskedLayerNorm
from keras_jumbo.layers.vit_block import ViTBlock


@keras.saving.register_keras_serializable(package="keras_jumbo")
class MaskedViTBlock(ViTBlock):
    """The channel-masked ViT block of a weight-sharing super-network
    (ViT-ResNAS §2.3: masked layer norm, per-example sub-networks).

    A `ViTBlock` built at the largest size of its search-space slot, whose
    norms are `MaskedLayerNorm` and whose call takes per-example channel
    masks: `embed_mask` (the active prefix of the width), `head_mask`
    (active heads, over `num_heads * head_dim`), `hidden_mask` (active FFN
    units) and `layer_mask` (0 skips the block: `x` passes through
    unchanged). Each branch output is multiplied by `embed_mask *
    layer_mask`:

        x = x + m * DropPath(Attn(MLN1(x; e); heads))
        x = x + m * DropPath(FFN(MLN2(x; e); hidden))      m = e * layer

    With prefix masks the block computes exactly the smaller `ViTBlock`
    whose weights are the leading slices (tested against the sliced
    standalone block); without masks it is the `ViTBlock`. Its attributes
    are the `ViTBlock`'s.

    Args:
        As `ViTBlock`; `num_heads` and `mlp_dim` are the slot's largest.

    Call arguments:
        inputs: `(batch, length, D)` tokens, D the largest width.
        training: bool.
        embed_mask, head_mask, hidden_mask: optional 0/1 masks
            `(batch, 1, width)`.
        layer_mask: optional `(batch, 1, 1)`, 0 to skip the block.

    Returns:
        `(batch, length, D)`.

    Example:
    >>> block = MaskedViTBlock(num_heads=2, mlp_dim=16)
    >>> mask = np.concatenate([np.ones((2, 1, 4)), np.zeros((2, 1, 4))], -1)
    >>> block(np.ones((2, 5, 8)), embed_mask=mask).shape
    (2, 5, 8)
    """

    def _norm(self, name):
        return MaskedLayerNorm(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def call(
        self,
        inputs,
        training=None,
        embed_mask=None,
        head_mask=None,
        hidden_mask=None,
        layer_mask=None,
    ):
        branch_mask = embed_mask
        if layer_mask is not None:
            branch_mask = (
                layer_mask if embed_mask is None else embed_mask * layer_mask
            )
        attended = call_sublayer(
            self.attention,
            call_sublayer(self.norm1, inputs, channel_mask=embed_mask),
            training=training,
            head_mask=head_mask,
        )
        x = self._add(
            inputs,
            attended,
            self.layer_scale1,
            self.drop_path1,
            training,
            branch_mask,
        )
        hidden = call_sublayer(
            self.mlp,
            call_sublayer(self.norm2, x, channel_mask=embed_mask),
            training=training,
            hidden_mask=hidden_mask,
        )
        return self._add(
            x, hidden, self.layer_scale2, self.drop_path2, training, branch_mask
        )
