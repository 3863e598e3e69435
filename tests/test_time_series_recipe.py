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
    recipe._appender(str(path))(done)
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
