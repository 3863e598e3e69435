"""The only module that touches private Keras attributes, and why.

Keras 3.15 has no public way to do these thirteen things:

- list every layer nested inside a layer (a custom layer's sublayers, e.g.
  the blocks of a `TransformerEncoder`): `Layer._flatten_layers`;
- walk a functional model's graph node by node (layer, input and output
  tensors of each call; `count_macs` needs the shapes of every call):
  `Functional._nodes_by_depth`;
- on JAX, copy the trainer's state back into the variables in the middle
  of `fit`, so a callback reads and writes the current values:
  `Model.jax_state_sync`;
- on PyTorch, empty the losses layers added with `add_loss` once a
  training step has used them: `Layer._clear_losses`;
- on eager PyTorch, call a built sublayer's `call` without the ~70 us of
  `Layer.__call__` when that machinery has nothing to do (`call_sublayer`
  below reads `Layer._remat_mode` and `torch.nn.Module`'s hook dicts to
  know, and `Layer._call_has_context_arg` to drop a `training` argument
  the layer's `call` does not take, as `__call__` does);
- on eager PyTorch, run a functional model's graph with each layer called
  through `call_sublayer` (`CallsLayersDirectly` below: ~1 ms of a pico
  ViT's forward pass): `Functional._standardize_inputs`,
  `Functional._run_through_graph` and `Operation._call_context_args`;
- on eager PyTorch, read a plain float `Dense` layer's kernel without the
  ~4 us of the `Dense.kernel` property (which imports and checks the
  quantisation modes at every read): `dense_weights` below reads
  `Dense._kernel`, which that property returns for such a layer;
- on eager PyTorch under a mixed-precision policy, read a variable's
  stored float32 tensor without the cast Keras' autocast applies at every
  read of `value`, to cast each weight once for as long as its values
  last (`_torch_kernels.value_as`): `stored_value` below reads
  `Variable._value`;
- update all of an optimizer's variables in one step (one fused kernel):
  Keras' only public hook is the per-variable `update_step`, so
  `keras_jumbo.optimizers.AdamW` overrides the whole-step hooks
  `_apply_weight_decay` / `_backend_update_step` and reads its slots with
  `adam_slots`, `decays_weight` and `torch_adam_update` below;
- quantise a model without a full garbage collection per layer: Keras'
  `Layer.__delattr__` runs `gc.collect()` each time a layer drops a
  variable, which every quantised Dense does (its float kernel), so
  `model.quantize` cost 0.15-1 s per layer, growing with the process's
  heap (`collect_garbage_once` below);
- on JAX, compile the steps Keras makes (`make_train_function`, ...)
  with XLA compiler options: Keras calls `jax.jit` through the module
  attribute `keras.src.backend.jax.trainer.jit` with none
  (`jax_jit_options` below; the options: `keras_jumbo.runtime`);
- on TensorFlow, create the optimizer's and the compiled metrics' variables
  before `fit` / `evaluate` trace their step: without a distribution
  strategy Keras creates them inside the step's first trace, and
  `tf.function` then traces the whole step a second time
  (`BuildsStateBeforeTracing` below calls the trainer's
  `_symbolic_build`, as Keras itself does under a strategy);
- on JAX with synchronous CPU dispatch, have each batch on the device
  before a step runs: the functions Keras' JAX trainer makes
  (`model.train_function`, ...) take `(state, iterator)` and draw their
  batches from the iterator inside, so `WaitsForBatches` below wraps
  that iterator (`jax_waits_for_batches`).

Everything else in keras_jumbo uses public Keras API only; if a future
Keras offers these, this module is the one place to change.
"""

import contextlib
import functools
import gc
import inspect

import keras
from keras.src.backend import get_autocast_scope
from keras.src.backend.common.stateless_scope import in_stateless_scope

from keras_jumbo._torch_kernels import torch_tensors


