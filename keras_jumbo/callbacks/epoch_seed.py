import keras

from keras_jumbo.data.augment import reseed
from keras_jumbo.data.augment import step_seed


class EpochSeed(keras.callbacks.Callback):
    """Make every epoch's randomness a function of `(seed, epoch)` only.

    At the start of epoch `e` it calls `set_epoch(e)` on each of `datasets`
    (e.g. `keras_jumbo.data.ImageBatches`: the shuffle and augmentation of
    the epoch) and re-seeds every `keras.random.SeedGenerator` of the model
    (dropout, stochastic depth, token dropping) from `(seed, e)`, and the
    global Python / NumPy / backend seeds too (`keras.utils.
    set_random_seed`). Together
    with `keras.callbacks.BackupAndRestore`, a run interrupted and resumed
    at an epoch boundary then ends with the same weights as an
    uninterrupted run — which plain global seeding cannot give, because a
    restarted process replays the random streams from their start.

    Args:
        seed: int.
        datasets: objects with a `set_epoch(epoch)` method.
    """

    def __init__(self, seed=0, datasets=()):
        super().__init__()
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"`seed` must be an int. Received: seed={seed!r}")
        for dataset in datasets:
            if not callable(getattr(dataset, "set_epoch", None)):
                raise TypeError(
                    "Every entry of `datasets` needs a `set_epoch(epoch)` "
                    f"method. Received: {dataset!r}"
                )
        self.seed = seed
        self.datasets = list(datasets)

    def on_epoch_begin(self, epoch, logs=None):
        for dataset in self.datasets:
            dataset.set_epoch(epoch)
        epoch_seed = step_seed(self.seed, epoch)
        reseed(self.model, epoch_seed)
        # Layers built without a seed draw from the global generators on
        # some backends (PyTorch's dropout uses torch's global RNG): seed
        # Python, NumPy and the backend globally as well.
        keras.utils.set_random_seed(epoch_seed)
