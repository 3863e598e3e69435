import math

import keras
from keras import ops

from keras_jumbo._half_precision import einsum
from keras_jumbo._half_precision import matmul
from keras_jumbo._torch_kernels import dot_product_attention
from keras_jumbo._torch_kernels import reshape
from keras_jumbo._torch_kernels import unstack
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import dense
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers.closed_form import shifted_exp
from keras_jumbo.layers.closed_form import softmax
from keras_jumbo.layers.dropout import Dropout

# Backends on which a plain attention call (no head mask, residual scores,
# returned scores or active attention dropout; `key_dim == head_dim`;
# `MultiHeadSelfAttention._uses_fused_call`) runs as one fused q/k/v
# matmul and `ops.dot_product_attention` (PyTorch's fused
# `scaled_dot_product_attention`, or two matmuls and a softmax for short
# sequences on a CPU: `_torch_kernels.dot_product_attention`), as the
# official code does: 1.07x
# inference, 1.05-1.1x training on the PyTorch backend (pico, 2-core
# AVX-512 CPU; benchmarks/README.md). On JAX the heads-first einsums below
# are 2.35x faster than `dot_product_attention`
# (`benchmarks/attention_layouts.py`).
FUSED_ATTENTION_BACKENDS = ("torch",)

# Backends on which a plain attention call at inference (not training; no
# head mask, residual or returned scores) runs head by head on column
# slices of one q/k/v matmul (`MultiHeadSelfAttention._per_head_call`). On
# JAX, one layer's forward pass takes up to 28% less time than with the
# heads-first einsums at ViT and PatchTST shapes (5% more at 12 heads of
# width 16), and the pico Jumbo model's predict step 5-7% less (2-core
# CPU; benchmarks/README.md). Its gradient is 1.4-4.2x slower (slices of
# one tensor), so training keeps the einsums. TensorFlow ran it no faster.
PER_HEAD_INFERENCE_BACKENDS = ("jax",)
# Backends on which a call that returns or adds scores (PatchTST's blocks;
# no head mask, `key_dim == head_dim`) runs as one q/k/v matmul with
# heads-first transposes of it (`MultiHeadSelfAttention.
# _fused_scores_call`), as every call but the plain one does on
# `FUSED_ATTENTION_BACKENDS`. On JAX, against the einsums straight into
# the heads-first layout: PatchTST forecaster predict step 1.19x,
# training step 1.07x, MS-PatchTST training 1.06-1.08x (2-core CPU;
# benchmarks/README.md). Calls without scores (ViT blocks, the PatchTST
# classifier's) keep the einsums in training, measured faster there, but
# for short sequences with narrow heads (`SHORT_NARROW_FUSED_BACKENDS`).
FUSED_SCORES_BACKENDS = ("jax",)
# Backends on which a plain call (as for `FUSED_ATTENTION_BACKENDS`) in
# training runs as `_fused_call`. On TensorFlow with XLA (the recipes'
# `jit_compile`; 2-core CPU, in-process A/B, `train_on_batch`): pico
# Jumbo 1.04-1.07x, RegistersViT nano 1.04x (batch 32, 128 px), PatchTST
# classifiers 1.11-1.19x (batch 256); without XLA (Keras' default on a
# CPU) 0.96-1.06x. Its predict steps ran 0.98x, so inference keeps the
# einsums (benchmarks/README.md). On JAX the einsums train pico 1.11x
# faster.
FUSED_TRAINING_BACKENDS = ("tensorflow",)
# Backends on which a plain call (as for `FUSED_ATTENTION_BACKENDS`) with
# narrow heads (`head_dim <= NARROW_HEAD_DIM`) over a short sequence (at
# most `SHORT_SEQUENCE_MAX_LENGTH[training]` tokens) runs as
# `_fused_call` too, in place of the einsums (training) or the per-head
# call (inference). Measured on JAX, PatchTST classifiers (width 128, 16
# heads of width 8, a class token; 2-core CPU, in-process A/B;
# benchmarks/README.md): training steps 1.05-1.45x faster at 9 tokens (8
# patches, the default) and 1.28x at 5; 0.97-0.87x at 11-25 tokens.
# Predict steps 1.04-1.17x faster at 5-25 tokens, 0.96x at 33, 0.91x at
# 43. With heads of width 16 or 32: 0.92-1.02x (inference) and
# 1.00-1.02x (training, 9 tokens), no gain.
SHORT_NARROW_FUSED_BACKENDS = ("jax",)
NARROW_HEAD_DIM = 8
SHORT_SEQUENCE_MAX_LENGTH = {True: 9, False: 25}


