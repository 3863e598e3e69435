import math

import keras
import numpy as np
import pytest

from recipes import time_series as recipe


def test_warmup_then_cosine_to_1e_8():
    """A.2.2: linear warm-up over 10% of the steps, cosine decay to 1e-8."""
    schedule = recipe.warmup_cosine(1e-3, total_steps=1000, end=1e-8)
    lr = lambda step: float(keras.ops.convert_to_numpy(schedule(step)))  # noqa
    assert lr(0) == 0.0
    assert lr(50) == pytest.approx(0.5e-3, rel=1e-5)
    assert lr(100) == pytest.approx(1e-3, rel=1e-5)
    # Half-way through the decay: the cosine midpoint between 1e-3 and 1e-8.
    assert lr(550) == pytest.approx((1e-3 + 1e-8) / 2, rel=1e-4)
    assert lr(1000) == pytest.approx(1e-8, rel=1e-3)


def test_compile_classifier_uses_adamw_with_weight_decay_0_02():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    recipe.compile_classifier(model, 1e-3, 100)
    assert isinstance(model.optimizer, keras.optimizers.AdamW)
    assert model.optimizer.weight_decay == pytest.approx(0.02)


def test_ranks_average_ties():
    ranks = recipe._ranks({"a": 0.9, "b": 0.8, "c": 0.9})
    assert ranks == {"a": 1.5, "c": 1.5, "b": 3.0}


def test_summarize_best_by_validation_and_average(monkeypatch):
    shapes = {"Uni": (10, 50, 1), "Multi": (10, 50, 3)}
    monkeypatch.setattr(
        recipe,
        "classification_data",
        lambda name: ((np.zeros(shapes[name]), None), None, None, 2),
    )

    def run(model, dataset, val, test):
        return dict(
            model=model,
            dataset=dataset,
            num_patches=8,
            val_accuracy=val,
            test_accuracy=test,
        )

    records = [
        run("patchtst", "Uni", 0.9, 0.70),  # best by validation
        run("patchtst", "Uni", 0.5, 0.90),
        run("patchtst_jumbo", "Uni", 0.8, 0.80),
        run("patchtst_jumbo", "Uni", 0.7, 0.60),
        run("patchtst", "Multi", 0.9, 0.5),
        run("patchtst_jumbo", "Multi", 0.9, 0.6),
    ]
    results, ranks = recipe.summarize(records)
    assert results[(8, "Uni")]["patchtst"] == (0.70, pytest.approx(0.80))
    assert results[(8, "Uni")]["patchtst_jumbo"] == (0.80, pytest.approx(0.70))
    # Uni: best -> jumbo 1, patchtst 2; avg -> patchtst 1, jumbo 2.
    assert ranks[(8, "univariate")] == {
        "patchtst": (2.0, 1.0),
        "patchtst_jumbo": (1.0, 2.0),
    }
    assert ranks[(8, "multivariate")]["patchtst_jumbo"] == (1.0, 1.0)


def test_one_real_run_learns_gunpoint():
    record = recipe.train_classifier(
        "patchtst_jumbo",
        "GunPoint",
        num_patches=8,
        learning_rate=3e-3,
        dropout_rate=0.0,
        epochs=30,
        hidden_dim=16,
        num_heads=2,
        mlp_dim=32,
        depth=1,
    )
    # Two balanced classes: clearly better than chance after 30 epochs.
    assert record["test_accuracy"] > 0.6
    assert math.isfinite(record["val_accuracy"])
    assert record["seconds"] > 0


def test_sweep_resumes_from_records(tmp_path):
    """Finished runs (a JSON-lines file) are reused, not repeated."""
    done = {
        "kind": "classification",
        "model": "patchtst",
        "dataset": "GunPoint",
        "num_patches": 8,
        "learning_rate": 1e-3,
        "dropout_rate": 0.0,
        "val_accuracy": 0.5,
        "test_accuracy": 0.25,
        "seconds": 1.0,
    }
    path = tmp_path / "runs.jsonl"
    recipe.appender(str(path))(done)
    assert recipe.load_records(str(path)) == [done]
    messages = []
    records = recipe.sweep(
        ["GunPoint"],
        model_names=("patchtst", "patchtst_jumbo"),
        patch_counts=[8],
        learning_rates=[1e-3],
        dropouts=[0.0],
        done=recipe.load_records(str(path)),
        train=False,
        log=messages.append,
    )
    assert records == [done]
    assert messages == [
        "missing run: ('GunPoint', 8, 'patchtst_jumbo', 0.001, 0.0)"
    ]


def _fusion_record(dataset, fusion, seed, mse, budget=None, **extra):
    budget = recipe.FUSION_BUDGETS[dataset] if budget is None else budget
    return dict(
        kind="fusion",
        model="ms_patchtst",
        dataset=dataset,
        fusion=fusion,
        seed=seed,
        width=recipe.FUSION_WIDTH,
        mse=mse,
        mae=mse / 2,
        params=100,
        seconds=60.0,
        **budget,
        **extra,
    )


