"""The only module that touches private Keras attributes, and why.

Keras 3.15 has no public way to do these three things:

- list every layer nested inside a layer (a custom layer's sublayers, e.g.
  the blocks of a `TransformerEncoder`): `Layer._flatten_layers`;
- walk a functional model's graph node by node (layer, input and output
  tensors of each call; `count_macs` needs the shapes of every call):
  `Functional._nodes_by_depth`;
- on JAX, copy the trainer's state back into the variables in the middle
  of `fit`, so a callback reads and writes the current values:
  `Model.jax_state_sync`.

Everything else in keras_jumbo uses public Keras API only; if a future
Keras offers these, this module is the one place to change.
"""


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
