import math

import keras
from keras import ops

from keras_jumbo._torch_kernels import int32_keep_threshold
from keras_jumbo._torch_kernels import unseeded_dropout

# The backends whose training step XLA compiles by default, where the
# counter hash below fuses into one loop: ~10x cheaper than the
# threefry bits behind Keras' dropout (2.5 vs 0.23 ms for a (224, 42, 128)
# tensor on 2 CPU cores). TensorFlow's eager kernels and eager PyTorch run
# the hash as ~20 separate element-wise kernels, no faster than their own
# random kernels (benchmarks/README.md): TensorFlow keeps Keras' dropout,
# and PyTorch draws an unseeded layer's mask with `torch.rand`.
COUNTER_HASH_BACKENDS = ("jax",)

# lowbias32 (C. Wellons, "Hash function prospector"): a 32-bit integer
# hash with two xor-shift-multiply rounds, here in int32 arithmetic
# (multiplications wrap; the logical shifts are arithmetic shifts masked).
_MULTIPLIER_1 = 0x7FEB352D
_MULTIPLIER_2 = 0x846CA68B - (1 << 32)
_KEY_SALT_1 = 0x3C6EF372
_KEY_SALT_2 = 0x1B873593


def _mix(h):
    """lowbias32 of an int32 tensor (the same bits as the uint32 hash)."""
    h = ops.bitwise_xor(h, ops.bitwise_and(ops.right_shift(h, 16), 0xFFFF))
    h = ops.multiply(h, _MULTIPLIER_1)
    h = ops.bitwise_xor(h, ops.bitwise_and(ops.right_shift(h, 15), 0x1FFFF))
    h = ops.multiply(h, _MULTIPLIER_2)
    return ops.bitwise_xor(h, ops.bitwise_and(ops.right_shift(h, 16), 0xFFFF))


def counter_hash_bits(shape, seed):
    """32 random bits per element of `shape`, as int32: element `i` (in
    row-major order) gets `mix(mix(i ^ k1) + k2)`, with the keys
    `k1 = mix(seed[0] ^ c1)` and `k2 = mix((seed[1] ^ k1) + c2)`.

    A counter-based generator (like threefry, with a cheaper hash): the
    bits depend only on the element index and the two seed words, so the
    same seed gives the same bits on every backend.
    """
    seed = ops.cast(seed, "int32")
    key_1 = _mix(ops.bitwise_xor(seed[0], _KEY_SALT_1))
    key_2 = _mix(ops.bitwise_xor(seed[1], key_1) + _KEY_SALT_2)
    index = ops.reshape(ops.arange(math.prod(shape), dtype="int32"), shape)
    return _mix(_mix(ops.bitwise_xor(index, key_1)) + key_2)


def counter_hash_dropout(inputs, rate, seed):
    """Inverted dropout of `inputs` with a `counter_hash_bits` mask: each
    element is kept with probability `round((1 - rate) * 2**32) / 2**32`
    (exact to 2**-32; Keras' float32 uniform draws are exact to 2**-23)
    and the kept ones are divided by `1 - rate`.

    Args:
        inputs: tensor with a static shape.
        rate: float in (0, 1), the drop probability.
        seed: two integers (a `SeedGenerator.next()` value).
    """
    bits = counter_hash_bits(tuple(inputs.shape), seed)
    # Unsigned `bits < threshold`, compared as int32 with the sign flipped.
    kept = ops.less(ops.bitwise_xor(bits, -(2**31)), int32_keep_threshold(rate))
    return ops.where(kept, inputs / (1.0 - rate), ops.zeros_like(inputs))


@keras.saving.register_keras_serializable(package="keras_jumbo")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with cheaper random masks on JAX and PyTorch.

    Same arguments, config and function as Keras' layer: in training each
    element is zeroed with probability `rate` and the others are scaled
    by `1 / (1 - rate)`; identity at inference. On JAX (the step compiled
    by XLA) a mask without `noise_shape` comes from `counter_hash_dropout`,
    seeded by the layer's `SeedGenerator` (so `keras.utils.set_random_seed`
    and the layer's `seed` make runs repeatable, as with Keras' layer):
    Keras draws it with threefry, whose ~20 hash rounds per element cost
    18% of a PatchTST forecaster's training step (dropout 0.2) on 2 CPU
    cores. The masks differ from Keras' layer's for the same seed (a
    different generator); their distribution is the same. On PyTorch a
    layer without a `seed` draws, like Keras' layer, from torch's global
    generator, as 32 random bits per element (`_torch_kernels.
    unseeded_dropout`, forward + backward 2.3x faster than the
    `bernoulli_` of Keras' `F.dropout`). Otherwise (TensorFlow, a seeded
    layer on PyTorch, a `noise_shape`) it is Keras' dropout.

    Example:
    >>> layer = Dropout(0.5, seed=1)
    >>> y = layer(np.ones((2, 4)), training=True)
    >>> sorted(set(np.asarray(y).ravel().tolist())) in ([0.0, 2.0], [2.0])
    True
    """

    def call(self, inputs, training=False):
        if training and 0 < self.rate < 1 and self.noise_shape is None:
            backend = keras.backend.backend()
            if (
                backend in COUNTER_HASH_BACKENDS
                and all(isinstance(size, int) for size in inputs.shape)
                and math.prod(inputs.shape) < 2**31  # int32 element indices
            ):
                return counter_hash_dropout(
                    inputs, self.rate, self.seed_generator.next()
                )
            if backend == "torch" and self.seed is None:
                return unseeded_dropout(inputs, self.rate)
        return super().call(inputs, training=training)
