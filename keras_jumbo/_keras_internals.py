"""The only module that touches private Keras attributes, and why.

Keras 3.15 has no public way to do these four things:

- list every layer nested inside a layer (a custom layer's sublayers, e.g.
  the blocks of a `TransformerEncoder`): `Layer._flatten_layers`;
- walk a functional model's graph node by node (layer, input and output
  tensors of each call; `count_macs` needs the shapes of every call):
  `Functional._nodes_by_depth`;
- on JAX, copy the trainer's state back into the variables in the middle
  of `fit`, so a callback reads and writes the current values:
  `Model.jax_state_sync`;
- on PyTorch, empty the losses layers added with `add_loss` once a
  training step has used them: `Layer._clear_losses`.

Everything else in keras_jumbo uses public Keras API only; if a future
Keras offers these, this module is the one place to change.
"""

import keras


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