def _direct_call_ok(layer, inputs, args=(), kwargs=None):
    """Whether `layer.__call__(inputs, *args, **kwargs)` would only run
    `layer.call`.

    True on the PyTorch backend for a built float layer whose call Keras
    would not wrap in anything: no quantisation, rematerialisation,
    activity regulariser, new autocast scope (`_autocast_unchanged`) or
    input cast (the input, and every float tensor among the other
    arguments, already has the layer's input dtype), and no torch module
    hooks or tracing. Everything else goes through `__call__`.
    """
    if keras.backend.backend() != "torch" or not layer.built:
        return False
    if (
        getattr(layer, "quantization_mode", None) is not None
        or getattr(layer, "_remat_mode", None) is not None
        or layer.activity_regularizer is not None
        or not _autocast_unchanged(layer)
        or not keras.ops.is_tensor(inputs)
        or keras.backend.standardize_dtype(inputs.dtype) != layer.input_dtype
        or not _args_in_dtype(layer, args, kwargs)
    ):
        return False
    import torch
    from torch.nn.modules import module

    return not (
        torch._C._get_tracing_state()
        or layer._forward_hooks
        or layer._forward_pre_hooks
        or layer._backward_hooks
        or layer._backward_pre_hooks
        or module._global_forward_hooks
        or module._global_forward_pre_hooks
        or module._global_backward_hooks
        or module._global_backward_pre_hooks
    )


def _autocast_unchanged(layer):
    """Whether `Layer.__call__` would run `layer.call` under the autocast
    scope in effect (`keras.src.backend.get_autocast_scope`), as it does:
    outside any scope, for a layer whose compute and variable dtypes are
    one (a mixed-precision layer opens a scope of its compute dtype);
    inside one (a mixed-precision model's call opens it for everything
    it calls), for a float layer that autocasts, of the scope's compute
    dtype (Keras opens a scope of another dtype, or clears the scope for
    a layer with `autocast=False`). A layer whose class sets
    `calls_without_autocast = True` (`keras_jumbo.layers.
    LayerNormalization`: its call reads only weights Keras never casts
    and calls no layer) runs the same under any scope, and is called
    directly inside one too, whatever its `autocast`."""
    scope = get_autocast_scope()
    if scope is None:
        return layer.compute_dtype == layer.variable_dtype
    if getattr(type(layer), "calls_without_autocast", False):
        return True
    return (
        layer.autocast
        and scope.dtype is not None
        and layer.compute_dtype == scope.dtype
    )


def _args_in_dtype(layer, args, kwargs):
    """Whether `Layer.__call__` would pass `args` and `kwargs` on
    unchanged: every float tensor among them has the layer's input dtype
    (it casts the others) and none is an array it would convert (NumPy);
    a container argument (list, tuple, dict) is looked into with
    `keras.tree`."""
    values = (*args, *(kwargs or {}).values())
    if not values:
        return True
    flat = []
    for value in values:
        if isinstance(value, (list, tuple, dict)):
            flat.extend(keras.tree.flatten(value))
        else:
            flat.append(value)
    for value in flat:
        if keras.ops.is_tensor(value):
            dtype = keras.backend.standardize_dtype(value.dtype)
            if dtype.startswith(("float", "bfloat")) and dtype != (
                layer.input_dtype
            ):
                return False
        elif hasattr(value, "__array__"):  # converted to a tensor there
            return False
    return True


def call_sublayer(layer, inputs, *args, **kwargs):
    """`layer(inputs, *args, **kwargs)` for a block's built sublayer.

    On eager PyTorch `Layer.__call__` costs ~70 us per call around a
    LayerNorm whose kernel takes ~10 us, and a ViT block calls four to
    six sublayers; when that machinery would do nothing but call
    `layer.call` (see `_direct_call_ok`), this calls `layer.call`
    directly. The caller passes `training` explicitly when the sublayer
    takes it (the block's own, already resolved by its `__call__`, which
    keeps the call context for any layer called further in). Same
    outputs either way (tested); on JAX and TensorFlow, where the call is
    traced once, it is always `layer(...)`.
    """
    if _direct_call_ok(layer, inputs, args, kwargs):
        # As `__call__` does: drop a context argument (`training`) that
        # this layer's `call` does not take.
        takes = layer._call_has_context_arg
        kwargs = {
            name: value
            for name, value in kwargs.items()
            if takes.get(name, True)
        }
        return layer.call(inputs, *args, **kwargs)
    return layer(inputs, *args, **kwargs)


