"""The base of every keras_jumbo model class: config = constructor args.

A model class builds its layers and its functional graph in `__init__`
(as keras-hub's backbones do) and ends with `_finish`: the graph becomes
the model, and the constructor's arguments (with table values filled in)
become both `get_config()` and attributes of the same names, which is what
code that transforms a model reads.
"""

import contextlib
import functools
import inspect

import keras

from keras_jumbo import runtime
from keras_jumbo._keras_internals import BuildsStateBeforeTracing
from keras_jumbo._keras_internals import CallsLayersDirectly
from keras_jumbo._keras_internals import ReleasesAddedLosses
from keras_jumbo._keras_internals import WaitsForBatches
from keras_jumbo._keras_internals import collect_garbage_once
from keras_jumbo._keras_internals import jax_jit_options
from keras_jumbo._keras_internals import sublayers


def constructor_arguments(local_variables):
    """The constructor's own arguments, from `locals()` at its first line."""
    skipped = ("self", "kwargs", "__class__", "name")
    return {k: v for k, v in local_variables.items() if k not in skipped}


# Arguments of `keras.Model` itself that model classes pass through, and
# `quantization` (below), which every model class takes.
BASE_ARGUMENTS = ("trainable", "dtype", "quantization")


def _relative_path(model, layer):
    """`layer.path` without the model's name (None for a layer without
    weights, which Keras gives no path)."""
    prefix = model.name + "/"
    path = layer.path
    if path and path.startswith(prefix):
        return path[len(prefix) :]
    return path


def quantized_layers(model):
    """`{path: layer}` of the layers of `model` that `model.quantize(...)`
    quantised (paths relative to the model, e.g. `"block_0/attention/qkv"`).
    """
    return {
        _relative_path(model, layer): layer
        for layer in sublayers(model)
        if getattr(layer, "quantization_mode", None) is not None
    }


def check_not_quantized(
    model, action, reason="it reads float weights", remedy=None
):
    """Raise a `ValueError` naming the quantised layers when `model` has
    any: `action` (e.g. "reparameterize") reads float weights, which a
    quantised layer no longer holds."""
    quantized = quantized_layers(model)
    if quantized:
        shown = ", ".join(
            f"{path} ({layer.quantization_mode})"
            for path, layer in list(quantized.items())[:3]
        )
        more = f" and {len(quantized) - 3} more" if len(quantized) > 3 else ""
        remedy = remedy or "Apply it before `model.quantize(...)`."
        raise ValueError(
            f"{action} needs a float model: {reason}, and "
            f"{type(model).__name__} '{model.name}' has quantised layers "
            f"({shown}{more}). {remedy} "
            f"Received: a model with {len(quantized)} quantised layers"
        )


def _check_dtype(dtype):
    """The `keras.DTypePolicy` of a model's `dtype` argument."""
    try:
        policy = keras.dtype_policies.get(dtype)
    except (ValueError, TypeError) as error:
        raise ValueError(
            "`dtype` must be a Keras dtype policy or its name (e.g. "
            f'"float32", "mixed_bfloat16"). Received: dtype={dtype!r}'
        ) from error
    if policy.quantization_mode is not None:
        raise ValueError(
            "`dtype` cannot be a quantised policy; build the float model and "
            f"call `model.quantize(...)`. Received: dtype={dtype!r}"
        )
    return policy


@contextlib.contextmanager
def dtype_policy_scope(policy):
    """Keras' global dtype policy is `policy` inside the block: the layers
    a model class creates take it (sublayers inherit their parent's)."""
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _jax_step_options():
    """The block in which Keras makes a JAX step of a model: XLA compiler
    options `runtime.jax_compiler_options()` (none on other backends)."""
    if keras.backend.backend() != "jax":
        return contextlib.nullcontext()
    options = runtime.jax_compiler_options()
    if not options:
        return contextlib.nullcontext()
    return jax_jit_options(compiler_options=options)


