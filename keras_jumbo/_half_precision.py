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


def _jax_cpu_half(tensors):
    """Whether every one of `tensors` is a JAX array (or tracer) of one
    half-precision dtype, on JAX's CPU platform."""
    if keras.backend.backend() != "jax" or any(
        isinstance(t, keras.KerasTensor) for t in tensors
    ):
        return False
    dtypes = {keras.backend.standardize_dtype(t.dtype) for t in tensors}
    if len(dtypes) != 1 or not dtypes <= set(HALF_DTYPES):
        return False
    import jax

    return jax.default_backend() == "cpu"


def matmul(x1, x2, bias=None):
    """`ops.matmul(x1, x2)` (plus `bias`, if given); for half-precision
    operands on JAX's CPU, accumulated in float32 on the CPU's
    half-precision kernels, the bias added in float32, the sum rounded to
    the operands' dtype (see the module docstring). For 2-D operands the
    gradients are such products too (`einsum`'s)."""
    x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
    if bias is not None:
        bias = ops.convert_to_tensor(bias)
    given = (x1, x2) if bias is None else (x1, x2, bias)
    if not _jax_cpu_half(given):
        y = ops.matmul(x1, x2)
        return y if bias is None else y + bias
    if len(x1.shape) == 2 and len(x2.shape) == 2:
        return _wide_product("mk,kn->mn")(x1, x2, bias)
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
    bfloat16 bias's gradient in bfloat16)."""
    operands = [ops.convert_to_tensor(x) for x in operands]
    if bias is not None:
        bias = ops.convert_to_tensor(bias)
    given = operands if bias is None else [*operands, bias]
    if not _jax_cpu_half(given):
        y = ops.einsum(subscripts, *operands)
        return y if bias is None else y + bias
    subscripts = subscripts.replace(" ", "")
    if len(operands) == 2 and _is_product(subscripts):
        return _wide_product(subscripts)(*operands, bias)
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


@functools.cache
def _wide_product(subscripts):
    """`f(a, b, bias)`: the half-precision product `subscripts` of JAX
    arrays `a` and `b` (plus `bias`, or None), accumulated in float32 and
    rounded once, with its gradients such products (see `einsum`)."""
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
        # The sum of `g` over the axes `bias` was broadcast along.
        lead = g.ndim - bias.ndim
        axes = tuple(range(lead)) + tuple(
            lead + i
            for i, size in enumerate(bias.shape)
            if size == 1 and g.shape[lead + i] != 1
        )
        dbias = jnp.sum(g, axis=axes, dtype=jnp.float32)
        return da, db, dbias.reshape(bias.shape).astype(bias.dtype)

    function = jax.custom_vjp(forward)
    function.defvjp(forward_with_residuals, backward)
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
