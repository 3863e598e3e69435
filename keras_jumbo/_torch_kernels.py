"""Ops with a PyTorch kernel that `keras.ops` does not reach.

On the PyTorch backend Keras runs every op eagerly (or traces it once per
shape under `torch.compile`), so what an op costs there is what the
library's models cost. For these, `keras.ops` leaves time on the
table (measured on the official Jumbo pico, 128 px, batch 64, 2 CPU
cores; `torch.profiler` and per-call timings in benchmarks/README.md,
"Eager PyTorch: fused linear, reshape and LayerNorm"):

- `linear`: a dense layer is `ops.matmul` and then `+ bias`, two kernels
  and two passes over the output; torch's `F.linear` is one `addmm` that
  starts from the bias. The separate bias adds were 72 of the pico
  forward's 111 element-wise adds (5.5% of its operator time). On an
  AMD CPU, a large float32 product (and its gradients) runs on oneDNN's
  matmul instead (`onednn_preferred`): MKL, `F.linear`'s BLAS, runs its
  AVX2 kernels there (eager pico predict on 2 Zen 5 cores: 471 -> 756
  img/s). On an Intel CPU, only where no gradient is needed (eager pico
  predict on 2 Xeon cores 1.05x). Where no gradient is needed, oneDNN
  runs on the kernel packed once into its blocked layout
  (`_packed_weight`), not reordered at every call.
- `reshape`: `ops.reshape` flattens its `newshape` tuple with torch's
  pytree (to look for symbolic tensors): ~22 us a call against ~1.5 us
  for the reshape itself.
- `layer_norm`: `ops.layer_normalization` takes ~24 us a call, ~18 us of
  it dtype bookkeeping around a ~6 us `F.layer_norm`; a half-precision
  inference call also casts the whole input to float32 and back, where
  torch's mixed-dtype kernel reads it as it is.
- `dot_product_attention`: `ops.dot_product_attention` copies query, key
  and value into contiguous tensors before torch's fused attention
  (three copies per block); the kernel reads the strided heads-first
  views itself, with no copy. Eagerly on a CPU with fewer than
  `SHORT_ATTENTION_LENGTH` (192) queries, two matmuls and a softmax on
  those views replace the fused kernel, which is slower there.
- `value_as`, `concatenate`, `exact_gelu`: a weight in its input's
  dtype, `torch.cat` and `F.gelu` without Keras' per-op dispatch (~6-8 us
  a call each, ~30 such calls per ViT block; a pico ViT's eager forward
  pass at batch 1 went 18 -> 14 ms with these and the direct layer calls
  of `_keras_internals`, benchmarks/README.md, thirty-ninth session).
  Under a mixed-precision policy, `value_as` keeps each weight's
  half-precision copy for calls without gradient (`_cast_weight`), where
  Keras casts at every read.
- `unstack`: `torch.unbind`, whose gradient is one `stack`; indexing
  each slice costs a zero fill, a copy and an add of the whole tensor per
  slice in the backward.
- `batch_norm`, `batch_norm_training` (PyTorch only; `layers.
  BatchNormalization` calls them when `batch_norm_applies`): Keras'
  layer computes batch normalisation as ~8 element-wise ops (`ops.moments`
  and `ops.batch_normalization`) and their gradients; `F.batch_norm` is
  one kernel each way: forward + backward 7x faster for a `(224, 42, 128)`
  input (10.2 vs 1.4 ms).
- `unseeded_dropout` (PyTorch only; `layers.Dropout` calls it for a
  layer without a seed): 32 random bits per element, drawn two elements
  per 64-bit draw, and a multiply: forward + backward 2.3x faster than
  the `bernoulli_` of Keras' `F.dropout`.
- `summed_gradients` (PyTorch eager training only; `TransformerEncoder`
  runs its blocks through it over its shared Jumbo FFN): a kernel used
  by several `linear` calls in one forward pass gets its gradient from
  one product over the rows of all its uses instead of one product and
  one kernel-sized addition per use (JumboViT pico, official
  architecture: training step 1.02-1.05x in-process, 1.08x the official
  eager step side by side).

Each of the first five is the `keras.ops` formula on JAX and TensorFlow, for
symbolic inputs (`keras.KerasTensor`), and whenever the PyTorch kernel's
preconditions do not hold; on PyTorch tensors it calls the kernel. Each is
tested equal to the `keras.ops` formula on every backend
(`tests/test_torch_kernels.py`). `linear`'s formula multiplies the input
as 2-D rows, which gives XLA a copy-free kernel gradient (see its
docstring).
"""

import contextvars
import weakref

import keras
from keras import ops

from keras_jumbo._half_precision import matmul


