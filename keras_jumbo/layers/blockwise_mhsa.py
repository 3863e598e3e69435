import math

import keras
from keras import ops

from keras_jumbo._half_precision import einsum
from keras_jumbo._torch_kernels import linear
from keras_jumbo._torch_kernels import reshape
from keras_jumbo.layers._utils import add_all
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers.closed_form import softmax
from keras_jumbo.layers.dropout import Dropout
from keras_jumbo.layers.progressive_join import ProgressiveJoin

# The backends whose per-head projections run as one 2-D `linear` product
# of the token rows (`(batch * length, D)` by `(D, heads * d)`, and back)
# instead of the per-head einsums: on eager PyTorch, `linear` is oneDNN's
# matmul where `torch.einsum` is MKL's, which runs its AVX2 kernels on AMD
# CPUs (`keras_jumbo._torch_kernels`). The same values (bit for bit at
# inference on 2 Zen 4 cores); one `(16 x 197, 192)` projection 1.05-1.17x
# faster, NonDeepViT-6x2 predict 1.00-1.06x, its 12-layer twin 1.02-1.12x,
# both train 1.00-1.01x over 14 rounds (224 px, batch 16; 4x3 predict
# 0.96x in one run; benchmarks/README.md, fifty-fourth session). JAX and
# TensorFlow keep the einsums (XLA picks their products itself).
LINEAR_PROJECTION_BACKENDS = ("torch",)


