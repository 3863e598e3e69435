import keras
from keras import ops

from keras_jumbo._keras_internals import call_sublayer
from keras_jumbo._torch_kernels import linear
from keras_jumbo.layers._micro_batch import run_in_slices
from keras_jumbo.layers._utils import add_all
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rank
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import dropout
from keras_jumbo.layers._utils import get_activation
from keras_jumbo.layers._utils import linear_then
from keras_jumbo.layers.blockwise_mhsa import BlockwiseMHSA
from keras_jumbo.layers.blockwise_mhsa import pairwise_cosine_squared
from keras_jumbo.layers.dropout import Dropout
from keras_jumbo.layers.layer_norm import LayerNormalization
from keras_jumbo.layers.progressive_join import ProgressiveJoin
from keras_jumbo.layers.stochastic_depth import StochasticDepth


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ParallelBranchBlock(keras.layers.Layer):
    """n parallel transformer branches over one normalised input, joined by λ.

    The Non-Deep ViT training block (§3.2-3.4, Algorithm 1). LayerNorms are
    taken out of the branches and applied once before branching; attention
    is a `BlockwiseMHSA` with n progressively joined branches; the FFN
    branches are joined before GELU:

        x = x + Σ_b Attn_b(LN1(x))                       (joined scores, values)
        h_b = LN2(x) W1_b + b1_b
        x = x + Σ_b GELU(h_b + λ Σ_{b'≠b} h_b') W2_b + b2_b

    At λ=1 the block equals one plain pre-norm block with Σ_b W1_b, Σ_b W2_b,
    summed value/output projections and a key width of n·d_k, which
    `keras_jumbo.convert.reparameterize` builds from stock Keras layers.

    On JAX, a call at inference on a large batch (from 4096 tokens, batch x
    length) runs on slices of the batch, as `TransformerEncoder` does
    (`keras_jumbo.layers._micro_batch`): the same numbers (the block acts on
    each sample alone; tested); NonDeepViT-6x2 at 224 px, batch 64, took
    1.61x as long on the whole batch.

    Args:
        num_heads: int, heads per branch.
        mlp_dim: int, hidden width of each branch's FFN.
        num_branches: int >= 1, n.
        key_dim: int or None, per-head query/key width (width / heads).
        initial_lambda: float in [0, 1], starting λ.
        diversity_weight: float >= 0, weight of this block's diversity loss
            (mean of the attention and FFN branch-output terms), added in
            training calls only (inference and `evaluate` run the summed
            FFN, which needs no per-branch outputs: at 224 px the
            per-branch path cost a transpose of every hidden activation).
        dropout_rate, attention_dropout_rate, drop_path_rate: floats.
        layer_norm_epsilon: float.
        activation: FFN activation (`"gelu"`: exact erf GELU).
        kernel_initializer: initializer of the kernels.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, length, D)`.
        training: bool.

    Returns:
        `(batch, length, D)`.

    Example:
    >>> block = ParallelBranchBlock(num_heads=2, mlp_dim=32, num_branches=3)
    >>> block(np.zeros((2, 5, 8))).shape
    (2, 5, 8)
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        num_branches=2,
        key_dim=None,
        initial_lambda=0.0,
        diversity_weight=0.0,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        activation="gelu",
        kernel_initializer="glorot_uniform",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = check_positive_int("num_heads", num_heads)
        self.mlp_dim = check_positive_int("mlp_dim", mlp_dim)
        self.num_branches = check_positive_int("num_branches", num_branches)
        self.key_dim = key_dim
        self.initial_lambda = initial_lambda
        self.diversity_weight = diversity_weight
        self.dropout_rate = check_rate("dropout_rate", dropout_rate)
        self.attention_dropout_rate = check_rate(
            "attention_dropout_rate", attention_dropout_rate
        )
        self.drop_path_rate = check_rate("drop_path_rate", drop_path_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.activation = activation
        self._activation_fn = get_activation(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        common = dict(dtype=self.dtype_policy)
        self.norm1 = LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="norm1", **common
        )
        self.attention = BlockwiseMHSA(
            num_heads,
            key_dim=key_dim,
            num_branches=num_branches,
            initial_lambda=initial_lambda,
            diversity_weight=0.5 * diversity_weight,
            attention_dropout_rate=attention_dropout_rate,
            dropout_rate=dropout_rate,
            kernel_initializer=self.kernel_initializer,
            name="attention",
            **common,
        )
        self.norm2 = LayerNormalization(
            epsilon=self.layer_norm_epsilon, name="norm2", **common
        )
        self.mlp_join = ProgressiveJoin(
            num_branches,
            initial_lambda=initial_lambda,
            branch_axis=2,
            name="mlp_join",
            **common,
        )
        self.dropout = Dropout(dropout_rate, **common)
        self.drop_path1 = StochasticDepth(drop_path_rate, **common)
        self.drop_path2 = StochasticDepth(drop_path_rate, **common)

    def build(self, input_shape):
        check_rank(self, input_shape, 3)
        dim = input_shape[-1]
        self.norm1.build(input_shape)
        self.attention.build(input_shape)
        self.norm2.build(input_shape)
        n, hidden = self.num_branches, self.mlp_dim
        init = self.kernel_initializer
        self.fc1_kernel = self.add_weight(
            name="fc1_kernel", shape=(n, dim, hidden), initializer=init
        )
        self.fc1_bias = self.add_weight(
            name="fc1_bias", shape=(n, hidden), initializer="zeros"
        )
        self.fc2_kernel = self.add_weight(
            name="fc2_kernel", shape=(n, hidden, dim), initializer=init
        )
        self.fc2_bias = self.add_weight(
            name="fc2_bias", shape=(n, dim), initializer="zeros"
        )

    def _mlp_branches(self, x, training=None):
        """Each branch's FFN output `(batch, length, D)` of a normed input,
        a list of n.

        The join is applied to fc1's branch-stacked kernel and bias (the
        same λ-mix, exact because fc1 is linear) rather than to the hidden
        activations, which are batch x length times larger. Each branch is
        then two plain 2-D matmuls: with the branches stacked into one
        `(batch, length, n, hidden)` tensor, XLA:CPU transposed every
        hidden activation for the branch-batched weight gradients (training
        1.3x and inference 1.13x the time of the same-MACs deep model, 1.03x
        and 1.05x branch by branch; `benchmarks/README.md`). The first
        product and the activation go through `linear_then`: on eager
        PyTorch an inference call applies the exact GELU inside oneDNN's
        matmul, as `MLP` does (the same values).
        """
        kernel1 = ops.cast(self.fc1_kernel, x.dtype)
        bias1 = ops.cast(self.fc1_bias, x.dtype)
        if self.num_branches > 1:
            kernel1 = self.mlp_join.mix(kernel1, axis=0)
            bias1 = self.mlp_join.mix(bias1, axis=0)
        kernel2 = ops.cast(self.fc2_kernel, x.dtype)
        bias2 = ops.cast(self.fc2_bias, x.dtype)
        outputs = []
        for b in range(self.num_branches):
            hidden = linear_then(self._activation_fn, x, kernel1[b], bias1[b])
            hidden = dropout(self.dropout, hidden, training)
            outputs.append(linear(hidden, kernel2[b], bias2[b]))
        return outputs

    def mlp_branch_outputs(self, x, training=None):
        """Per-branch FFN outputs `(batch, length, n, D)` of a normed input."""
        return ops.stack(self._mlp_branches(x, training=training), axis=2)

    def attention_maps(self, x):
        """The attention maps `(batch, heads, length, length)` of input `x`,
        averaged over the branches (each branch's maps joined at the
        current λ): what attention-map distillation compares with a
        teacher's (Non-Deep ViT §4)."""
        return self.attention.attention_probabilities(self.norm1(x))

    def call(self, inputs, training=None):
        return run_in_slices(
            lambda x: self._forward(x, training), inputs, training
        )

    def _forward(self, inputs, training):
        x = inputs
        branch = call_sublayer(
            self.attention, call_sublayer(self.norm1, x), training=training
        )
        x = x + dropout(self.drop_path1, branch, training)
        branches = self._mlp_branches(
            call_sublayer(self.norm2, x), training=training
        )
        if training and self.diversity_weight and self.num_branches > 1:
            self.add_loss(
                0.5 * self.diversity_weight * pairwise_cosine_squared(branches)
            )
        branch = dropout(self.dropout, add_all(branches), training)
        return x + dropout(self.drop_path2, branch, training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "mlp_dim": self.mlp_dim,
                "num_branches": self.num_branches,
                "key_dim": self.key_dim,
                "initial_lambda": self.initial_lambda,
                "diversity_weight": self.diversity_weight,
                "dropout_rate": self.dropout_rate,
                "attention_dropout_rate": self.attention_dropout_rate,
                "drop_path_rate": self.drop_path_rate,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "activation": self.activation,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
            }
        )
        return config