def stored_value(variable):
    """The tensor a variable stores (`Variable._value`), without Keras'
    autocast cast of `variable.value` under a mixed-precision policy; None
    where `value` is not that tensor (inside a `StatelessScope`, or before
    the variable is initialised): the caller reads `value` then."""
    if in_stateless_scope():
        return None
    return variable._value


def dense_weights(layer):
    """`(layer.kernel, layer.bias)` (variables) of a built
    `keras.layers.Dense` that is neither quantised nor LoRA-enabled (the
    caller checks): for such a layer the `kernel` property returns the
    `_kernel` variable itself, which this reads directly."""
    return layer._kernel, layer.bias


def adam_slots(optimizer, variable):
    """The Adam slot variables of `variable`: `(momentum, velocity,
    velocity_hat)`, the last `None` unless `amsgrad`."""
    index = optimizer._get_variable_index(variable)
    hat = optimizer._velocity_hats[index] if optimizer.amsgrad else None
    return optimizer._momentums[index], optimizer._velocities[index], hat


def decays_weight(optimizer, variable):
    """Whether the optimizer's weight decay applies to `variable`
    (`weight_decay` set and `variable` not excluded from it)."""
    return bool(optimizer.weight_decay) and optimizer._use_weight_decay(
        variable
    )


def torch_adam_update(optimizer, grads, variables, learning_rate):
    """Keras' own PyTorch Adam update (its `torch._foreach_*` passes) for
    an Adam-family `optimizer` that is not Keras' class itself."""
    import torch
    from keras.src.backend.torch.optimizers import torch_adam

    with torch.no_grad():
        torch_adam.Adam._parallel_update_step(
            optimizer, grads, variables, learning_rate
        )


def sublayers(layer, include_self=False):
    """Every layer inside `layer` (recursively), in tracking order."""
    if not hasattr(layer, "_flatten_layers"):
        return [layer] if include_self else []
    return list(layer._flatten_layers(include_self=include_self))


def find_layers(model, kind):
    """Every layer of type `kind` inside `model`, nested layers included."""
    return [layer for layer in sublayers(model) if isinstance(layer, kind)]


def is_functional(model):
    """Whether `model` has a functional graph to walk."""
    return hasattr(model, "_nodes_by_depth")


def graph_nodes(model):
    """The functional graph's nodes, from the inputs to the outputs."""
    nodes = model._nodes_by_depth
    return [
        node for depth in sorted(nodes, reverse=True) for node in nodes[depth]
    ]


def sync_state(model):
    """On JAX inside `fit`: write the trainer's state into the variables."""
    sync = getattr(model, "jax_state_sync", None)
    if sync is not None:
        sync()


def release_added_losses(model):
    """On PyTorch, after a training step: empty the losses that `model`'s
    layers added with `add_loss` (the Non-Deep ViT's diversity loss,
    attention-map distillation). Keras clears them only when the next call
    starts, so each step's loss tensor outlives the step; under
    `torch.compile` (`jit_compile=True`) Dynamo guards on that tensor and
    recompiled the whole step every time it was freed, i.e. at every step.
    The step has summed the losses already; nothing else reads them."""
    if keras.backend.backend() == "torch":
        model._clear_losses()


class ReleasesAddedLosses:
    """Mixin for a `keras.Model` subclass: its `train_step` ends with
    `release_added_losses` (list it before `keras.Model` in the bases)."""

    def train_step(self, *args, **kwargs):
        result = super().train_step(*args, **kwargs)
        release_added_losses(self)
        return result