def torch_tensors(*tensors):
    """Whether the backend is PyTorch and every non-None argument is a
    `torch.Tensor` (not a `keras.KerasTensor` or a numpy array)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    # A loop, not `all(...)` over a generator: this runs several times per
    # layer call in eager PyTorch.
    for tensor in tensors:
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            return False
    return True


def value_as(variable, x):
    """`ops.cast(variable, x.dtype)`: a layer's weight in the dtype of its
    input `x`. On PyTorch, for a variable (read without Keras' op dispatch
    and autocast cast: `_keras_internals.stored_value`), its stored tensor
    itself when it has that dtype already (the usual float32 case: Keras'
    `ops.cast` of a variable costs ~8 us per call in eager PyTorch, its
    op dispatch and tree walks, the stored tensor ~1 us, and a ViT block
    reads ~14 weights per call), else `_cast_weight` of it. The same
    values either way; elsewhere `ops.cast`."""
    if isinstance(variable, keras.Variable) and torch_tensors(x):
        from keras_jumbo._keras_internals import stored_value

        value = stored_value(variable)
        if value is None:
            value = variable.value
        if value.dtype == x.dtype:
            return value
        return _cast_weight(value, x.dtype)
    return ops.cast(variable, x.dtype)


# Whether `value_as` keeps the copies it casts a weight to for calls whose
# gradient is not needed (`_cast_weight`), and how many bytes of such
# copies it holds at most (a bfloat16 copy of every weight of Jumbo base:
# ~1.1 GiB). Past the budget, weights are cast at every call.
CAST_WEIGHTS = True
CAST_WEIGHTS_MAX_BYTES = 2**30
# {(id(weight), dtype): _KeptCopy} for `_cast_weight`.
_CAST = {}


def _cast_weight(value, dtype):
    """`value` (a variable's stored PyTorch tensor) cast to `dtype`, as
    Keras' autocast does (`Tensor.to`).

    Under a mixed-precision policy Keras casts a float32 weight to the
    compute dtype at every read: a weight shared by several layer calls
    (the official Jumbo's one Jumbo FFN, read by all 12 blocks) is cast
    at each, and every weight again at every call of the model (eager
    pico predict at batch 64 under `mixed_bfloat16`, 2 Xeon cores: ~150
    casts, ~14 ms of a ~105 ms step). Where no gradient is needed (and not
    under `torch.compile`, which traces its own casts), the cast copy is
    kept while the weight and its values live (`_kept_copy`, made at the
    first call that sees them; `CAST_WEIGHTS_MAX_BYTES`) and reused: the
    same values bit for bit. With `CAST_WEIGHTS` off, or where a gradient
    is needed (autograd records the cast), every call casts."""
    import torch

    if (
        CAST_WEIGHTS
        and not _needs_grad((value,))
        and not torch.compiler.is_compiling()
    ):
        kept = _kept_copy(
            _CAST,
            (id(value), dtype),
            value,
            lambda v: v.to(dtype),
            value.numel() * dtype.itemsize,
            CAST_WEIGHTS_MAX_BYTES,
            first_seen=True,
        )
        if kept is not None:
            return kept
    return value.to(dtype)


def exact_gelu(x):
    """`ops.gelu(x, approximate=False)`. On a PyTorch tensor:
    `F.gelu` itself, the function Keras' op calls there."""
    if torch_tensors(x):
        from torch.nn import functional

        return functional.gelu(x)
    return ops.gelu(x, approximate=False)


def concatenate(tensors, axis):
    """`ops.concatenate(tensors, axis=axis)`. On PyTorch tensors of one
    dtype: `torch.cat` (without Keras' dtype promotion across the list)."""
    if torch_tensors(*tensors) and len({t.dtype for t in tensors}) == 1:
        import torch

        return torch.cat(tensors, dim=axis)
    return ops.concatenate(tensors, axis=axis)


def linear(x, kernel, bias=None):
    """`x @ kernel + bias` for a `(..., in)` input, an `(in, out)` kernel
    and an `(out,)` bias (or None), all of one dtype.

    On PyTorch tensors: `torch.nn.functional.linear` (one `addmm` that
    starts from the bias; same values to float rounding). Elsewhere:
    `ops.matmul(x, kernel) + bias`, over the rows of `x` flattened to 2-D
    when it has more axes and its inner ones are static. The values are the
    same; what changes is the gradient: the autodiff of a `(batch, length,
    in) @ (in, out)` matmul gives XLA a kernel gradient that contracts two
    axes, which it computes by first transposing the whole upstream
    gradient, while the 2-D form's is one plain `xᵀ·g` matmul. Measured in
    one process, interleaved (official Jumbo pico, 128 px, batch 32,
    `train_on_batch`): JAX 259-264 -> 231-237 ms per step, TensorFlow + XLA
    236 -> 228 ms; inference and TensorFlow without XLA unchanged
    (benchmarks/README.md, "A dense layer's kernel gradient, 2-D"). The
    product is `keras_jumbo._half_precision.matmul`: on JAX's CPU a
    bfloat16 / float16 product accumulates in float32 on the CPU's
    half-precision kernels.
    """
    if torch_tensors(x, kernel, bias) and len(kernel.shape) == 2:
        from torch.nn import functional

        tensors = (x, kernel) if bias is None else (x, kernel, bias)
        weight = _onednn_weight(x, kernel, tensors)
        summed = _summed_uses(kernel, bias)
        if summed is not None:
            return _summed_linear(x, *summed, weight is not None)
        if weight is not None:
            return _onednn_linear(x, kernel, bias, tensors, weight)
        return functional.linear(x, kernel.T, bias)
    rank, inner = len(x.shape), tuple(x.shape[1:-1])
    if (
        rank <= 2
        or len(kernel.shape) != 2
        or not all(isinstance(d, int) for d in inner)
    ):
        return matmul(x, kernel, bias)
    # A static batch size is kept so that empty inputs reshape back too.
    batch = x.shape[0] if isinstance(x.shape[0], int) else -1
    y = matmul(ops.reshape(x, (-1, kernel.shape[0])), kernel, bias)
    return ops.reshape(y, (batch, *inner, kernel.shape[1]))


def linear_gelu(x, kernel, bias=None):
    """`exact_gelu(linear(x, kernel, bias))`.

    On eager PyTorch, a call without gradient that `linear` runs on
    oneDNN (float32, at least `ONEDNN_MIN_MACS`, where
    `onednn_preferred(training=False)`) applies the GELU as oneDNN's
    post-op, inside the matmul: one pass over the hidden activations
    instead of a product that writes them and an `F.gelu` that reads them
    back. The same values as the two ops (bit for bit on 2 Zen 4 and Xeon
    cores); a pico Jumbo's `predict_on_batch` 1.025x faster at batch 64
    (2 Zen 4 cores, in-process A/B, two runs; benchmarks/README.md,
    fifty-second session). Calls that need a gradient keep the two ops
    (the backward pass reads the GELU's input).
    """
    if torch_tensors(x, kernel, bias) and len(kernel.shape) == 2:
        tensors = (x, kernel) if bias is None else (x, kernel, bias)
        if not _needs_grad(tensors) and _summed_uses(kernel, bias) is None:
            weight = _onednn_weight(x, kernel, tensors)
            if weight is not None:
                return _onednn_matmul(x, weight, bias, activation="gelu")
    return exact_gelu(linear(x, kernel, bias))


# `linear` on PyTorch: the smallest product (rows x in x out) for which
# oneDNN's kernel is used where `onednn_preferred()`. Below ~2M
# multiply-adds its per-call overhead (~13 us against MKL's ~3 us) wins
# (2 Zen 5 cores: 0.6x at 0.5M, 1.0-1.1x at 2.1-2.4M, 1.3x at 4.7M, 1.7-2.1x
# from 8M; benchmarks/README.md, "PyTorch: oneDNN's matmul for large
# dense layers").
ONEDNN_MIN_MACS = 2**22
# The same on an Intel CPU (inference only), where MKL runs its AVX-512
# kernels. On 2 Xeon cores oneDNN's speed against MKL's, on a plain weight:
# 0.5-0.9x at 0.5-10M multiply-adds, 0.96x at 21M, 1.05-1.13x at 41M,
# 1.03-1.21x from 62M, but 0.65-0.68x for few rows into many outputs (32 x
# 1152 x 4608, 80 x 768 x 3072: a Jumbo FFN's and a ViT-Res stage's first
# layer), whose time went into reordering the weight at every call; on the
# weight packed once (`_packed_weight`), 1.12-1.39x there (benchmarks/
# README.md, thirty-seventh and thirty-eighth sessions).
ONEDNN_MIN_MACS_INTEL = 2**25
_ONEDNN = {}


def onednn_preferred(training=True):
    """Whether eager PyTorch should run large float32 dense layers on
    oneDNN's matmul (`torch.ops.mkldnn._linear_pointwise`) rather than
    `F.linear`'s BLAS (MKL in PyTorch's x86 wheels): with `training`, for
    a call whose gradient is needed (forward and gradients on oneDNN);
    without, for one whose gradient is not (inference).

    MKL runs its AVX2 kernels on AMD CPUs: on 2 Zen 5 cores (full-width
    AVX-512) a 2048^3 `torch.matmul` reaches ~210 GFLOP/s where oneDNN, in
    the same wheel, reaches ~480 (and XLA ~460). On Intel CPUs MKL runs
    its AVX-512 kernels, and the two are closer: on 2 Xeon cores (family
    6 model 207) oneDNN's forward products made pico Jumbo's eager predict
    1.05x faster (1.08-1.15x per product), but its gradient products made
    the training step 0.88x. So: oneDNN on a Linux x86 AMD CPU
    ("AuthenticAMD" in /proc/cpuinfo) for every call, on an Intel one
    ("GenuineIntel") for inference only, where the PyTorch has oneDNN and
    the op; `F.linear` elsewhere (ARM, other systems). Decided once per
    process."""
    key = "preferred" if training else "inference"
    if key not in _ONEDNN:
        vendors = ("AuthenticAMD",)
        vendors += () if training else ("GenuineIntel",)
        _ONEDNN[key] = _cpu_vendor() in vendors and _has_onednn_linear()
    return _ONEDNN[key]


def _cpu_vendor():
    """The CPU's `vendor_id` from /proc/cpuinfo (Linux x86), or ""."""
    from keras_jumbo.runtime import cpu_fields

    return cpu_fields().get("vendor_id", "")


def _has_onednn_linear():
    import torch

    try:
        return torch.backends.mkldnn.is_available() and hasattr(
            torch.ops.mkldnn, "_linear_pointwise"
        )
    except (AttributeError, RuntimeError):
        return False


def _onednn_weight(x, kernel, tensors):
    """The weight (out x in) to run this `linear` call on oneDNN with, or
    None for `F.linear` (`tensors`: its non-None arguments): float32 CPU
    tensors, not under `torch.compile` (Inductor picks its own kernels), a
    product of at least `ONEDNN_MIN_MACS` multiply-adds
    (`ONEDNN_MIN_MACS_INTEL` on an Intel CPU) and `onednn_preferred()` for
    a call whose gradient is needed or not. For a call without gradient,
    the kernel in oneDNN's packed layout once `_packed_weight` holds it;
    otherwise `kernel.T`. Which kernel runs depends on the shapes and the
    CPU only, never on earlier calls: the packed and the plain weight give
    the same values bit for bit."""
    import torch

    if x.ndim < 2 or torch.compiler.is_compiling():
        return None
    # The size before the dtypes: it turns most small products away
    # (eager PyTorch runs this at every dense layer call).
    rows = x.numel() // max(kernel.shape[0], 1)
    if rows * kernel.shape[0] * kernel.shape[1] < _onednn_minimum():
        return None
    for tensor in tensors:
        if tensor.dtype != torch.float32 or tensor.device.type != "cpu":
            return None
    training = _needs_grad(tensors)
    if not onednn_preferred(training):
        return None
    packed = None if training else _packed_weight(kernel)
    return kernel.T if packed is None else packed


# Whether `linear` keeps oneDNN's packed layout of the kernels of its
# inference calls (`_packed_weight`), and how many bytes of such copies it
# holds at most (over all live kernels): the registry's Jumbo tiny packs
# 505 of its 511 MiB of weights, Jumbo base 2250 of 2263 MiB. Past the
# budget, kernels run on the plain weight (the same values).
PACKED_WEIGHTS = True
PACKED_WEIGHTS_MAX_BYTES = 2**30
# {id(kernel): _KeptCopy} for `_packed_weight`.
_PACKED = {}


class _KeptCopy:
    """An entry of a table of copies made from a kernel's values
    (`_kept_copy`): a weak reference to the kernel, the stamp of the values
    last seen (`_stamp`), the copy made of them (None until made; False
    where it would exceed the table's budget) and its size in bytes."""

    __slots__ = ("ref", "stamp", "copy", "size")

    def __init__(self, kernel, stamp, table, key):
        # The table itself, not the module global: a kernel that outlives
        # the module (a script's global, freed at interpreter exit after
        # the modules' globals are cleared) still finds it.
        def forget(_):
            if table.get(key) is self:
                del table[key]

        self.ref = weakref.ref(kernel, forget)
        self.stamp, self.copy, self.size = stamp, None, 0


def _stamp(kernel):
    """What identifies a kernel's values between calls: autograd's version
    counter (in-place writes through PyTorch's ops move it: Keras'
    `assign`, `load_weights`, Keras' optimizers and the library's `AdamW`,
    which moves it after torch's fused kernel, whose writes do not), its
    storage, shape and strides; None for a tensor without a version
    counter (made under `torch.inference_mode()`). A write the counter does
    not see (through `tensor.data`, or a fused optimizer kernel outside
    the library) is not seen here either: set `PACKED_WEIGHTS = False`
    and `CAST_WEIGHTS = False` for such code."""
    try:
        version = kernel._version
    except RuntimeError:
        return None
    return (version, kernel.data_ptr(), tuple(kernel.shape), kernel.stride())


def _kept_copy(table, key, kernel, make, size, max_bytes, first_seen):
    """`make(kernel)`, a copy of `size` bytes made from `kernel`'s values,
    kept in `table[key]` while the kernel lives and its values keep their
    `_stamp`; None where no copy is held (the caller uses the kernel
    itself).

    A copy is made on the first call that sees a kernel's values with
    `first_seen`, otherwise on the second call that sees the same values
    (a kernel written between every two calls, a training step's, is then
    never copied for one use); any write is seen at the next call, which
    makes (or waits for) a new copy. A copy that would take the table's
    copies past `max_bytes` in all is not made until the kernel's values
    change again. A kernel without a stamp is never copied."""
    stamp = _stamp(kernel)
    if stamp is None:
        return None
    entry = table.get(key)
    if entry is None or entry.ref() is not kernel:
        entry = table[key] = _KeptCopy(kernel, stamp, table, key)
        if not first_seen:
            return None
    elif entry.stamp != stamp:
        entry.stamp, entry.copy = stamp, None
        if not first_seen:
            return None
    if entry.copy is None:
        if _kept_bytes(table) + size > max_bytes:
            entry.copy = False
        else:
            entry.copy, entry.size = make(kernel), size
    return None if entry.copy is False else entry.copy


def _kept_bytes(table):
    """The bytes of the copies `table` holds for live kernels."""
    total = 0
    for entry in list(table.values()):
        copy = entry.copy
        if entry.ref() is not None and copy is not None and copy is not False:
            total += entry.size
    return total


def _packed_weight(kernel):
    """oneDNN's packed layout of `kernel.T` for inference calls of
    `linear`, or None.

    oneDNN's matmul on a plain weight first reorders it into its blocked
    layout, at every call: for few rows into many outputs that reorder
    costs more than the product takes (a Jumbo FFN's 64 x 576 x 2304 ran
    0.65-0.68x MKL's speed on the plain weight, 1.12-1.39x packed; 2 Xeon
    cores; the values are the same bit for bit). The layout is made (one
    reorder, made without a row count: the same layout for every call)
    on the second call that sees the same values of the kernel
    (`_kept_copy`): packing alone costs several plain calls, so a kernel
    written between every two calls is not packed for one use. The layout
    is a second copy of the kernel, held while the kernel lives, as long
    as all such copies stay within `PACKED_WEIGHTS_MAX_BYTES`. With
    `PACKED_WEIGHTS` off, nothing is packed."""
    if not PACKED_WEIGHTS:
        return None
    import torch

    return _kept_copy(
        _PACKED,
        id(kernel),
        kernel,
        lambda k: torch.ops.mkldnn._reorder_linear_weight(k.T),
        kernel.numel() * kernel.element_size(),
        PACKED_WEIGHTS_MAX_BYTES,
        first_seen=False,
    )


def _onednn_minimum():
    """The smallest product (multiply-adds) oneDNN is used for on this
    CPU; decided once per process."""
    if "minimum" not in _ONEDNN:
        intel = _cpu_vendor() == "GenuineIntel"
        _ONEDNN["minimum"] = ONEDNN_MIN_MACS_INTEL if intel else ONEDNN_MIN_MACS
    return _ONEDNN["minimum"]


def _needs_grad(tensors):
    """Whether autograd records a call on `tensors`."""
    import torch

    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _onednn_matmul(a, weight, bias=None, activation="none"):
    """`a @ weight.T + bias` on oneDNN (its convention: `weight` is
    out x in), with `activation="gelu"` the exact GELU of it, applied by
    oneDNN inside the matmul (its "post-op")."""
    import torch

    algorithm = "none" if activation == "gelu" else ""
    return torch.ops.mkldnn._linear_pointwise(
        a, weight, bias, activation, [], algorithm
    )


def _onednn_kernel_gradient(inputs, grads):
    """`inputsᵀ·grads` on oneDNN for 2-D row-major `inputs` (rows x in)
    and `grads` (rows x out): a dense layer's kernel gradient, `(in,
    out)`, contiguous.

    oneDNN's op reads its weight operand strided as it is, but makes its
    first operand contiguous, here a transposed copy (~1 ms for pico
    fc2's 2048 x 384 input inside a training step). So the product is
    taken in the orientation that copies fewer values: `inputsᵀ` (in x
    rows) as the first operand, or `gradsᵀ` (out x rows) and the `(out,
    in)` result transposed back (autograd would copy a transposed
    gradient into the kernel's layout anyway). Pico's fc2 (2048 rows, 384
    -> 96) copies 3.4x fewer values the second way: 1.72 -> 1.10 ms a
    call inside the training step, 2 Zen 4 cores (benchmarks/README.md,
    fifty-first session). The same values up to float rounding (oneDNN's
    sums run in another order)."""
    rows, width_in = inputs.shape
    width_out = grads.shape[1]
    if width_out * (rows + width_in) < width_in * rows:
        return _onednn_matmul(grads.T, inputs.T).T.contiguous()
    return _onednn_matmul(inputs.T, grads.T)


def _onednn_linear(x, kernel, bias, tensors, weight):
    """`x @ kernel + bias` on oneDNN's matmul, with `weight` (`kernel.T`
    or its packed layout) where no gradient is needed; where one is,
    through `_onednn_linear_function()`, whose backward runs its two
    products on oneDNN too."""
    if _needs_grad(tensors):
        return _onednn_linear_function().apply(x, kernel, bias)
    return _onednn_matmul(x, weight, bias)


def _onednn_linear_function():
    """A `torch.autograd.Function` for `linear` on oneDNN (its op has no
    autograd formula): forward `x·kernel + bias`; backward
    `g·kernelᵀ` (input), `xᵀ·g` over the flattened rows (kernel) and the
    row sum of `g` (bias), each computed only where needed. Built once,
    on first use (PyTorch is imported only on its backend)."""
    if "function" in _ONEDNN:
        return _ONEDNN["function"]
    import torch

    class OneDNNLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, kernel, bias):
            ctx.save_for_backward(x, kernel)
            ctx.has_bias = bias is not None
            return _onednn_matmul(x, kernel.T, bias)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            x, kernel = ctx.saved_tensors
            # Contiguous rows: an upstream gradient can arrive as a
            # strided view (the Jumbo FFN's: the first J tokens of each
            # sequence, rows 70 x 96 floats apart in pico), and oneDNN's
            # kernel gradient on its transpose took 441 ms instead of
            # 0.2 ms.
            rows = grad.reshape(-1, grad.shape[-1]).contiguous()
            grad_x = grad_kernel = grad_bias = None
            if ctx.needs_input_grad[0]:
                grad_x = _onednn_matmul(rows, kernel).reshape(x.shape)
            if ctx.needs_input_grad[1]:
                inputs = x.reshape(-1, x.shape[-1]).contiguous()
                grad_kernel = _onednn_kernel_gradient(inputs, rows)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_bias = rows.sum(0)
            return grad_x, grad_kernel, grad_bias

    _ONEDNN["function"] = OneDNNLinear
    return OneDNNLinear


# The parameters whose gradient `linear` sums once per backward pass, inside
# `summed_gradients`: {id(parameter): _Uses}.
_SUMMED = contextvars.ContextVar("keras_jumbo_summed_gradients", default=None)
_SUMMED_FUNCTIONS = {}


def summed_gradients(variables, function):
    """`function()`, during which eager PyTorch computes the gradient of
    each of `variables` used as a `linear` kernel or bias once per
    backward pass, from the rows of all its uses, instead of once per
    use.

    A kernel used L times in a forward pass (the Jumbo FFN that
    `TransformerEncoder` shares between its blocks: 12 uses of two
    `576 x 2304` kernels in pico) gets L gradient products `x_lᵀ·g_l`,
    each writing a fresh kernel-sized tensor from a handful of rows
    (batch 32: the Jumbo token of each image), and L - 1 kernel-sized
    additions: 31 ms of a 247 ms pico training step (`torch.profiler`,
    batch 32, 128 px). The sum is the one product
    `[x_1; ...; x_L]ᵀ·[g_1; ...; g_L]`: the same number of
    multiply-adds, one output (1.7-2.7x faster for these shapes;
    benchmarks/README.md, "Eager PyTorch: the shared Jumbo FFN's kernel
    gradient once"). Each use's backward keeps its rows (its input and
    the incoming gradient); the parameter's own node, which autograd runs
    after every use reached by the pass, multiplies them. The values are
    the sum's up to float rounding (its order changes).

    It applies on the PyTorch backend, with gradients enabled and not
    under `torch.compile` (Inductor plans the step itself), to the
    trainable variables among `variables` whose values `linear` receives
    unchanged (float32 under the default policy; a mixed-precision cast
    makes a new tensor per use, which keeps the usual gradient).
    Elsewhere it only calls `function`: JAX and TensorFlow differentiate
    the traced step whole. It is a call, not a `with` block, so that
    `torch.compile` traces nothing of it but `function` (Dynamo breaks
    the graph at a generator context manager and at a `ContextVar`; a
    break in every block made the compiled pico predict step 1.5x
    slower).

    Args:
        variables: the `keras.Variable`s to sum (e.g. a shared layer's
            `trainable_variables`).
        function: a callable of no arguments (the forward pass).

    Returns:
        `function()`.
    """
    entries = _summed_entries(variables)
    if not entries:
        return function()
    token = _SUMMED.set(entries)
    try:
        return function()
    finally:
        _SUMMED.reset(token)


def _summed_entries(variables):
    if not variables or keras.backend.backend() != "torch":
        return None
    import torch

    if torch.compiler.is_compiling() or not torch.is_grad_enabled():
        return None
    entries = {}
    for variable in variables:
        value = variable.value
        if isinstance(value, torch.Tensor) and value.requires_grad:
            entries[id(value)] = _Uses(value)
    return entries


class _Uses:
    """One parameter's uses in one forward pass: the proxy the uses
    multiply by (made at the first use) and the rows each use's backward
    leaves, by use index."""

    def __init__(self, parameter):
        self.parameter = parameter
        self.proxy = None
        self.count = 0
        self.rows = {}

    def take(self):
        """(proxy, index) for one more use."""
        if self.proxy is None:
            self.proxy = _summed_functions()["gather"].apply(
                self.parameter, self
            )
        self.count += 1
        return self.proxy, self.count - 1


def _summed_uses(kernel, bias):
    """`(kernel uses, bias uses or None)` when `linear(x, kernel, bias)`
    sums its gradients (`summed_gradients`), else None. Under
    `torch.compile` it reads nothing (Dynamo cannot trace a `ContextVar`)."""
    import torch

    if torch.compiler.is_compiling():
        return None
    entries = _SUMMED.get()
    if entries is None:
        return None
    kernel_uses = entries.get(id(kernel))
    bias_uses = None if bias is None else entries.get(id(bias))
    if kernel_uses is None or (bias is not None and bias_uses is None):
        return None
    if not torch.is_grad_enabled() or kernel_uses.parameter is not kernel:
        return None
    return kernel_uses, bias_uses


def _summed_linear(x, kernel_uses, bias_uses, onednn):
    kernel, kernel_index = kernel_uses.take()
    bias, bias_index = (None, None) if bias_uses is None else bias_uses.take()
    return _summed_functions()["use"].apply(
        x,
        kernel,
        bias,
        (kernel_uses, kernel_index, bias_uses, bias_index, onednn),
    )


def _graph_task():
    """The id of the backward pass running (PyTorch's graph task id, as
    `torch.utils.checkpoint` reads it), or None where PyTorch has no such
    function."""
    import torch

    current = getattr(torch._C, "_current_graph_task_id", None)
    return None if current is None else current()


def _summed_functions():
    """The two `torch.autograd.Function`s of `summed_gradients`, built on
    first use: `gather` (forward: the parameter itself; backward: the
    gradient of all its uses from their rows) and `use` (forward: the
    `linear` product; backward: the input's gradient, leaving its rows
    for `gather`)."""
    if _SUMMED_FUNCTIONS:
        return _SUMMED_FUNCTIONS
    import torch
    from torch.nn import functional

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, parameter, uses):
            ctx.uses = uses
            ctx.set_materialize_grads(False)
            return parameter.view_as(parameter)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            # The rows this backward pass left (a pass that stopped short
            # of this node, e.g. `autograd.grad` for an input only, may
            # have left rows of uses this pass did not reach).
            task = _graph_task()
            rows = [
                row[1:]
                for _, row in sorted(ctx.uses.rows.items())
                if row[0] == task
            ]
            ctx.uses.rows = {}
            if not rows:
                return grad, None
            inputs, grads, onednn = zip(*rows, strict=True)
            if inputs[0] is None:  # a bias: its uses' row sums
                total = torch.stack(grads).sum(0)
            else:
                inputs, grads = torch.cat(inputs), torch.cat(grads)
                if onednn[0]:
                    total = _onednn_kernel_gradient(inputs, grads)
                else:
                    total = inputs.T @ grads
            return (total if grad is None else total + grad), None

    class Use(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, kernel, bias, plan):
            ctx.save_for_backward(x, kernel)
            ctx.plan = plan
            if plan[4]:
                return _onednn_matmul(x, kernel.T, bias)
            return functional.linear(x, kernel.T, bias)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            x, kernel = ctx.saved_tensors
            kernel_uses, kernel_index, bias_uses, bias_index, onednn = ctx.plan
            rows = grad.reshape(-1, grad.shape[-1]).contiguous()
            grad_x = None
            if ctx.needs_input_grad[0]:
                if onednn:
                    grad_x = _onednn_matmul(rows, kernel)
                else:
                    grad_x = rows @ kernel.T
                grad_x = grad_x.reshape(x.shape)
            task = _graph_task()
            if ctx.needs_input_grad[1]:
                inputs = x.reshape(-1, x.shape[-1])
                kernel_uses.rows[kernel_index] = (task, inputs, rows, onednn)
            if bias_uses is not None and ctx.needs_input_grad[2]:
                bias_uses.rows[bias_index] = (task, None, rows.sum(0), onednn)
            return grad_x, None, None, None

    _SUMMED_FUNCTIONS.update(gather=Gather, use=Use)
    return _SUMMED_FUNCTIONS