def pairwise_cosine_squared(branches):
    """Mean over branch pairs of E[cos(f_i, f_j)^2].

    `branches` is a sequence of the n branch outputs, each `(..., D)`, or
    one tensor `(..., n, D)` with the branches on axis -2. The cosine is
    taken over D for each position, squared, averaged over positions and
    over the n(n-1)/2 pairs (Non-Deep ViT §4, diversity regularisation).
    The layers pass the list: stacking the branch outputs into one
    tensor made XLA:CPU transpose every branch's FFN activations for the
    weight gradients (the branchy model trained at 1.3x the time of its
    same-MACs deep model; 1.03x from the list, `benchmarks/README.md`).
    """
    if not isinstance(branches, (list, tuple)):
        branches = [branches[..., i, :] for i in range(branches.shape[-2])]
    n = len(branches)
    unit = [
        f
        / ops.maximum(ops.sqrt(ops.sum(ops.square(f), -1, keepdims=True)), 1e-6)
        for f in branches
    ]
    terms = [
        ops.mean(ops.square(ops.sum(unit[i] * unit[j], axis=-1)))
        for i in range(n)
        for j in range(i + 1, n)
    ]
    return add_all(terms) / (n * (n - 1) / 2)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class BlockwiseMHSA(keras.layers.Layer):
    """Blockwise multi-head self-attention, optionally with n branches.

    Every head h has its own Q, K, V projections and its own block
    `W^O_h` of the output projection; head outputs are projected and
    summed instead of concatenated (Non-Deep ViT §3.2, eq. 3):

        out = Σ_h softmax(Q_h K_hᵀ / sqrt(d_k)) V_h W^O_h

    With one branch this is standard multi-head attention (equal to
    `keras.layers.MultiHeadAttention` given the same weights, whose kernel
    layout — `(D, heads, d_k)` and `(heads, d_v, D)` — it shares).

    With `num_branches=n > 1`, n independent attentions read the same
    input and are progressively joined (§3.3, eq. 4-7; Algorithm 1): the
    scores `Q_b K_bᵀ = X W_b Xᵀ` (W_b = W^Q_b W^K_bᵀ, computed the cheap way)
    of branch b become `S_b + λ Σ_{b'≠b} S_b'`, scaled by
    `1 / (sqrt(1 + (n-1)λ²) sqrt(d_k))`; the values are joined the same way
    (`join_values=True`); the branch outputs are summed. At λ=1 every branch
    computes `softmax(X ΣW_b Xᵀ / sqrt(n d_k)) · X ΣW^V_b`, so the layer is
    exactly one attention with key width `n·d_k` (the branches' Q and K
    concatenated per head) and summed V and W^O — see
    `keras_jumbo.convert.reparameterize`.

    Joining the values is this library's default and the only exact choice:
    without it (the paper's eq. 6-7 taken literally) summing W^V and W^O
    across branches adds cross terms W^V_a W^O_b that the branchy model never
    computed.

    On PyTorch each branch's Q, K, V and output projections run as one
    2-D product of the token rows through `keras_jumbo._torch_kernels.
    linear` (oneDNN's matmul where the library uses it) instead of the
    per-head einsums (`LINEAR_PROJECTION_BACKENDS`): the same values.

    Args:
        num_heads: int, heads per branch.
        key_dim: int or None, d_k per head (default: width / num_heads).
        value_dim: int or None, d_v per head (default: key_dim).
        num_branches: int >= 1, parallel branches n.
        use_bias: bool, biases on Q, K, V and the output.
        initial_lambda: float in [0, 1], the starting joining weight λ.
        diversity_weight: float >= 0; when > 0 the layer adds
            `diversity_weight * mean_pairs E[cos(O_i, O_j)^2]` over its branch
            outputs as a loss (`layer.losses`) in training calls only: it is
            a training objective (the paper's), so inference and
            `evaluate` skip it and run the faster summed path.
        attention_dropout_rate: float, dropout on attention probabilities.
        dropout_rate: float, dropout on the output.
        kernel_initializer: initializer of the kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)`.
        training: bool.

    Returns:
        `(batch, length, D)`.

    Example:
    >>> attention = BlockwiseMHSA(num_heads=4, num_branches=2)
    >>> attention(np.zeros((2, 5, 16))).shape
    (2, 5, 16)

    Reference: "Non-Deep Vision Transformers" (../shared/papers/
    non_deep_vit.txt), §3.2-3.3, Algorithm 1.
    """

    def __init__(
        self,
        num_heads,
        key_dim=None,
        value_dim=None,
        num_branches=1,
        use_bias=True,
        initial_lambda=0.0,
        diversity_weight=0.0,
        attention_dropout_rate=0.0,
        dropout_rate=0.0,
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        if key_dim is not None:
            check_positive_int("key_dim", key_dim)
        if value_dim is not None:
            check_positive_int("value_dim", value_dim)
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.num_branches = check_positive_int("num_branches", num_branches)
        self.use_bias = use_bias
        self.initial_lambda = initial_lambda
        if not isinstance(diversity_weight, (int, float)) or (
            diversity_weight < 0
        ):
            raise ValueError(
                "`diversity_weight` must be a float >= 0. "
                f"Received: diversity_weight={diversity_weight!r}"
            )
        self.diversity_weight = float(diversity_weight)
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.join = ProgressiveJoin(
            self.num_branches,
            initial_lambda=initial_lambda,
            dtype=self.dtype_policy,
            name="join",
        )
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
                "The last axis of the input of BlockwiseMHSA must be defined. "
                f"Received: input_shape={input_shape}"
            )
        key_dim = self.key_dim
        if key_dim is None:
            if dim % self.num_heads:
                raise ValueError(
                    "The model width must be divisible by `num_heads` when "
                    f"`key_dim` is not given. Received: width={dim}, "
                    f"num_heads={self.num_heads}"
                )
            key_dim = dim // self.num_heads
        self._key_dim = key_dim
        self._value_dim = self.value_dim or key_dim
        n, h = self.num_branches, self.num_heads

        def kernel(name, shape):
            return self.add_weight(
                name=name, shape=shape, initializer=self.kernel_initializer
            )

        def bias(name, shape):
            if not self.use_bias:
                return None
            return self.add_weight(name=name, shape=shape, initializer="zeros")

        self.query_kernel = kernel("query_kernel", (n, dim, h, key_dim))
        self.query_bias = bias("query_bias", (n, h, key_dim))
        self.key_kernel = kernel("key_kernel", (n, dim, h, key_dim))
        self.key_bias = bias("key_bias", (n, h, key_dim))
        self.value_kernel = kernel("value_kernel", (n, dim, h, self._value_dim))
        self.value_bias = bias("value_bias", (n, h, self._value_dim))
        self.output_kernel = kernel(
            "output_kernel", (n, h, self._value_dim, dim)
        )
        self.output_bias = bias("output_bias", (n, dim))

    def _uses_linear_projections(self):
        """Whether the per-head projections run as 2-D `linear` products
        on this backend (`LINEAR_PROJECTION_BACKENDS`)."""
        return keras.backend.backend() in LINEAR_PROJECTION_BACKENDS

    def _project(self, x, kernel, bias, branch):
        """Branch `branch`'s per-head projection `(batch, heads, length, k)`."""
        kernel = ops.cast(kernel[branch], x.dtype)
        if bias is not None:
            bias = ops.cast(bias[branch], x.dtype)
        if self._uses_linear_projections():
            dim, heads, width = kernel.shape
            if bias is not None:
                bias = reshape(bias, (-1,))
            y = linear(x, reshape(kernel, (dim, heads * width)), bias)
            y = reshape(y, (*ops.shape(x)[:2], heads, width))
            return ops.transpose(y, (0, 2, 1, 3))
        if bias is not None:
            bias = bias[None, :, None, :]
        return einsum("bsd,dhk->bhsk", x, kernel, bias=bias)

    def _heads(self, inputs, training=None):
        """Per-branch attention outputs, a list of n `(batch, heads, length,
        d_v)`, before the output projection.

        Computed branch by branch with 4-D tensors (5-D einsums over
        (branch, head) made XLA copy the score tensors; together with the
        joined-score matmul below, 4.9x faster on a 2-core CPU,
        `benchmarks/attention_layouts.py`).
        The joined scores of branch b, `S_b + λ Σ_{b'≠b} S_b'`, are one
        matmul of `[c_b1 Q_1, ..., c_bn Q_n]` (c = 1 for b, λ otherwise)
        with all the keys side by side, instead of n score tensors summed
        and mixed element by element.
        """
        x = inputs
        n = self.num_branches
        value_kernel, value_bias = self.value_kernel, self.value_bias
        if n > 1:
            # The values are linear in x: join the value weights (exact),
            # not the batch-sized values.
            value_kernel = self.join.mix(value_kernel, axis=0)
            if value_bias is not None:
                value_bias = self.join.mix(value_bias, axis=0)
        outputs = []
        for b, probs in enumerate(self._probabilities(x)):
            probs = dropout(self.attention_dropout, probs, training)
            values = self._project(x, value_kernel, value_bias, b)
            outputs.append(einsum("bhqs,bhsk->bhqk", probs, values))
        return outputs

    def _probabilities(self, x):
        """Each branch's (joined) attention maps `(batch, heads, q, s)`."""
        n = self.num_branches
        queries = [
            self._project(x, self.query_kernel, self.query_bias, b)
            for b in range(n)
        ]
        keys = [
            self._project(x, self.key_kernel, self.key_bias, b)
            for b in range(n)
        ]
        # The score scale is applied to the queries, not to the
        # (batch, heads, q, s) scores: a traced scale times the scores was
        # a separate broadcast pass over them on XLA:CPU (about a quarter
        # of the branchy model's inference time at 224 px).
        if n == 1:
            scale = 1.0 / math.sqrt(self._key_dim)
            scores = einsum("bhqk,bhsk->bhqs", queries[0] * scale, keys[0])
            return [softmax(scores, axis=-1)]
        scale = ops.cast(self.join.score_scale(self._key_dim), x.dtype)
        cross = ops.cast(self.join.join_lambda, x.dtype) * scale
        scaled = [q * scale for q in queries]
        crossed = [q * cross for q in queries]
        all_keys = ops.concatenate(keys, axis=-1)
        probabilities = []
        for b in range(n):
            mixed = ops.concatenate(
                [scaled[c] if c == b else crossed[c] for c in range(n)],
                axis=-1,
            )
            scores = einsum("bhqc,bhsc->bhqs", mixed, all_keys)
            probabilities.append(softmax(scores, axis=-1))
        return probabilities

    def attention_probabilities(self, inputs):
        """The attention maps `(batch, heads, length, length)` averaged over
        the branches (each branch's joined maps, before attention dropout):
        what Non-Deep ViT's attention-map distillation compares with the
        teacher's (§4, "the averaged maps across branches")."""
        probabilities = self._probabilities(inputs)
        return add_all(probabilities) / len(probabilities)

    def _project_out(self, heads, branch):
        kernel = ops.cast(self.output_kernel[branch], heads.dtype)
        bias = self.output_bias
        if bias is not None:
            bias = ops.cast(bias[branch], heads.dtype)
        if self._uses_linear_projections():
            num_heads, width, dim = kernel.shape
            batch, _, length, _ = ops.shape(heads)
            rows = reshape(
                ops.transpose(heads, (0, 2, 1, 3)),
                (batch, length, num_heads * width),
            )
            return linear(rows, reshape(kernel, (num_heads * width, dim)), bias)
        return einsum("bhqk,hkd->bqd", heads, kernel, bias=bias)

    def _branch_outputs(self, inputs, training=None):
        """Each branch's output `(batch, length, D)`, a list of n."""
        heads = self._heads(inputs, training=training)
        return [self._project_out(h, b) for b, h in enumerate(heads)]

    def branch_outputs(self, inputs, training=None):
        """Per-branch outputs `(batch, length, n, D)` (summed by `call`)."""
        return ops.stack(self._branch_outputs(inputs, training), axis=2)

    def call(self, inputs, training=None):
        branches = self._branch_outputs(inputs, training=training)
        if training and self.diversity_weight and self.num_branches > 1:
            self.add_loss(
                self.diversity_weight * pairwise_cosine_squared(branches)
            )
        return dropout(self.dropout, add_all(branches), training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "num_branches": self.num_branches,
                "use_bias": self.use_bias,
                "initial_lambda": self.initial_lambda,
                "diversity_weight": self.diversity_weight,
                "attention_dropout_rate": self.attention_dropout_rate,
                "dropout_rate": self.dropout_rate,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
