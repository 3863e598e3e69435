"""Half-precision (`mixed_bfloat16`, `mixed_float16`) compute paths.

Under a mixed policy Keras computes in bfloat16 (or float16) and keeps
float32 variables. Two things on XLA's CPU make that slower than float32
unless the library steps in (benchmarks/README.md, "The Xeon a sixth
sitting: `mixed_bfloat16` on JAX's CPU", forty-ninth session):

- **Products.** A `bfloat16 x bfloat16 -> bfloat16` dot (what
  `ops.matmul` / `ops.einsum` give) is rewritten by XLA:CPU into
  converts to float32, a float32 product and a convert back: 1.4-1.8x the
  float32 product's time. The same dot asked for a float32 result
  (`preferred_element_type`) runs on the CPU's bfloat16 kernels (AMX on
  a Sapphire-Rapids-class Xeon): 3-5x faster than float32. `matmul` and
  `einsum` here ask for it on JAX's CPU and round the float32 result to
  the operands' dtype: the same numbers as XLA's own rewrite (the exact
  products of the bfloat16 values summed in float32, rounded once), up
  to the order of the sums. A bias is added in float32 before the
  rounding, and the products' gradients are written out as such
  products: autodiff of the float32 result would multiply a float32
  cotangent (a float32 product again) and sum a bfloat16 bias's
  gradient in bfloat16.
- **Element-wise chains.** XLA keeps every op of a bfloat16 formula
  (the exact GELU's erf polynomial, a softmax) rounded to bfloat16, a
  convert pair per op; `in_float32` computes such a function once in
  float32 and rounds its result: 1.4-1.7x faster for the GELU on those
  cores, and more accurate (one rounding instead of one per op), as
  PyTorch computes its bfloat16 GELU and softmax.

The same holds for TensorFlow's CPU under XLA (`model.compile(...,
jit_compile=True)`, what the recipes' "auto" picks there; Keras' own
"auto" leaves XLA off on a CPU): there the products whose form
TensorFlow's XLA runs that way (`_tf_runs_wide`: 2-D products, the
projections, batched matrix products) are XLA `DotGeneral` ops asked
for a float32 result (`tf2xla.python.xla.dot_general`,
`preferred_element_type`), with the same written-out gradients
(`benchmarks/README.md`, fifty-sixth session: the official pico's
inference 1.50x, training 1.19x). TensorFlow without XLA keeps
`keras.ops`' products: its kernels have no bfloat16-in, float32-out
matmul (`BatchMatMulV3` with `Tout=float32` compiles only under XLA).

Float32 inputs, and other backends' products, go to `keras.ops`
unchanged. On GPUs the products are left to XLA (unmeasured here).
"""

import functools

import keras
from keras import ops

HALF_DTYPES = ("bfloat16", "float16")


def is_half(x):
    """Whether tensor `x` is bfloat16 or float16."""
    return keras.backend.standardize_dtype(x.dtype) in HALF_DTYPES


def _one_half_dtype(tensors, backend):
    """Whether `backend` runs and every one of `tensors` is its tensor
    (not a `KerasTensor`) of one half-precision dtype."""
    if keras.backend.backend() != backend or any(
        isinstance(t, keras.KerasTensor) for t in tensors
    ):
        return False
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in tensors}
    return len(dtypes) == 1 and dtypes <= set(HALF_DTYPES)


def _jax_cpu_half(tensors):
    """Whether every one of `tensors` is a JAX array (or tracer) of one
    half-precision dtype, on JAX's CPU platform."""
    if not _one_half_dtype(tensors, "jax"):
        return False
    import jax

    return jax.default_backend() == "cpu"


def _tf_xla_cpu_half(tensors):
    """Whether every one of `tensors` is a TensorFlow tensor of one
    half-precision dtype, traced for XLA (inside a `tf.function` with
    `jit_compile=True`, or nested in one) on a machine without GPUs."""
    if not _one_half_dtype(tensors, "tensorflow"):
        return False
    import tensorflow as tf

    if tf.executing_eagerly() or _tf_has_gpu():
        return False
    try:  # TensorFlow's own test of an XLA trace (not a public API)
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # pragma: no cover - a TensorFlow without it
        return False
    graph = tf.compat.v1.get_default_graph()
    return bool(control_flow_util.GraphOrParentsInXlaContext(graph))


@functools.cache
def _tf_has_gpu():
    import tensorflow as tf

    return bool(tf.config.list_logical_devices("GPU"))