def reshape(x, shape):
    """`ops.reshape(x, shape)` for a tuple of ints `shape` (one may be
    -1). On a PyTorch tensor: `torch.reshape`, without `ops.reshape`'s
    pytree scan of `shape`."""
    if torch_tensors(x):
        return x.reshape(shape)
    return ops.reshape(x, shape)


def unstack(x, axis):
    """`ops.unstack(x, axis=axis)`: the slices of `x` along `axis`. On a
    PyTorch tensor: `torch.unbind`, whose gradient is one `stack` of the
    slices' gradients. Indexing each slice instead (`y[:, :, i]`) makes
    autograd fill a zero tensor of `x`'s shape per slice, copy the
    slice's gradient into it and add them up (the q/k/v split of eager
    attention: 3 fills, 3 copies and 2 adds of `(batch, length, 3,
    heads, head_dim)` per block)."""
    if torch_tensors(x):
        return x.unbind(axis)
    return ops.unstack(x, axis=axis)


def layer_norm(x, gamma, beta, epsilon):
    """`ops.layer_normalization(x, gamma, beta, epsilon=epsilon)` over the
    last axis. On PyTorch tensors: `F.layer_norm` directly where all three
    are float32 (what Keras calls there too, without its dtype
    bookkeeping); and for a bfloat16 / float16 `x` with float32 `gamma`
    and `beta` (Keras' normalisation layers do not autocast their weights)
    where no gradient is needed, `F.layer_norm` on them as they are:
    torch's mixed-dtype kernel computes in float32 and rounds its result
    to `x`'s dtype once, as Keras' float32 computation and cast do (each
    value within one rounding of the float64 result; the two roundings
    differ in 0.002-0.02% of the values), without the two casts of the whole
    tensor (eager pico predict at batch 64 under `mixed_bfloat16`, 2 Xeon
    cores: ~1.08x). Its gradients are not used: the kernel's gamma
    gradient strays far more than float32's (9% of the largest against
    1e-6, bfloat16 input). Other dtypes, and half precision where a
    gradient is needed, go through `ops.layer_normalization`, which
    computes in float32."""
    if torch_tensors(x, gamma, beta):
        import torch
        from torch.nn import functional

        wide = gamma.dtype == torch.float32 and beta.dtype == torch.float32
        if wide and (
            x.dtype == torch.float32
            or (
                x.dtype in (torch.bfloat16, torch.float16)
                and not _needs_grad((x, gamma, beta))
            )
        ):
            return functional.layer_norm(
                x, (x.shape[-1],), gamma, beta, epsilon
            )
    return ops.layer_normalization(x, gamma, beta, epsilon=epsilon)