@keras.saving.register_keras_serializable(package="keras_jumbo")
class MultiHeadSelfAttention(keras.layers.Layer):
    """Multi-head self-attention with one fused q/k/v projection.

    `qkv = x W_qkv + b` is split into (3, heads, head_dim) in that order
    (the layout of timm and the official Jumbo release, so their weights
    load without permutation); scores are scaled by `head_dim ** -0.5`
    and computed with einsums and a softmax; the heads are
    concatenated and projected back to the input width. It computes the
    same function as `keras.layers.MultiHeadAttention(num_heads,
    key_dim=head_dim)` given the same weights (tested).

    q, k and v are computed straight into the `(batch, heads, length,
    head_dim)` layout from the fused kernel's columns, and the output
    projection contracts (heads, head_dim) at once: no transposes of
    activations (2.35x faster on a 2-core CPU than `ops.dot_product_attention`
    on sliced projections with JAX; `benchmarks/attention_layouts.py`).
    On the PyTorch backend, where each op is dispatched eagerly, a plain
    call (no `head_mask`, `previous_scores`, `return_scores` or active
    attention dropout, and `key_dim == head_dim`) runs instead as the
    official code does: one q/k/v matmul, attention on strided views of
    it (torch's fused `scaled_dot_product_attention`; eagerly on a CPU
    with fewer than 192 tokens, where that kernel is slower, two matmuls
    and a softmax: `keras_jumbo._torch_kernels.dot_product_attention`),
    one output matmul — about a third of the ops, the same function
    (tested against the einsum form to float32 round-off). A call that
    returns or adds scores (PatchTST's blocks) or drops attention
    probabilities in training takes the same q/k/v matmul on PyTorch,
    with the scores and probabilities written out; only a head mask or
    `key_dim != head_dim` keeps the einsum form there. On JAX a call that
    returns or adds scores takes that form too (`FUSED_SCORES_BACKENDS`:
    PatchTST's forecaster 1.07x faster in training, 1.19x at inference).
    On JAX, a plain call
    at inference (not training; no head mask, residual or returned
    scores) runs head by head on column slices of one q/k/v matmul
    (`_per_head_call`): the same function (tested), up to 28% less time
    than the einsums for one layer's forward pass, but with a slower
    gradient, so training keeps the einsums. Two exceptions take the
    plain fused call instead: TensorFlow in training
    (`FUSED_TRAINING_BACKENDS`; 1.04-1.18x with XLA), and JAX with heads
    of width 8 or less over a short sequence (`SHORT_NARROW_FUSED_BACKENDS`:
    at most 9 tokens in training, 25 at inference, as in PatchTST's
    classifier at 8 patches; 1.10-1.16x), where it measured faster.

    Args:
        num_heads: int, number of heads.
        head_dim: int or None, width of each head. None (default) splits
            the input width D evenly (`D // num_heads`, which must divide);
            an explicit value decouples the inner width `num_heads *
            head_dim` from D (ViT-ResNAS: MHSA-32_h on any width). This
            is the width of each head's values (and of the output
            projection's input).
        key_dim: int or None, width of each head's queries and keys.
            None (default) uses `head_dim`. A different value makes the
            fused kernel's columns `[q (heads, key_dim) | k (heads,
            key_dim) | v (heads, head_dim)]` (the same layout as
            `(3, heads, head_dim)` when equal) and scales the scores by
            `key_dim ** -0.5`: a reparameterised Non-Deep ViT's attention,
            whose joined queries and keys are n times wider than its values
            (`convert.reparameterize`), is then
            `keras.layers.MultiHeadAttention(num_heads, key_dim=key_dim,
            value_dim=head_dim)` in this layer's fast layout (tested equal).
        qkv_bias: bool, bias on the q/k/v projection.
        attention_dropout_rate: float in [0, 1), dropout on the attention
            probabilities (training only).
        dropout_rate: float in [0, 1), dropout after the output projection.
        kernel_initializer: initializer of both projections.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)`.
        training: bool.
        head_mask: optional `(batch, 1, num_heads * head_dim)` 0/1 mask
            applied to the concatenated head outputs before the output
            projection; a prefix of `h` heads kept is exactly the attention
            of those `h` heads (NAS super-network channel masking).
        previous_scores: optional `(batch, heads, length, length)` scaled
            pre-softmax scores of the previous layer, added to this layer's
            scores before the softmax ("residual attention", the official
            PatchTST's `res_attention=True`).
        return_scores: bool, also return this layer's scaled pre-softmax
            scores (previous scores included), for the next layer.

    Returns:
        `(batch, length, D)`, or `(outputs, scores)` with
        `return_scores=True`.

    Example:
    >>> MultiHeadSelfAttention(num_heads=2)(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        head_dim=None,
        key_dim=None,
        qkv_bias=True,
        attention_dropout_rate=0.0,
        dropout_rate=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        if head_dim is not None:
            check_positive_int("head_dim", head_dim)
        self._head_dim_arg = head_dim
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        self._key_dim_arg = key_dim
        self.qkv_bias = qkv_bias
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.attention_dropout = Dropout(
            self.attention_dropout_rate,
            dtype=self.dtype_policy,
            name="attention_dropout",
        )
        self.dropout = Dropout(
            self.dropout_rate, dtype=self.dtype_policy, name="dropout"
        )

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        if dim is None:
            raise ValueError(
                "The last axis of the input of MultiHeadSelfAttention must be "
                f"defined. Received: input_shape={input_shape}"
            )
        if self._head_dim_arg is None and dim % self.num_heads:
            raise ValueError(
                "The model width must be divisible by `num_heads` (or give "
                f"`head_dim`). Received: width={dim}, "
                f"num_heads={self.num_heads}"
            )
        self.hidden_dim = dim
        self.head_dim = self._head_dim_arg or dim // self.num_heads
        self.key_dim = self._key_dim_arg or self.head_dim
        self.inner_dim = self.num_heads * self.head_dim
        self.qkv = keras.layers.Dense(
            self.num_heads * (2 * self.key_dim + self.head_dim),
            use_bias=self.qkv_bias,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="qkv",
        )
        self.qkv.build(input_shape)
        self.proj = keras.layers.Dense(
            dim,
            kernel_initializer=self.kernel_initializer,
            dtype=self.dtype_policy,
            name="proj",
        )
        self.proj.build((*input_shape[:-1], self.inner_dim))

    def _qkv(self, x):
        """q, k, v `(batch, heads, length, width)` from the fused kernel.

        Straight into the heads-first layout with the kernel's columns
        `[q (heads, key_dim) | k (heads, key_dim) | v (heads, head_dim)]`:
        no transposes of activations (about 2x faster on CPU than slicing
        the fused output and calling `ops.dot_product_attention`).
        """
        heads, dim = self.num_heads, self.hidden_dim
        widths = (self.key_dim, self.key_dim, self.head_dim)
        if self.qkv.quantization_mode is not None:
            return self._qkv_from_layer_call(x, widths)
        kernel = ops.cast(self.qkv.kernel, x.dtype)
        bias = self.qkv.bias
        if bias is not None:
            bias = ops.cast(bias, x.dtype)
        outputs, start = [], 0
        for width in widths:
            stop = start + heads * width
            part = reshape(kernel[:, start:stop], (dim, heads, width))
            part_bias = None
            if bias is not None:
                part_bias = reshape(bias[start:stop], (1, heads, 1, width))
            outputs.append(einsum("bsd,dhk->bhsk", x, part, bias=part_bias))
            start = stop
        return tuple(outputs)

    def _qkv_from_layer_call(self, x, widths):
        """`_qkv` through the `qkv` layer's own call, for a quantised layer
        (`model.quantize(...)`): its stored kernel holds integers whose
        scales only its `call` applies, so reading `qkv.kernel` would be
        silently wrong."""
        y = self.qkv(x)
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        outputs, start = [], 0
        for width in widths:
            stop = start + self.num_heads * width
            part = reshape(
                y[..., start:stop], (batch, length, self.num_heads, width)
            )
            outputs.append(ops.transpose(part, (0, 2, 1, 3)))
            start = stop
        return tuple(outputs)

    def _project(self, out, x):
        """Heads-first `(batch, heads, length, head_dim)` -> `(batch,
        length, width)` through the output projection; a quantised `proj`
        goes through its own call (see `_qkv_from_layer_call`)."""
        heads, head_dim, dim = self.num_heads, self.head_dim, self.hidden_dim
        if self.proj.quantization_mode is not None:
            batch, length = ops.shape(out)[0], ops.shape(out)[2]
            out = reshape(
                ops.transpose(out, (0, 2, 1, 3)),
                (batch, length, heads * head_dim),
            )
            return self.proj(out)
        proj = reshape(
            ops.cast(self.proj.kernel, x.dtype), (heads, head_dim, dim)
        )
        bias = self.proj.bias
        if bias is not None:
            bias = ops.cast(bias, out.dtype)
        return einsum("bhqk,hkd->bqd", out, proj, bias=bias)

    def _scores(self, q, k, previous_scores=None):
        scale = 1.0 / math.sqrt(self.key_dim)
        scores = einsum("bhqk,bhsk->bhqs", q * scale, k)
        if previous_scores is not None:
            scores = scores + ops.cast(previous_scores, scores.dtype)
        return scores

    def attention_probabilities(self, inputs, previous_scores=None):
        """The attention maps `(batch, heads, length, length)` (rows sum to
        1, before attention dropout) of `inputs`, as `call` computes them."""
        q, k, _ = self._qkv(inputs)
        return softmax(self._scores(q, k, previous_scores), axis=-1)

    def _fused_qkv(self, x):
        """One q/k/v matmul (through `dense`, so a quantised or LoRA
        sublayer keeps its own call) as `(batch, length, 3, heads,
        head_dim)`."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return reshape(
            dense(self.qkv, x),
            (batch, length, 3, self.num_heads, self.head_dim),
        )

    def _fused_project(self, out):
        """`(batch, length, heads, head_dim)` -> the output matmul."""
        batch, length = ops.shape(out)[0], ops.shape(out)[1]
        return dense(self.proj, reshape(out, (batch, length, -1)))

    def _fused_call(self, x):
        """The plain attention as one q/k/v matmul, fused attention on
        views of it and the output matmul."""
        q, k, v = unstack(self._fused_qkv(x), axis=2)
        out = dot_product_attention(
            q, k, v, scale=1.0 / math.sqrt(self.key_dim)
        )
        return self._fused_project(out)

    def _fused_scores_call(self, x, training, previous_scores):
        """`_fused_call` for a call that returns the scores or adds
        residual ones (PatchTST): one q/k/v matmul, heads-first views of
        it, the scores and the probabilities written out (attention
        dropout on them as in `call`), one output matmul. Returns the
        output before its dropout, and the scores."""
        q, k, v = (
            ops.transpose(t, (0, 2, 1, 3))
            for t in unstack(self._fused_qkv(x), axis=2)
        )
        scores = self._scores(q, k, previous_scores)
        probs = softmax(scores, axis=-1)
        probs = dropout(self.attention_dropout, probs, training)
        out = ops.transpose(matmul(probs, v), (0, 2, 1, 3))
        return self._fused_project(out), scores

    def _per_head_call(self, x):
        """The plain attention at inference, head by head: one q/k/v
        matmul (through `dense`, so a quantised or LoRA sublayer keeps its
        own call), each head's `softmax(q kᵀ) v` on column slices of it
        `(batch, length, width)`, the heads concatenated and one output
        matmul. The same function as the einsum form (tested).

        The softmax's division is deferred past `P·v`: `e = exp(s -
        max(s))`, then `(e v) / sum(e)`, dividing `length x head_dim`
        values instead of `length x length` (float32 round-off apart,
        the same numbers; pico predict step 2% faster on JAX)."""
        y = dense(self.qkv, x)
        heads, key_dim = self.num_heads, self.key_dim
        # The kernel's columns: [q (heads, key_dim) | k | v (heads, head_dim)].
        widths = (key_dim, key_dim, self.head_dim)
        starts = (0, heads * key_dim, 2 * heads * key_dim)
        scale = 1.0 / math.sqrt(key_dim)
        outputs = []
        for head in range(heads):
            q, k, v = (
                y[..., start + head * width : start + (head + 1) * width]
                for start, width in zip(starts, widths, strict=True)
            )
            scores = einsum("bqc,bsc->bqs", q * scale, k)
            weights = shifted_exp(scores, axis=-1)
            total = ops.sum(weights, axis=-1, keepdims=True)
            outputs.append(einsum("bqs,bsc->bqc", weights, v) / total)
        return dense(self.proj, ops.concatenate(outputs, axis=-1))

    def _uses_per_head_call(self, training, head_mask, previous_scores, scores):
        return (
            keras.backend.backend() in PER_HEAD_INFERENCE_BACKENDS
            and not training
            and head_mask is None
            and previous_scores is None
            and not scores
        )

    def _fused_layout(self, head_mask, backends):
        return (
            keras.backend.backend() in backends
            and head_mask is None
            and self.key_dim == self.head_dim
        )

    def _uses_fused_scores_call(self, head_mask, previous_scores, scores):
        """Every call `_uses_fused_call` leaves on `FUSED_ATTENTION_BACKENDS`;
        a call with scores on `FUSED_SCORES_BACKENDS`."""
        with_scores = previous_scores is not None or bool(scores)
        return self._fused_layout(head_mask, FUSED_ATTENTION_BACKENDS) or (
            with_scores and self._fused_layout(head_mask, FUSED_SCORES_BACKENDS)
        )

    def _short_and_narrow(self, training, length):
        """A `length`-token sequence (None: unknown) short enough, and heads
        narrow enough, for `SHORT_NARROW_FUSED_BACKENDS`."""
        return (
            length is not None
            and self.head_dim <= NARROW_HEAD_DIM
            and length <= SHORT_SEQUENCE_MAX_LENGTH[bool(training)]
        )

    def _uses_fused_call(
        self, training, head_mask, previous_scores, scores, length=None
    ):
        """A plain call on `FUSED_ATTENTION_BACKENDS`, in training on
        `FUSED_TRAINING_BACKENDS`, or on `SHORT_NARROW_FUSED_BACKENDS` over
        `length` tokens (None: unknown) when that is short and the heads
        narrow."""
        fused = (
            self._fused_layout(head_mask, FUSED_ATTENTION_BACKENDS)
            or (
                bool(training)
                and self._fused_layout(head_mask, FUSED_TRAINING_BACKENDS)
            )
            or (
                self._fused_layout(head_mask, SHORT_NARROW_FUSED_BACKENDS)
                and self._short_and_narrow(training, length)
            )
        )
        return (
            fused
            and previous_scores is None
            and not scores
            and not (training and self.attention_dropout_rate)
        )

    def call(
        self,
        inputs,
        training=None,
        head_mask=None,
        previous_scores=None,
        return_scores=False,
    ):
        x = inputs
        if self._uses_fused_call(
            training, head_mask, previous_scores, return_scores, x.shape[1]
        ):
            return dropout(self.dropout, self._fused_call(x), training)
        if self._uses_per_head_call(
            training, head_mask, previous_scores, return_scores
        ):
            # Inference: no dropout to apply.
            return self._per_head_call(x)
        if self._uses_fused_scores_call(
            head_mask, previous_scores, return_scores
        ):
            out, scores = self._fused_scores_call(x, training, previous_scores)
            out = dropout(self.dropout, out, training)
            return (out, scores) if return_scores else out
        heads, head_dim = self.num_heads, self.head_dim
        q, k, v = self._qkv(x)
        scores = self._scores(q, k, previous_scores)
        probs = softmax(scores, axis=-1)
        probs = dropout(self.attention_dropout, probs, training)
        out = einsum("bhqs,bhsk->bhqk", probs, v)
        if head_mask is not None:
            mask = reshape(
                ops.cast(head_mask, out.dtype), (-1, 1, heads, head_dim)
            )
            out = out * ops.transpose(mask, (0, 2, 1, 3))
        out = self._project(out, x)
        out = dropout(self.dropout, out, training)
        if return_scores:
            return out, scores
        return out

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "head_dim": self._head_dim_arg,
                "key_dim": self._key_dim_arg,
                "qkv_bias": self.qkv_bias,
                "attention_dropout_rate": self.attention_dropout_rate,
                "dropout_rate": self.dropout_rate,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