def _wide_backend(given):
    """The backend whose float32-accumulated products `given` takes
    ("jax", "tensorflow"), or None for `keras.ops`' own. (Named `_wide`,
    AutoGraph's conversion of `matmul` inside a `tf.function` called it
    with `_wide_product(...)`'s three arguments: a TypeError.)"""
    if _jax_cpu_half(given):
        return "jax"
    if _tf_xla_cpu_half(given):
        return "tensorflow"
    return None


def matmul(x1, x2, bias=None):
    """`ops.matmul(x1, x2)` (plus `bias`, if given); for half-precision
    operands on JAX's CPU (2-D ones traced for XLA on TensorFlow's CPU
    too), accumulated in float32 on the CPU's
    half-precision kernels, the bias added in float32, the sum rounded to
    the operands' dtype (see the module docstring). For 2-D operands the
    gradients are such products too (`einsum`'s)."""
    x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
    if bias is not None:
        bias = ops.convert_to_tensor(bias)
    given = (x1, x2) if bias is None else (x1, x2, bias)
    backend = _wide_backend(given)
    two_d = len(x1.shape) == 2 and len(x2.shape) == 2
    if backend is None or (backend == "tensorflow" and not two_d):
        y = ops.matmul(x1, x2)
        return y if bias is None else y + bias
    if two_d:
        return _wide_product("mk,kn->mn", backend)(x1, x2, bias)
    import jax.numpy as jnp

    y = jnp.matmul(x1, x2, preferred_element_type=jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x1.dtype)