def batch_norm_applies(x, axis):
    """Whether `batch_norm` / `batch_norm_training` take `x`: a float32
    PyTorch tensor of rank 2 or more, normalised over axis 1 or its last
    axis (the layouts `F.batch_norm` reads as `(N, C, ...)` or, reshaped,
    `(N, C)`), with more than one value per channel."""
    if not torch_tensors(x):
        return False
    import torch

    rank = x.ndim
    return (
        x.dtype == torch.float32
        and rank >= 2
        and axis % rank in (1, rank - 1)
        and x.numel() > x.shape[axis]
    )


def _batch_norm(x, axis, mean, variance, scale, offset, epsilon, training):
    """`F.batch_norm` of `x` over `axis`: on `x` itself when `axis` is 1
    (its `(N, C, ...)` layout), else (the last axis) on its rows `(N, C)`.
    In training, momentum 1: the running statistics become the batch's."""
    from torch.nn import functional

    outputs = functional.batch_norm(
        x if axis % x.ndim == 1 else x.reshape(-1, x.shape[-1]),
        mean,
        variance,
        scale,
        offset,
        training=training,
        momentum=1.0,
        eps=epsilon,
    )
    return outputs.reshape(x.shape)


def batch_norm(x, axis, mean, variance, scale, offset, epsilon):
    """`ops.batch_normalization(x, mean, variance, axis, offset, scale,
    epsilon)` (Keras' batch normalisation with given statistics, e.g. the
    moving ones at inference) as one `F.batch_norm` call, for `x` that
    `batch_norm_applies` to; `scale` / `offset` may be None."""
    return _batch_norm(x, axis, mean, variance, scale, offset, epsilon, False)


