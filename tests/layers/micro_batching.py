"""Test helper: the micro-batching of `keras_jumbo.layers._micro_batch` on
the backend under test, at small sizes."""

import keras

from keras_jumbo.layers import _micro_batch


def micro_batching_here(monkeypatch, min_tokens, max_elements=None):
    """Micro-batching on this backend, from `min_tokens` tokens a slice
    (and at most `max_elements` numbers a slice, if given)."""
    monkeypatch.setattr(
        _micro_batch,
        "MICRO_BATCH_INFERENCE_BACKENDS",
        (keras.backend.backend(),),
    )
    monkeypatch.setattr(_micro_batch, "MIN_MICRO_BATCH_TOKENS", min_tokens)
    if max_elements is not None:
        monkeypatch.setattr(
            _micro_batch, "MAX_MICRO_BATCH_ELEMENTS", max_elements
        )