class CallsLayersDirectly:
    """Mixin for a functional `keras.Model` subclass (list it before
    `keras.Model`): on eager PyTorch, its `call` runs the graph as
    Keras' `Functional.call` does, but calls each layer through
    `call_sublayer`, i.e. its `call` directly wherever `Layer.__call__`
    would only call it.

    A pico ViT has nine layers around its encoder, and their `__call__`
    (with the graph's bookkeeping) took ~1.1 ms of a 16 ms forward pass
    at batch 1 (2-core Xeon, benchmarks/README.md, thirty-ninth session).
    The same outputs (tested). It applies to a call on PyTorch tensors
    without a mask or extra arguments, not under `torch.compile`; every
    other call (JAX, TensorFlow, symbolic tensors, a layer whose call
    Keras must wrap) goes through Keras' own.
    """

    def call(self, inputs, training=None, mask=None, **kwargs):
        if mask is not None or kwargs or not _eager_torch(inputs):
            return super().call(inputs, training=training, mask=mask, **kwargs)
        outputs = self._run_through_graph(
            self._standardize_inputs(inputs),
            operation_fn=lambda layer: functools.partial(
                _call_node, layer, training
            ),
        )
        if isinstance(outputs, (list, tuple)) and len(outputs) == 1:
            return outputs[0]
        return outputs


def _eager_torch(inputs):
    """Whether `inputs` (a tensor or a structure of them) are PyTorch
    tensors and the call is not being compiled by `torch.compile`."""
    flat = keras.tree.flatten(inputs)
    if any(x is None for x in flat) or not torch_tensors(*flat):
        return False
    import torch

    return not torch.compiler.is_compiling()


def _call_node(layer, model_training, *args, **kwargs):
    """One node of `CallsLayersDirectly`'s graph: `layer(*args,
    **kwargs)` with the model's `training` where the layer takes it (as
    Keras' functional call passes it, over a `training` the node was
    built with), through `call_sublayer` for a layer of one positional
    input."""
    if model_training is not None and "training" in getattr(
        layer, "_call_context_args", {}
    ):
        kwargs["training"] = model_training
    if len(args) == 1:
        return call_sublayer(layer, *args, **kwargs)
    return layer(*args, **kwargs)


class BuildsStateBeforeTracing:
    """Mixin for a `keras.Model` subclass (list it before `keras.Model`):
    on TensorFlow, `fit` / `evaluate` / `train_on_batch` /
    `test_on_batch` create the optimizer's and the compiled metrics' and
    losses' variables before their step is traced.

    Keras 3.15 does this only under a distribution strategy; otherwise the
    variables appear inside the step's first trace, and `tf.function`
    traces a step that creates variables twice (once to lift them out,
    once without). The first `fit` of a pico Jumbo on 8x8 digits took
    about 15 s less with one trace (2-core Intel Xeon, CHANGELOG). The
    variables and their values are the same either way (zeros until the
    first step). Other backends: unchanged (the JAX trainer builds this
    state before its step already; PyTorch steps are eager).
    """

    # Only Keras' TensorFlow trainer has (and calls) this hook.
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        if self._distribute_strategy is not None:
            return  # Keras has built it.
        if data_batch is None:
            # The dataset's element spec: shapes and dtypes, no data read.
            data_batch = iterator._get_iterator().element_spec
        self._symbolic_build(data_batch=data_batch)


@contextlib.contextmanager
def collect_garbage_once():
    """Inside the block, `gc.collect()` does nothing; one collection runs
    at its end.

    Keras' `Layer.__delattr__` collects after each variable a layer drops
    (so the device frees its buffer at once); quantising or re-quantising
    a model drops one kernel per Dense layer. One collection after all of
    them frees the same buffers. Nested blocks collect once, at the end of
    the outermost. The switch is process-wide: another thread's
    `gc.collect()` inside the block is deferred to its end as well.
    """
    collect = gc.collect
    if getattr(collect, "_deferred", False):
        yield
        return

    def deferred(*args, **kwargs):
        return 0

    deferred._deferred = True
    gc.collect = deferred
    try:
        yield
    finally:
        gc.collect = collect
        collect()