def batch_norm_training(x, axis, scale, offset, epsilon):
    """Keras' training-time batch normalisation for `x` that
    `batch_norm_applies` to: `x` normalised with its own mean and biased
    variance over every axis but `axis`, the gradient flowing through
    them (`ops.moments`, then `ops.batch_normalization`). Returns
    `(outputs, mean, variance)`; `mean` and `variance` carry no gradient
    (the layer's moving averages take them).

    One `F.batch_norm(training=True)` call, with fresh zero buffers as its
    running statistics and momentum 1, so that it writes the batch mean
    and the unbiased variance into them; the biased variance is the
    latter times `(n - 1) / n`. (Keras computes the variance as `E[x²] -
    E[x]²`, torch in a stabler form: the same to float32 round-off.)"""
    import torch

    channels = x.shape[axis]
    count = x.numel() // channels
    mean, variance = (
        torch.zeros(channels, dtype=x.dtype, device=x.device) for _ in "mv"
    )
    outputs = _batch_norm(x, axis, mean, variance, scale, offset, epsilon, True)
    return outputs, mean, variance * ((count - 1) / count)


# Query length below which eager PyTorch on a CPU computes attention as
# two matmuls and a softmax rather than `F.scaled_dot_product_attention`:
# torch's fused CPU kernel works in blocks of 32 query rows below 192
# (64 from 192), and on these short sequences it is 1.1-2.4x slower than
# the three ops (2-core Zen 4, fp32, forward and backward; 197 tokens and
# more, the fused kernel is faster). benchmarks/README.md, "PyTorch
# attention on short sequences".
SHORT_ATTENTION_LENGTH = 192


