"""The base of every keras_jumbo model class: config = constructor args.

A model class builds its layers and its functional graph in `__init__`
(as keras-hub's backbones do) and ends with `_finish`: the graph becomes
the model, and the constructor's arguments (with table values filled in)
become both `get_config()` and attributes of the same names, which is what
code that transforms a model reads.
"""

import keras


def constructor_arguments(local_variables):
    """The constructor's own arguments, from `locals()` at its first line."""
    skipped = ("self", "kwargs", "__class__", "name")
    return {k: v for k, v in local_variables.items() if k not in skipped}


# Arguments of `keras.Model` itself that model classes pass through.
BASE_ARGUMENTS = ("trainable", "dtype")


class ConfiguredModel(keras.Model):
    """A functional model whose config is its constructor's arguments.

    `exposed_layers` names attributes that point at layers of the graph
    (`model.patch_embedding`, ...). They are plain attributes, not tracked:
    the functional graph owns those layers, so saving, weights and
    `model.layers` are the graph's alone, identical on every backend (and
    the PyTorch backend allows them before `keras.Model.__init__`).
    """

    exposed_layers = ()

    def __setattr__(self, name, value):
        if name in self.exposed_layers:
            object.__setattr__(self, name, value)
            return
        super().__setattr__(name, value)

    def _finish(self, inputs, outputs, config, name, kwargs):
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

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable, **self._config}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return cls(**config)
