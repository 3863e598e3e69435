"""ImageNet-1K class names and `decode_predictions` for the presets.

`imagenet_classes.tsv` lists the 1000 classes in the standard index order
(WordNet IDs sorted, the order of the official evaluation's labels), each
with its WordNet lemmas; the class name is the first lemma. Generated from
the ImageNet synset and lemma lists that timm's wheel ships
(`timm/data/_info/`), data only.
"""

import functools
import importlib.resources

import numpy as np


@functools.cache
def imagenet_classes():
    """`[(wordnet_id, name), ...]`, the 1000 classes in index order.

    Example:
    >>> imagenet_classes()[0]
    ('n01440764', 'tench')
    """
    text = (
        importlib.resources.files("keras_jumbo.presets")
        .joinpath("imagenet_classes.tsv")
        .read_text(encoding="utf-8")
    )
    rows = []
    for line in text.splitlines():
        wordnet_id, lemmas = line.split("\t")
        rows.append((wordnet_id, lemmas.split(", ")[0]))
    return tuple(rows)


def decode_predictions(logits, top=5):
    """Top-`top` ImageNet classes of each row of `logits`.

    Args:
        logits: `(batch, 1000)` model outputs (logits; softmax is applied
            here) or a single `(1000,)` row.
        top: int, classes per row.

    Returns:
        One list per row of `(wordnet_id, name, probability)`, most likely
        first (as `keras.applications.imagenet_utils.decode_predictions`).
    """
    values = np.asarray(logits, dtype="float64")
    if values.ndim == 1:
        values = values[None]
    if values.ndim != 2 or values.shape[-1] != 1000:
        raise ValueError(
            "`logits` must have shape (batch, 1000). "
            f"Received: shape={values.shape}"
        )
    if isinstance(top, bool) or not isinstance(top, int) or not top > 0:
        raise ValueError(f"`top` must be an int > 0. Received: top={top!r}")
    values = values - values.max(axis=-1, keepdims=True)
    probabilities = np.exp(values)
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    classes = imagenet_classes()
    results = []
    for row in probabilities:
        order = np.argsort(-row, kind="stable")[:top]
        results.append(
            [(*classes[index], float(row[index])) for index in order]
        )
    return results