def dot_product_attention(query, key, value, scale):
    """`ops.dot_product_attention(query, key, value, scale=scale)` for
    `(batch, length, heads, head_dim)` inputs, without mask or bias.

    On PyTorch tensors: on heads-first views of the inputs (the views, not
    contiguous copies), `F.scaled_dot_product_attention`, or, eagerly on a
    CPU with fewer than `SHORT_ATTENTION_LENGTH` queries, `softmax(q
    scale kᵀ) v` as two matmuls (the same function to float32 round-off,
    faster there). Elsewhere: `ops.dot_product_attention` (with
    `flash_attention=False`: Keras' own flash check builds a CUDA-only
    object, a graph break under `torch.compile`).
    """
    if torch_tensors(query, key, value):
        import torch
        from torch.nn import functional

        q, k, v = (t.transpose(1, 2) for t in (query, key, value))
        if (
            q.device.type == "cpu"
            and q.shape[-2] < SHORT_ATTENTION_LENGTH
            and not torch.compiler.is_compiling()
        ):
            probs = torch.softmax(
                torch.matmul(q * scale, k.transpose(-1, -2)), dim=-1
            )
            out = torch.matmul(probs, v)
        else:
            out = functional.scaled_dot_product_attention(q, k, v, scale=scale)
        return out.transpose(1, 2)
    return ops.dot_product_attention(
        query, key, value, scale=scale, flash_attention=False
    )