def test_fusion_summary_is_mean_and_sample_std_over_seeds():
    records = [
        _fusion_record("electricity", "per_step", s, m)
        for s, m in enumerate([0.1, 0.2, 0.6])
    ] + [_fusion_record("electricity", "flatten", 0, 0.3)]
    summary = recipe.fusion_summary(records)
    row = summary[("electricity", "per_step")]
    assert row["n"] == 3
    assert row["mse"][0] == pytest.approx(0.3)
    # Sample std (ddof=1) of 0.1, 0.2, 0.6: sqrt((0.04+0.01+0.09)/2).
    assert row["mse"][1] == pytest.approx(math.sqrt(0.07))
    assert row["mae"][0] == pytest.approx(0.15)
    assert summary[("electricity", "flatten")]["mse"] == (0.3, 0.0)


def test_fusion_study_reuses_matching_records_and_lists_missing(tmp_path):
    records = tmp_path / "fusion.jsonl"
    append = recipe.appender(str(records))
    for seed, mse in ((0, 0.20), (1, 0.22)):
        append(_fusion_record("electricity", "per_step", seed, mse))
        append(_fusion_record("electricity", "per_horizon_step", seed, 0.1))
    # A run with another budget is not this study's run.
    append(
        _fusion_record(
            "electricity",
            "flatten",
            0,
            0.01,
            budget={"epochs": 1, "train_windows": 64},
        )
    )
    doc = tmp_path / "fusion.md"
    args = recipe.argparse.Namespace(
        records=str(records),
        from_records=True,
        fusion_datasets=["electricity"],
        seeds=[0, 1],
    )
    summary = recipe.write_fusion_results(str(doc), args)
    assert set(summary) == {
        ("electricity", "per_step"),
        ("electricity", "per_horizon_step"),
    }
    text = doc.read_text()
    assert "| per_step | 100 | 2 | 0.2100 ± 0.0141 |" in text
    assert "| flatten | | 0 | | | |" in text
    assert "electricity/flatten/seed 0, electricity/flatten/seed 1" in text
    assert "lowest mean test MSE per_horizon_step (0.1000 ± 0.0000" in text
    assert "beyond one std of per_step" in text
    assert "**Default:** per_horizon_step beat(s) `per_step`" in text


@pytest.mark.parametrize(
    "extra, allocator",
    [
        ([], ["auto"]),
        (["--allocator", "default"], ["default"]),
        (["--from-records"], []),
    ],
)
def test_fusion_study_applies_the_allocator_flag_when_it_trains(
    monkeypatch, tmp_path, extra, allocator
):
    """The fusion study keeps freed memory (`--allocator auto`, JAX) before
    it trains; writing its document from records changes nothing."""
    calls = []
    monkeypatch.setattr(
        recipe.common, "apply_allocator", lambda flag: calls.append(flag)
    )
    monkeypatch.setattr(recipe, "write_fusion_results", lambda path, args: {})
    assert recipe.main(["--fusion-study", str(tmp_path / "f.md"), *extra]) == 0
    assert calls == allocator


def test_fusion_default_stays_unless_beaten_beyond_std_on_every_set():
    def row(mse, std):
        return {"mse": (mse, std), "n": 3}

    fusions = ("per_step", "per_horizon_step", "flatten")
    summary = {
        ("a", "per_step"): row(0.50, 0.01),
        ("a", "per_horizon_step"): row(0.40, 0.01),  # better beyond std
        ("a", "flatten"): row(0.90, 0.10),
        ("b", "per_step"): row(0.30, 0.01),
        ("b", "per_horizon_step"): row(0.295, 0.01),  # within std
        ("b", "flatten"): row(0.31, 0.01),
    }
    text = recipe._fusion_default(summary, ["a", "b"], fusions)
    assert text.startswith("**Default:** `per_step` stays")
    assert "per_horizon_step 0.1000, flatten 0.4000" in text
    summary[("b", "per_horizon_step")] = row(0.20, 0.01)
    text = recipe._fusion_default(summary, ["a", "b"], fusions)
    assert text.startswith("**Default:** per_horizon_step beat(s)")


def test_fusion_run_scores_the_whole_test_split():
    from keras_jumbo import data

    record = recipe.fusion_run(
        "electricity",
        "per_horizon_step",
        seed=0,
        budget={"epochs": 1, "train_windows": 64},
        width=8,
        depth=1,
    )
    values, _ = data.load_electricity_hourly()
    test = data.forecasting_splits(values, 336)["test"]
    assert record["test_windows"] == len(test) - 336 - 96 + 1
    assert record["fusion"] == "per_horizon_step"
    assert record["train_windows"] == 64
    assert math.isfinite(record["mse"]) and math.isfinite(record["mae"])
    assert "trained" not in record
