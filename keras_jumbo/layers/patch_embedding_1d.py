import keras
import numpy as np
from keras import ops

from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import dense


def _padding_amount(padding, stride):
    if padding is None or padding == "none":
        return 0
    if padding == "end":
        return stride
    if isinstance(padding, int) and not isinstance(padding, bool):
        if padding >= 0:
            return padding
    raise ValueError(
        "`padding` must be 'end', 'none', None or an int >= 0. "
        f"Received: padding={padding!r}"
    )


def num_patches(sequence_length, patch_length, stride, padding="end"):
    """Patch count of `PatchEmbedding1D`: floor((L + pad - P) / S) + 1.

    With `padding="end"` (pad = S, the official PatchTST) this is
    floor((L - P) / S) + 2. Raises when the (padded) series is shorter than
    one patch.
    """
    check_positive_int("patch_length", patch_length)
    check_positive_int("stride", stride)
    check_positive_int("sequence_length", sequence_length)
    padded = sequence_length + _padding_amount(padding, stride)
    if padded < patch_length:
        raise ValueError(
            "The series is shorter than one patch. Received: "
            f"sequence_length={sequence_length}, patch_length={patch_length}, "
            f"padding={padding!r}"
        )
    return (padded - patch_length) // stride + 1


def patching_for_num_patches(sequence_length, num_patches):
    """Patch length, stride and end padding giving exactly `num_patches`.

    The Jumbo paper (A.2.2) uses "8 or 42 equally sized patches of maximum
    possible length, with end-padding applied as needed", stride half the
    patch length. Our reading: stride S, patch length P = 2S, and the
    series end-padded (last value repeated) to (N + 1) * S values, so that
    N patches tile it exactly. S is the largest stride that leaves less
    than one stride of padding, or, when none does (N close to L), the
    smallest stride that covers the series.

    Returns:
        dict(patch_length=P, stride=S, padding=pad), the arguments of
        `PatchEmbedding1D`.

    Example:
    >>> patching_for_num_patches(150, 8)
    {'patch_length': 36, 'stride': 18, 'padding': 12}
    """
    check_positive_int("sequence_length", sequence_length)
    check_positive_int("num_patches", num_patches)
    if num_patches > sequence_length:
        raise ValueError(
            "`num_patches` cannot exceed the series length. Received: "
            f"num_patches={num_patches}, sequence_length={sequence_length}"
        )
    covering = -(-sequence_length // (num_patches + 1))
    stride = max(covering, -(-sequence_length // num_patches) - 1)
    padding = (num_patches + 1) * stride - sequence_length
    return {"patch_length": 2 * stride, "stride": stride, "padding": padding}


@keras.saving.register_keras_serializable(package="keras_jumbo")
class PatchEmbedding1D(keras.layers.Layer):
    """Split each channel of a series into patches and project them.

    PatchTST (Nie et al., ICLR 2023, §3.1): every univariate channel is
    cut into patches of length P with stride S, each patch linearly mapped
    to width D (shared across channels: channel independence). End padding
    repeats the last value (PyTorch `ReplicationPad1d((0, S))` in the
    official code), so with `padding="end"` the patch count is
    N = floor((L - P) / S) + 2.

    Args:
        hidden_dim: int, width D of each patch token.
        patch_length: int, P.
        stride: int, S; defaults to P (non-overlapping).
        padding: `"end"` (repeat the last value S times, official PatchTST),
            `"none"`/None, or an int: repeat the last value that many times
            (see `patching_for_num_patches`).
        use_bias: bool.
        kernel_initializer: initializer of the projection.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, channels)`.

    Returns:
        `(batch, channels, N, hidden_dim)`.

    Example:
    >>> layer = PatchEmbedding1D(hidden_dim=16, patch_length=16, stride=8)
    >>> layer(np.zeros((2, 336, 7))).shape  # N = (336 - 16) // 8 + 2
    (2, 7, 42, 16)
    """

    def __init__(
        self,
        hidden_dim,
        patch_length,
        stride=None,
        padding="end",
        use_bias=True,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.hidden_dim = check_positive_int("hidden_dim", hidden_dim)
        self.patch_length = check_positive_int("patch_length", patch_length)
        stride = patch_length if stride is None else stride
        self.stride = check_positive_int("stride", stride)
        _padding_amount(padding, self.stride)
        self.padding = padding
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.projection = keras.layers.Dense(
            hidden_dim,
            use_bias=use_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="projection",
        )

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        length, channels = input_shape[1], input_shape[2]
        if length is None or channels is None:
            raise ValueError(
                "PatchEmbedding1D needs static length and channels. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        self.sequence_length = length
        self.num_channels = channels
        self.num_patches = num_patches(
            length, self.patch_length, self.stride, self.padding
        )
        # Replication padding is index clipping: positions past the end
        # read the last value.
        starts = np.arange(self.num_patches) * self.stride
        index = starts[:, None] + np.arange(self.patch_length)[None]
        self._index = np.minimum(index, length - 1).astype("int32")
        self.projection.build((None, self.patch_length))

    def call(self, inputs):
        check_rank(self, inputs.shape, 3)
        length, channels = inputs.shape[1], inputs.shape[2]
        if (length, channels) != (self.sequence_length, self.num_channels):
            raise ValueError(
                f"Layer '{self.name}' was built for series of length "
                f"{self.sequence_length} with {self.num_channels} channels. "
                f"Received: input_shape={tuple(inputs.shape)}"
            )
        x = ops.transpose(inputs, (0, 2, 1))  # (batch, channels, length)
        patches = ops.take(x, ops.convert_to_tensor(self._index), axis=2)
        return dense(self.projection, patches)

    def compute_output_shape(self, input_shape):
        count = num_patches(
            input_shape[1], self.patch_length, self.stride, self.padding
        )
        return (input_shape[0], input_shape[2], count, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "patch_length": self.patch_length,
                "stride": self.stride,
                "padding": self.padding,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