def _takes(function, argument):
    """Whether `function` takes the keyword argument `argument`."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return argument in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )


@contextlib.contextmanager
def jax_jit_options(**options):
    """Inside the block, Keras' JAX trainer jits the steps it makes with
    these extra `jax.jit` arguments (e.g. `compiler_options={...}`).

    Keras' `make_train_function` / `make_test_function` /
    `make_predict_function` call `keras.src.backend.jax.trainer.jit`
    (`jax.jit`, or Flax's `nnx.jit` when Keras runs Flax NNX modules) when
    they make a step; this block binds the arguments to it. Nothing
    changes when there are no arguments, the backend is not JAX, or that
    `jit` does not take one of them. The switch is process-wide: another
    thread making a Keras step inside the block gets the arguments too.
    """
    trainer = None
    if options and keras.backend.backend() == "jax":
        from keras.src.backend.jax import trainer
    jit = getattr(trainer, "jit", None)
    if jit is None or not all(_takes(jit, name) for name in options):
        yield
        return
    trainer.jit = functools.partial(jit, **options)
    try:
        yield
    finally:
        trainer.jit = jit


def _on_device_and_ready(batch):
    """`batch` (a tree of arrays) with its NumPy arrays put on JAX's
    default device, once every array in it has arrived there."""
    import jax
    import numpy as np

    batch = jax.tree_util.tree_map(
        lambda x: jax.device_put(x) if isinstance(x, np.ndarray) else x,
        batch,
    )
    return jax.block_until_ready(batch)


def _ready_batches(iterator):
    """The batches of `iterator`, each on the device before it is given
    (`_on_device_and_ready`), one at a time: no batch is drawn early."""
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        yield _on_device_and_ready(batch)


def _dispatch_is_synchronous():
    import jax

    return jax.default_backend() == "cpu" and not jax.config.read(
        "jax_cpu_enable_async_dispatch"
    )


def jax_waits_for_batches(step_function):
    """A step function of Keras' JAX trainer that, when JAX's CPU dispatch
    is synchronous, waits for each batch to be on the device first.

    Why: with `jax_cpu_enable_async_dispatch=False` (set by
    `keras_jumbo.runtime.keep_freed_memory`) XLA's CPU client runs a
    compiled step on the calling thread only if all its inputs are ready;
    otherwise it runs the step later on one of its own threads. A NumPy
    batch given to the step (as Keras' `fit` and `train_on_batch` give
    it on a CPU) is copied to the device by another thread, and when that
    copy had not finished, the step ran on a pool thread whose malloc
    arena maps the step's temporary buffer afresh and unmaps it after:
    measured (JAX, the 12-layer ViT-Tiny at 224 px, batch 16, huge pages
    + kept memory, 2 CPU cores) in 5 of 8 `fit` processes and 5 of 12
    `train_on_batch` ones, 1-3 steps of 8 took ~2.1 s instead of ~0.6 s,
    faulting in a 975 MB buffer, with up to 2 GB more peak memory
    (benchmarks/README.md, forty-third session). Putting the batch on the
    device and waiting for it costs nothing the step would not wait for.

    `step_function` takes `(state, iterator)`, as `model.train_function`,
    `model.test_function` and `model.predict_function` do on JAX (they
    draw one batch, or `steps_per_execution` batches, from the iterator).
    With asynchronous dispatch (JAX's default), on GPUs and TPUs, and on
    other backends, the batches are passed on untouched. Wrapping twice
    wraps once; None stays None.
    """
    if (
        step_function is None
        or keras.backend.backend() != "jax"
        or getattr(step_function, "_waits_for_batches", False)
    ):
        return step_function

    @functools.wraps(step_function)
    def step(state, iterator):
        if _dispatch_is_synchronous():
            iterator = _ready_batches(iterator)
        return step_function(state, iterator)

    step._waits_for_batches = True
    return step


class WaitsForBatches:
    """Mixin for a `keras.Model` subclass (list it before `keras.Model`):
    on JAX with synchronous CPU dispatch, the steps Keras makes for it
    (`fit`, `evaluate`, `predict`, the `*_on_batch` calls) wait for each
    batch to be on the device before they run (`jax_waits_for_batches`),
    so that they run on the calling thread. Other backends, and JAX with
    asynchronous dispatch: Keras' own steps, unchanged."""

    def make_train_function(self, force=False):
        result = super().make_train_function(force)
        self.train_function = jax_waits_for_batches(self.train_function)
        return result

    def make_test_function(self, force=False):
        result = super().make_test_function(force)
        self.test_function = jax_waits_for_batches(self.test_function)
        return result

    def make_predict_function(self, force=False):
        super().make_predict_function(force)
        self.predict_function = jax_waits_for_batches(self.predict_function)
        return self.predict_function
