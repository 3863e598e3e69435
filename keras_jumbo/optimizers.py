"""Optimizers: Keras' AdamW, with one fused update kernel on eager PyTorch.

Every recipe and example trains with `keras_jumbo.optimizers.AdamW`; it
is `keras.optimizers.AdamW` on every backend (same arguments, config,
slot variables and update), and on eager PyTorch it is faster.
"""

import math

import keras

from keras_jumbo import _keras_internals


def _torch_fused_adamw():
    """`torch.optim.adamw.adamw`, the public functional AdamW (PyTorch)."""
    from torch.optim.adamw import adamw

    return adamw


def _torch_compiling():
    import torch

    return torch.compiler.is_compiling()


@keras.saving.register_keras_serializable(package="keras_jumbo")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW`, one fused kernel per step on eager PyTorch.

    Same constructor, config, slot variables (`momentums`, `velocities`,
    `velocity_hats`) and update as Keras' AdamW, so the two are
    interchangeable, checkpoints included. On JAX and TensorFlow it is
    Keras' AdamW. On the PyTorch backend outside `torch.compile`, the
    weight decay and the Adam update of all variables run as torch's
    fused AdamW kernel (`torch.optim.adamw.adamw(fused=True)`, one pass
    over each parameter) instead of Keras' ten `torch._foreach_*` passes
    with five parameter-sized temporaries: for the 4.8M-parameter pico
    Jumbo on 2 CPU cores, 3 ms against 32 ms per step, about 7% of a
    batch-32 training step (`benchmarks/README.md`). Under `torch.compile`
    (`jit_compile=True`) it is Keras' update, which Inductor fuses.

    The two updates are the same function. Keras adds `epsilon` to
    `sqrt(v)` before the bias correction of `v`, torch after it, so the
    kernel gets `epsilon / sqrt(1 - beta_2**t)` at step `t`; the decoupled
    weight decay `w -= learning_rate * weight_decay * w` comes first in
    both, for the variables `exclude_from_weight_decay` leaves in. The
    results agree with Keras' AdamW to float32 rounding (tested on every
    backend, with AMSGrad, exclusions and a schedule).

    Example:
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> model.compile(optimizer=AdamW(1e-3, weight_decay=0.05), loss="mse")
    >>> type(model.optimizer).__name__
    'AdamW'
    """

    def _uses_fused_update(self):
        return keras.backend.backend() == "torch" and not _torch_compiling()

    def _apply_weight_decay(self, variables):
        if self._uses_fused_update():
            return  # the fused kernel decays the variables it updates
        super()._apply_weight_decay(variables)

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if keras.backend.backend() != "torch":
            return super()._backend_update_step(
                grads, trainable_variables, learning_rate
            )
        if not self._uses_fused_update():
            return _keras_internals.torch_adam_update(
                self, grads, trainable_variables, learning_rate
            )
        return self._fused_update(grads, trainable_variables, learning_rate)

    def _fused_update(self, grads, variables, learning_rate):
        import torch

        step = float(keras.ops.convert_to_numpy(self.iterations))
        lr = float(keras.ops.convert_to_numpy(learning_rate))
        beta_1 = float(self.beta_1)
        beta_2 = float(self.beta_2)
        epsilon = self.epsilon / math.sqrt(1.0 - beta_2 ** (step + 1.0))
        groups = {}
        for grad, variable in zip(grads, variables, strict=True):
            decay = 0.0
            if _keras_internals.decays_weight(self, variable):
                decay = float(self.weight_decay)
            group = groups.setdefault(decay, ([], [], [], [], []))
            momentum, velocity, velocity_hat = _keras_internals.adam_slots(
                self, variable
            )
            group[0].append(variable.value)
            group[1].append(grad)
            group[2].append(momentum.value)
            group[3].append(velocity.value)
            if velocity_hat is not None:
                group[4].append(velocity_hat.value)
        adamw = _torch_fused_adamw()
        with torch.no_grad():
            for decay, (params, grads_, m, v, v_hat) in groups.items():
                # One step counter per parameter, as torch keeps them; the
                # kernel adds 1 first, as Keras' `iterations + 1` does.
                steps = list(torch.full((len(params),), step).unbind())
                adamw(
                    params,
                    grads_,
                    m,
                    v,
                    v_hat,
                    steps,
                    fused=True,
                    amsgrad=self.amsgrad,
                    beta1=beta_1,
                    beta2=beta_2,
                    lr=lr,
                    weight_decay=decay,
                    eps=epsilon,
                    maximize=False,
                )
                # The fused kernel writes the parameters without moving
                # their version counters (autograd's record of in-place
                # writes, which every Keras `assign` and `torch._foreach_*`
                # update moves): move them, so that what reads them
                # (`_torch_kernels`' packed inference weights) sees the
                # new values.
                torch.autograd.graph.increment_version(params)
