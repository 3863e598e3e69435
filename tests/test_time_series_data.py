import numpy as np
import pytest

from keras_jumbo.data import ForecastingWindows
from keras_jumbo.data import forecasting_splits
from keras_jumbo.data import load_appliances_energy
from keras_jumbo.data import load_electricity_hourly
from keras_jumbo.data import load_forecasting_csv
from keras_jumbo.data import load_ucr_uea
from keras_jumbo.data import split_half
from keras_jumbo.data import ucr_uea_offline


def test_univariate_ucr_set_loads_offline():
    (x, y), (x_test, y_test), names = load_ucr_uea("GunPoint")
    assert x.shape == (50, 150, 1) and x.dtype == np.float32
    assert x_test.shape == (150, 150, 1)
    assert list(names) == ["1", "2"]
    assert set(np.unique(y)) == {0, 1} and y.dtype == np.int32


def test_multivariate_uea_set_is_time_major():
    from aeon.datasets import load_classification

    (x, y), _, names = load_ucr_uea("BasicMotions")
    assert x.shape == (40, 100, 6)
    raw, labels = load_classification("BasicMotions", split="train")
    np.testing.assert_allclose(x[3], raw[3].T, rtol=1e-6)
    assert names[y[3]] == labels[3]


def test_unequal_lengths_are_end_padded_with_the_last_value():
    from aeon.datasets import load_classification

    (x, _), (x_test, _), _ = load_ucr_uea("JapaneseVowels")
    raw, _ = load_classification("JapaneseVowels", split="train")
    assert x.shape[1] == x_test.shape[1] == 29 and x.shape[2] == 12
    first = raw[0]  # (12, 20)
    np.testing.assert_allclose(x[0, :20], first.T, rtol=1e-6)
    np.testing.assert_allclose(
        x[0, 20:], np.repeat(first.T[-1:], 9, 0), rtol=1e-6
    )


def test_split_half_partitions():
    x = np.arange(11)[:, None]
    y = np.arange(11)
    (xv, yv), (xt, yt) = split_half(x, y)
    assert len(xv) == 5 and len(xt) == 6
    assert sorted(np.concatenate([yv, yt])) == list(range(11))
    np.testing.assert_array_equal(xv[:, 0], yv)


def test_forecasting_csv_splits_and_train_only_normalisation(tmp_path, rng):
    values = rng.normal(size=(200, 3)).astype("float32") * [1, 5, 10] + 7
    lines = ["date,a,b,c,noise"] + [
        f"2020-01-01 {i},{v[0]},{v[1]},{v[2]},0" for i, v in enumerate(values)
    ]
    (tmp_path / "series.csv").write_text("\n".join(lines))
    loaded, columns = load_forecasting_csv(
        tmp_path / "series.csv", drop_columns=("noise",)
    )
    assert columns == ["a", "b", "c"]
    np.testing.assert_allclose(loaded, values, rtol=1e-6)
    splits = forecasting_splits(loaded, sequence_length=10)
    # 70 / 10 / 20 %: 140, 20, 40 steps; val/test start L=10 steps early.
    assert len(splits["train"]) == 140
    assert len(splits["val"]) == 10 + 20
    assert len(splits["test"]) == 10 + 40
    np.testing.assert_allclose(splits["mean"], values[:140].mean(0), rtol=1e-5)
    np.testing.assert_allclose(splits["train"].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(splits["train"].std(0), 1, atol=1e-5)
    expected_test = (values[150:] - splits["mean"]) / splits["std"]
    np.testing.assert_allclose(splits["test"], expected_test, atol=1e-5)
    with pytest.raises(ValueError, match="drop_columns"):
        load_forecasting_csv(tmp_path / "series.csv", drop_columns=("zz",))


def test_forecasting_windows():
    series = np.arange(40, dtype="float32").reshape(20, 2)
    windows = ForecastingWindows(series, 5, 3, batch_size=4)
    assert windows.num_windows == 20 - 5 - 3 + 1
    assert len(windows) == 4
    x, y = windows[1]
    assert x.shape == (4, 5, 2) and y.shape == (4, 3, 2)
    np.testing.assert_array_equal(x[0], series[4:9])
    np.testing.assert_array_equal(y[0], series[9:12])
    last_x, _ = windows[3]
    assert len(last_x) == 1
    shuffled = ForecastingWindows(series, 5, 3, 4, shuffle=True, max_windows=6)
    assert len(shuffled) == 2
    with pytest.raises(ValueError, match="shorter than one window"):
        ForecastingWindows(series, 15, 10)
    with pytest.raises(ValueError, match="horizon"):
        ForecastingWindows(series, 5, 0)
    with pytest.raises(IndexError, match="index=4"):
        windows[4]
    with pytest.raises(ValueError, match="max_windows"):
        ForecastingWindows(series, 5, 3, max_windows=0)


def test_forecasting_splits_refuse_bad_input():
    values = np.arange(200, dtype="float32").reshape(100, 2)
    with pytest.raises(ValueError, match="sequence_length=500"):
        forecasting_splits(values, sequence_length=500)
    with pytest.raises(ValueError, match="sequence_length=-5"):
        forecasting_splits(values, sequence_length=-5)
    with pytest.raises(TypeError, match="sequence_length"):
        forecasting_splits(values, sequence_length=9.5)
    with pytest.raises(ValueError, match="test_fraction"):
        forecasting_splits(values, 10, test_fraction=0)
    import pandas  # part of the test install (.ci/install.sh)

    frame = pandas.DataFrame(values, columns=["load", "temp"])
    frame.iloc[[3, 7], 1] = np.nan
    with pytest.raises(ValueError, match=r"\{'temp': 2\}"):
        forecasting_splits(frame, 10)
    with pytest.raises(ValueError, match=r"\{0: 1\}"):
        forecasting_splits(np.where(values == 0, np.nan, values), 10)


def test_ucr_uea_names_are_checked():
    offline = ucr_uea_offline()
    assert {"GunPoint", "BasicMotions", "JapaneseVowels"} <= set(offline)
    with pytest.raises(ValueError, match="NoSuchSet.*GunPoint"):
        load_ucr_uea("NoSuchSet")
    with pytest.raises(TypeError, match="name=123"):
        load_ucr_uea(123)


def test_real_forecasting_data_loads_offline():
    values, columns = load_appliances_energy()
    assert values.shape == (19735, 26)
    assert "rv1" not in columns and columns[0] == "Appliances"
    assert np.isfinite(values).all()
    load, names = load_electricity_hourly()
    assert load.shape == (26304, 1) and names == ["y"]