def int32_keep_threshold(rate):
    """The int32 `t` below which a uniformly random int32 falls with
    probability `round((1 - rate) * 2**32) / 2**32`: the keep test of a
    dropout mask drawn as 32 random bits per element (`1 - rate` exact to
    2**-32)."""
    return min(round((1.0 - rate) * 2**32), 2**32 - 1) - 2**31


def unseeded_dropout(x, rate):
    """Inverted dropout of a PyTorch tensor from torch's global generator,
    what Keras' dropout does on PyTorch for a layer without a seed
    (`F.dropout`): each element kept with probability `1 - rate` and
    scaled by `1 / (1 - rate)`.

    Eagerly, the mask is 32 random bits per element, drawn as 64-bit
    integers over their full range (`random_(-2**63, None)`, two elements
    per draw) and compared with `int32_keep_threshold`, then multiplied in
    as a float mask (what `F.dropout` keeps for its gradient too). On CPU
    this is 1.6x faster forward + backward than a `torch.rand(...) < 1 -
    rate` mask applied with `torch.where`, and 2.3x faster than
    `F.dropout`'s `bernoulli_` (4.6 / 7.6 / 10.4 ms for a `(224, 42, 128)`
    tensor, 2 cores): torch draws random numbers on one core, so fewer,
    wider draws and one cheap multiply in each direction pay.
    `1 - rate` is exact to 2**-32 (a float32 `torch.rand` draw: 2**-24).
    Under `torch.compile` it is `torch.rand(...) < 1 - rate`, which the
    compiler generates inside its own fused kernel."""
    import torch

    keep = 1.0 - rate
    if torch.compiler.is_compiling():
        kept = torch.rand(x.shape, device=x.device) < keep
    else:
        size = x.numel()
        bits = torch.empty(
            ((size + 1) // 2,), dtype=torch.int64, device=x.device
        ).random_(-(2**63), None)
        bits = bits.view(torch.int32)[:size].view(x.shape)
        kept = bits < int32_keep_threshold(rate)
    return x * kept.to(x.dtype).mul_(1.0 / keep)