def einsum(subscripts, *operands, bias=None):
    """`ops.einsum(subscripts, *operands)` (plus `bias`, broadcast to the
    output, if given); for half-precision operands on JAX's CPU,
    accumulated in float32, the bias added in float32, and rounded to
    their dtype, as `matmul`. For two operands where every index of each
    appears in the other or in the output (a product, no index summed
    within one operand), explicit `->` and no `...`, the gradients are
    such products too: autodiff of the float32 result would multiply a
    float32 cotangent, which XLA computes as a float32 product (and sum a
    bfloat16 bias's gradient in bfloat16). Traced for XLA on TensorFlow's
    CPU, such products whose form `_tf_runs_wide` accepts run the same
    way; other einsums there are `ops.einsum`'s."""
    operands = [ops.convert_to_tensor(x) for x in operands]
    if bias is not None:
        bias = ops.convert_to_tensor(bias)
    given = operands if bias is None else [*operands, bias]
    backend = _wide_backend(given)
    subscripts = subscripts.replace(" ", "")
    product = len(operands) == 2 and _is_product(subscripts)
    if backend == "tensorflow" and product:
        product = _tf_runs_wide(subscripts)
    if backend is None or (backend == "tensorflow" and not product):
        y = ops.einsum(subscripts, *operands)
        return y if bias is None else y + bias
    if product:
        return _wide_product(subscripts, backend)(*operands, bias)
    import jax.numpy as jnp

    y = jnp.einsum(subscripts, *operands, preferred_element_type=jnp.float32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(operands[0].dtype)


def _is_product(subscripts):
    """Whether two-operand `subscripts` is a product whose gradients are
    einsums of the same form (see `einsum`)."""
    if "..." in subscripts or subscripts.count("->") != 1:
        return False
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    if any(len(set(s)) != len(s) for s in (first, second, output)):
        return False
    return all(c in second or c in output for c in first) and all(
        c in first or c in output for c in second
    )


def _tf_runs_wide(subscripts):
    """Whether TensorFlow's XLA runs two-operand product `subscripts` as
    a bfloat16 dot asked for a float32 result: with no batch indices (in
    both operands and the output), or with batch indices leading both
    operands and the output in one order, one index of each operand of
    its own and one summed (a batched matrix product); its gradients'
    products are then of the same kind. TensorFlow 2.21's XLA:CPU fails
    (`Unsupported element type for DotThunk`) on some other such dots
    (batch axes not leading, `bhqs,bqhk->bshk`; two own axes of one operand,
    `bij,bjwc->biwc`), at some sizes; those keep `keras.ops`' einsum.
    The accepted forms, the library's, ran at every size tried
    (fifty-sixth session, 294 random shapes)."""
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    batch = "".join(c for c in first if c in second and c in output)
    if not batch:
        return True
    own = [
        [c for c in x if c not in y]
        for x, y in ((first, second), (second, first))
    ]
    summed = [c for c in first if c in second and c not in output]
    return (
        len(summed) == 1
        and all(len(o) == 1 for o in own)
        and all(x.startswith(batch) for x in (first, second, output))
    )


def _wide_product(subscripts, backend="jax"):
    """`f(a, b, bias)`: the half-precision product `subscripts` of `a`
    and `b` (plus `bias`, or None), accumulated in float32 and rounded
    once, with its gradients such products (see `einsum`); JAX arrays or,
    for `backend="tensorflow"`, TensorFlow tensors traced for XLA."""
    if backend == "tensorflow":
        return _tf_wide_product(subscripts)
    return _jax_wide_product(subscripts)


def _bias_axes(cotangent_shape, bias_shape):
    """The axes of a product's cotangent that a bias of `bias_shape`,
    broadcast to it, was repeated along: its gradient is the sum over
    them."""
    lead = len(cotangent_shape) - len(bias_shape)
    return tuple(range(lead)) + tuple(
        lead + i
        for i, size in enumerate(bias_shape)
        if size == 1 and cotangent_shape[lead + i] != 1
    )


@functools.cache
def _jax_wide_product(subscripts):
    """`_wide_product` on JAX: `jnp.einsum` asked for a float32 result,
    as a `jax.custom_vjp`."""
    import jax
    import jax.numpy as jnp

    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")

    def forward(a, b, bias):
        y = jnp.einsum(subscripts, a, b, preferred_element_type=jnp.float32)
        if bias is not None:
            y = y + bias.astype(jnp.float32)
        return y.astype(a.dtype)

    def forward_with_residuals(a, b, bias):
        return forward(a, b, bias), (a, b, bias)

    def backward(residuals, g):
        a, b, bias = residuals
        da = _wide_product(f"{output},{second}->{first}")(g, b, None)
        db = _wide_product(f"{first},{output}->{second}")(a, g, None)
        if bias is None:
            return da, db, None
        axes = _bias_axes(g.shape, bias.shape)
        dbias = jnp.sum(g, axis=axes, dtype=jnp.float32)
        return da, db, dbias.reshape(bias.shape).astype(bias.dtype)

    function = jax.custom_vjp(forward)
    function.defvjp(forward_with_residuals, backward)
    return function


@functools.cache
def _tf_wide_product(subscripts):
    """`_wide_product` on TensorFlow under XLA: one XLA `DotGeneral`
    asked for a float32 result (`preferred_element_type`), its output
    axes put in `subscripts`' order, as a `tf.custom_gradient`."""
    import tensorflow as tf
    from tensorflow.compiler.tf2xla.python import xla
    from tensorflow.compiler.xla import xla_data_pb2

    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    batch = [c for c in first if c in second and c in output]
    summed = [c for c in first if c in second and c not in output]
    # XLA's result axes: the batch axes, then the first operand's own,
    # then the second's.
    order = (
        batch
        + [c for c in first if c not in second]
        + [c for c in second if c not in first]
    )
    permutation = [order.index(c) for c in output]
    numbers = xla_data_pb2.DotDimensionNumbers()
    numbers.lhs_batch_dimensions.extend(first.index(c) for c in batch)
    numbers.rhs_batch_dimensions.extend(second.index(c) for c in batch)
    numbers.lhs_contracting_dimensions.extend(first.index(c) for c in summed)
    numbers.rhs_contracting_dimensions.extend(second.index(c) for c in summed)

    def forward(a, b, bias):
        y = xla.dot_general(a, b, numbers, preferred_element_type=tf.float32)
        if permutation != sorted(permutation):
            y = tf.transpose(y, permutation)
        if bias is not None:
            y = y + tf.cast(bias, tf.float32)
        return tf.cast(y, a.dtype)

    def products_gradients(a, b, g):
        da = _tf_wide_product(f"{output},{second}->{first}")(g, b, None)
        db = _tf_wide_product(f"{first},{output}->{second}")(a, g, None)
        return da, db

    @tf.custom_gradient
    def plain(a, b):
        return forward(a, b, None), lambda g: products_gradients(a, b, g)

    @tf.custom_gradient
    def biased(a, b, bias):
        def backward(g):
            axes = _bias_axes(g.shape, bias.shape)
            dbias = tf.reduce_sum(tf.cast(g, tf.float32), axis=axes)
            dbias = tf.cast(tf.reshape(dbias, bias.shape), bias.dtype)
            return (*products_gradients(a, b, g), dbias)

        return forward(a, b, bias), backward

    def function(a, b, bias):
        return plain(a, b) if bias is None else biased(a, b, bias)

    return function


def in_float32(function, x, *others):
    """`function(x, *others)` for an element-wise (or row-wise)
    `function`: on a half-precision `x`, except on PyTorch (whose bfloat16
    kernels compute in float32 already), computed on every argument cast
    to float32 and the result cast back to `x`'s dtype (see the module
    docstring); otherwise `function(x, *others)` itself."""
    if keras.backend.backend() == "torch" or not is_half(x):
        return function(x, *others)
    wide = [ops.cast(t, "float32") for t in (x, *others)]
    return ops.cast(function(*wide), x.dtype)
