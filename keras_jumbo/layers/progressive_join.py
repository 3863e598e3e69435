import math

import keras
from keras import ops

from keras_jumbo.layers._utils import check_positive_int


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ProgressiveJoin(keras.layers.Layer):
    """Mix n parallel branches' pre-activations with a joining weight λ.

    Branch b receives `z_b + λ Σ_{b' != b} z_b'`, written
    `(1 - λ) z_b + λ Σ_b' z_b'` (Non-Deep ViT §3.3, eq. 5 and 9, for n
    branches). At λ=0 the branches are independent; at λ=1 every branch
    receives the same sum, which is what makes the branches collapse into
    one layer exactly. λ is a non-trainable scalar variable, set by
    `keras_jumbo.callbacks.JoinSchedule` through
    `keras_jumbo.convert.set_join_lambda(model, value)`.

    Args:
        num_branches: int >= 1, n.
        initial_lambda: float in [0, 1], the starting λ (1 = instant joining,
            the paper's ablation).
        branch_axis: int, the axis of the branches in the joined tensors.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: a tensor with the branches on `branch_axis`.

    Returns:
        The joined tensor, same shape.

    Example:
    >>> join = ProgressiveJoin(2, initial_lambda=1.0, branch_axis=0)
    >>> np.asarray(join(np.array([[1.0], [2.0]])))  # both get 1 + 2
    array([[3.],
           [3.]], dtype=float32)
    """

    def __init__(
        self, num_branches, initial_lambda=0.0, branch_axis=1, **kwargs
    ):
        super().__init__(**kwargs)
        self.num_branches = check_positive_int("num_branches", num_branches)
        if isinstance(initial_lambda, bool) or not isinstance(
            initial_lambda, (int, float)
        ):
            raise TypeError(
                "`initial_lambda` must be a float in [0, 1]. "
                f"Received: initial_lambda={initial_lambda!r}"
            )
        if not 0.0 <= initial_lambda <= 1.0:
            raise ValueError(
                "`initial_lambda` must be in [0, 1]. "
                f"Received: initial_lambda={initial_lambda}"
            )
        self.initial_lambda = float(initial_lambda)
        self.branch_axis = branch_axis
        self.join_lambda = self.add_weight(
            name="join_lambda",
            shape=(),
            initializer=keras.initializers.Constant(self.initial_lambda),
            trainable=False,
            dtype="float32",
        )
        self.built = True

    def call(self, inputs):
        return self.mix(inputs, self.branch_axis)

    def mix(self, values, axis):
        """`(1 - λ) x_b + λ Σ_b' x_b'` over the branches on `axis`.

        Linear in `values`, so joining the *weights* of a linear map (its
        branch-stacked kernel and bias, axis 0) equals joining its outputs,
        at a cost that does not grow with the batch.
        """
        lam = ops.cast(self.join_lambda, values.dtype)
        total = ops.sum(values, axis=axis, keepdims=True)
        return (1.0 - lam) * values + lam * total

    def score_scale(self, key_dim):
        """1 / (sqrt(1 + (n-1) λ²) · sqrt(key_dim)), the joined score scale.

        The variance of the joined scores grows by 1 + (n-1)λ² (§3.3, n=2:
        1 + λ²); at λ=1 this is 1/sqrt(n · key_dim), the default scale of
        one attention whose key width is n · key_dim.
        """
        lam = ops.cast(self.join_lambda, "float32")
        growth = 1.0 + (self.num_branches - 1) * lam * lam
        return 1.0 / (ops.sqrt(growth) * math.sqrt(key_dim))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_branches": self.num_branches,
                "initial_lambda": self.initial_lambda,
                "branch_axis": self.branch_axis,
            }
        )
        return config