class ConfiguredModel(
    BuildsStateBeforeTracing,
    ReleasesAddedLosses,
    CallsLayersDirectly,
    WaitsForBatches,
    keras.Model,
):
    """A functional model whose config is its constructor's arguments.

    `exposed_layers` names attributes that point at layers of the graph
    (`model.patch_embedding`, ...). They are plain attributes, not tracked:
    the functional graph owns those layers, so saving, weights and
    `model.layers` are the graph's alone, identical on every backend (and
    the PyTorch backend allows them before `keras.Model.__init__`).

    Quantisation: after Keras' `model.quantize(mode)` (int8, int4,
    float8), `get_config()` has a `quantization` entry, `{layer path:
    Keras quantization config}`, and every model class takes it as an
    argument: the model is built, then those layers are quantised, so a
    saved quantised model reloads with `keras.saving.load_model` (the
    role keras-hub gives a `DTypePolicyMap` `dtype`; this also keeps a
    custom quantization config). Code that reads float weights
    (`reparameterize`, `with_config`, `load_official_jumbo`,
    `extract_subnet`, TFLite export) refuses a quantised model with a
    `ValueError` naming its quantised layers.
    """

    exposed_layers = ()

    def __init_subclass__(cls, **kwargs):
        """Every model class's constructor builds its layers with the
        `dtype` argument's policy (e.g. `"mixed_bfloat16"`), as
        keras-hub's backbones pass `dtype` to each layer; Keras' functional
        model alone would drop it silently (float32 layers)."""
        super().__init_subclass__(**kwargs)
        init = vars(cls).get("__init__")
        if init is None or getattr(init, "_dtype_scoped", False):
            return

        @functools.wraps(init)
        def scoped_init(self, *args, **kw):
            if kw.get("dtype") is None:
                return init(self, *args, **kw)
            kw["dtype"] = _check_dtype(kw["dtype"])
            with dtype_policy_scope(kw["dtype"]):
                return init(self, *args, **kw)

        # Keras reads the constructor's argument spec (`Operation.__new__`).
        scoped_init.__signature__ = inspect.signature(init)
        scoped_init._dtype_scoped = True
        cls.__init__ = scoped_init

    def __setattr__(self, name, value):
        if name in self.exposed_layers:
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def _finish(self, inputs, outputs, config, name, kwargs):
        quantization = kwargs.pop("quantization", None)
        self._dtype_argument = kwargs.get("dtype")
        unknown = sorted(set(kwargs) - set(BASE_ARGUMENTS))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unknown arguments {unknown}. "
                f"Received: {', '.join(f'{k}={kwargs[k]!r}' for k in unknown)}"
            )
        # `super()` here, not `keras.Model.__init__`: after the first model,
        # Keras has put `Functional` into this class's bases.
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)
        self._config = dict(config)
        for key, value in self._config.items():
            setattr(self, key, value)
        if quantization:
            self._quantize_layers(quantization)

    def _quantize_layers(self, quantization):
        """Quantise the layers named in `quantization` (`{path: Keras
        quantization config}`, what `get_config` records after
        `model.quantize(...)`), so a saved quantised model reloads: its
        variables are created in their quantised form, then loaded."""
        if not isinstance(quantization, dict):
            raise TypeError(
                "`quantization` must be a dict {layer path: quantization "
                f"config}}. Received: quantization={quantization!r:.200}"
            )
        layers = {
            _relative_path(self, layer): layer
            for layer in sublayers(self)
            if layer.path
        }
        unknown = [path for path in quantization if path not in layers]
        if unknown:
            raise ValueError(
                f"`quantization` names a layer that {type(self).__name__} "
                f"does not have. Received: path={unknown[0]!r}"
            )
        with collect_garbage_once():
            for path, config in quantization.items():
                if isinstance(config, dict):
                    config = keras.saving.deserialize_keras_object(config)
                layers[path].quantize(config.mode, config=config)

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras' `Model.quantize`, with one garbage collection at the end
        instead of one per quantised layer (see
        `_keras_internals.collect_garbage_once`)."""
        with collect_garbage_once():
            super().quantize(mode, config=config, filters=filters, **kwargs)

    # Shown with the error of a wrong input shape (e.g. how to change the
    # image size); set by subclasses.
    input_shape_hint = ""

    def __call__(self, *args, **kwargs):
        inputs = args[0] if args else kwargs.get("inputs")
        if inputs is not None:
            self.check_input_shapes(inputs)
            self.check_input_values(inputs)
        return super().__call__(*args, **kwargs)

    # The training entry points check array / tf.data inputs before any
    # step is traced: on TensorFlow the traced step sees relaxed (None)
    # shapes, and on JAX an error inside a traced step leaves the model's
    # variables unusable (Keras 3.15).
    def fit(self, x=None, *args, **kwargs):
        self._check_data(x)
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and validation:
            self._check_data(validation[0])
        else:
            self._check_data(validation)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        self._check_data(x)
        return super().evaluate(x, *args, **kwargs)

    def predict(self, x, *args, **kwargs):
        self._check_data(x)
        return super().predict(x, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        self._check_data(x)
        return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        self._check_data(x)
        return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        self._check_data(x)
        return super().predict_on_batch(x)

    # The steps Keras makes on JAX are compiled with
    # `keras_jumbo.runtime.jax_compiler_options()` (512-bit vectors in
    # XLA's element-wise code on AMD CPUs with AVX-512; measured faster,
    # benchmarks/README.md). Other backends: Keras' own steps, unchanged.
    def make_train_function(self, force=False):
        with _jax_step_options():
            return super().make_train_function(force)

    def make_test_function(self, force=False):
        with _jax_step_options():
            return super().make_test_function(force)

    def make_predict_function(self, force=False):
        with _jax_step_options():
            return super().make_predict_function(force)

    def _check_data(self, x):
        """Check arrays, dicts of arrays and tf.data element specs (other
        data, e.g. a PyDataset, is checked at the first call)."""
        spec = getattr(x, "element_spec", None)
        if spec is not None:
            if isinstance(spec, (tuple, list)):
                spec = spec[0]
            self.check_input_shapes(spec)
        elif isinstance(x, dict) or hasattr(x, "shape"):
            self.check_input_shapes(x)
            self.check_input_values(x)

    def check_input_values(self, inputs):
        """Check concrete (numpy) input values; a subclass hook."""

    def check_input_shapes(self, inputs):
        """Raise unless `inputs` have the model's static input shapes.

        Keras checks this on PyTorch only; on JAX a ViT called at another
        resolution would silently crop or resample, on TensorFlow fail
        deep inside. Every backend gets this one error instead.
        """
        expected = keras.tree.flatten(self.input)
        given = keras.tree.flatten(inputs)
        if len(expected) != len(given):
            return  # Keras reports a wrong input structure itself
        for spec, value in zip(expected, given, strict=True):
            shape = getattr(value, "shape", None)
            if shape is None:
                continue
            want, got = tuple(spec.shape)[1:], tuple(shape)[1:]
            if len(want) != len(got) or any(
                w is not None and g is not None and w != g
                for w, g in zip(want, got, strict=True)
            ):
                raise ValueError(
                    f"{type(self).__name__} '{self.name}' takes inputs of "
                    f"shape {(None, *want)}. Received: input of shape "
                    f"{tuple(shape)}.{self.input_shape_hint}"
                )

    def compile_from_config(self, config):
        """Reload the saved compile settings, except `jit_compile`, which
        becomes `"auto"`: the loading backend's own default. A model saved
        from JAX/TensorFlow with `jit_compile=True` would otherwise reload
        under PyTorch with `torch.compile` on (tens of seconds for the first
        prediction)."""
        config = dict(config)
        if "jit_compile" in config:
            config["jit_compile"] = "auto"
        return super().compile_from_config(config)

    def get_config(self):
        config = {
            "name": self.name,
            "trainable": self.trainable,
            **self._config,
        }
        if self._dtype_argument is not None:
            config["dtype"] = self._dtype_argument.name
        quantized = quantized_layers(self)
        if quantized:
            config["quantization"] = {
                path: keras.saving.serialize_keras_object(
                    layer.quantization_config
                )
                for path, layer in quantized.items()
            }
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)
