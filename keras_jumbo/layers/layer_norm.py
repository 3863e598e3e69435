import keras
from keras import ops

from keras_jumbo._torch_kernels import layer_norm
from keras_jumbo.layers.closed_form import closed_form_gradients
from keras_jumbo.layers.closed_form import closed_form_layer_norm


@keras.saving.register_keras_serializable(package="keras_jumbo")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` with a written-out gradient on JAX.

    Same arguments, weights (`gamma`, `beta`), config and forward function
    as the Keras layer; the library's blocks and models use it. On JAX,
    with a last-axis `center=True, scale=True` normalisation, the backward
    pass is `keras_jumbo.layers.closed_form_layer_norm`'s instead of
    autodiff through `ops.moments`: XLA:CPU fused autodiff's broadcast
    chain through the residual stream of every block before it, so a
    12-layer ViT-Tiny training step at 224 px spent about a third of its
    time there (`benchmarks/profile_train_step.py`). Outputs and gradients
    agree with the Keras layer to float32 rounding (tested). Elsewhere
    (PyTorch: `F.layer_norm` with its fused backward already, called
    directly on float32 tensors, `keras_jumbo._torch_kernels.layer_norm`;
    TensorFlow; other axes, `rms_scaling`) it is the Keras layer's function.

    Example:
    >>> norm = LayerNormalization(epsilon=1e-6)
    >>> norm(np.ones((2, 3, 4))).shape
    (2, 3, 4)
    """

    # Its call reads only `gamma` and `beta`, which Keras creates with
    # `autocast=False`, and calls no layer: the same under any autocast
    # scope, so a mixed-precision block calls it directly on PyTorch
    # (`keras_jumbo._keras_internals.call_sublayer`).
    calls_without_autocast = True

    def _closed_form(self, inputs):
        if not closed_form_gradients():
            return False
        return self._last_axis_affine(inputs)

    def _last_axis_affine(self, inputs):
        if self.rms_scaling or not (self.center and self.scale):
            return False
        rank = len(inputs.shape)
        return list(self.axis) in ([rank - 1], [-1])

    def call(self, inputs):
        if not self._closed_form(inputs):
            if self._last_axis_affine(inputs):
                # `F.layer_norm` directly on float32 PyTorch tensors.
                outputs = layer_norm(
                    inputs, self.gamma.value, self.beta.value, self.epsilon
                )
                dtype = self.compute_dtype
                if keras.backend.standardize_dtype(outputs.dtype) == dtype:
                    return outputs  # no `ops.cast` dispatch per call
                return ops.cast(outputs, dtype)
            return super().call(inputs)
        outputs = closed_form_layer_norm(
            inputs, self.gamma, self.beta, self.epsilon
        )
        return ops.cast(outputs, self.compute_dtype)
