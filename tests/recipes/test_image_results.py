import json

import keras
import numpy as np
import pytest

from recipes import image_results as recipe


def test_digits_split_is_stratified_and_whole():
    (x, y), (x_test, y_test) = recipe.load_dataset("digits")
    assert len(x) + len(x_test) == 1797  # every image in exactly one part
    assert x.shape[1:] == (8, 8, 1)
    for label in range(10):
        in_test = np.sum(y_test == label)
        total = in_test + np.sum(y == label)
        assert in_test == round(0.3 * total)
    # The same split every time.
    (_, again), _ = recipe.load_dataset("digits")
    np.testing.assert_array_equal(y, again)


def test_one_run_scores_the_whole_test_split():
    record = recipe.train_one("digits", "jumbo", "pico", seed=0, epochs=10)
    assert record["test_examples"] == 1797 - record["train_examples"]
    assert 0.3 < record["test_accuracy"] <= 1.0  # chance: 0.1
    assert record["params"] > 0 and record["macs"] > 0
    assert record["inference_images_per_second"] > 0
    assert record["backend"] == keras.backend.backend()


def _document_from_records(tmp_path, records):
    """The results document written from `records` alone (digits, pico,
    seeds 0 and 1), as `main` writes it."""
    path = tmp_path / "runs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    doc = tmp_path / "image_results.md"
    recipe.main(
        [
            "--records",
            str(path),
            "--from-records",
            "--results",
            str(doc),
            "--datasets",
            "digits",
            "--sizes",
            "pico",
            "--seeds",
            "0",
            "1",
        ]
    )
    return doc.read_text()


def test_summary_and_document_from_records(tmp_path):
    def run(model, seed, accuracy):
        return dict(
            kind="compare",
            dataset="digits",
            model=model,
            size="pico",
            seed=seed,
            epochs=recipe.EPOCHS["digits"],
            test_accuracy=accuracy,
            params=10,
            macs=2e6,
            inference_images_per_second=100.0 + seed,
            train_seconds=1.0,
        )

    records = [run("jumbo", 0, 0.90), run("jumbo", 1, 0.94)]
    records += [run("registers", s, 0.80) for s in (0, 1)]
    summary = recipe.summarize(records)
    mean, std = summary[("digits", "pico", "jumbo")]["accuracy"]
    assert mean == pytest.approx(0.92)
    assert std == pytest.approx(np.std([0.90, 0.94], ddof=1))
    text = _document_from_records(tmp_path, records)
    assert "| pico | jumbo | 10 | 2.0M | 92.00 ± 2.83 | 100 | 2 |" in text
    assert "Jumbo − Registers = +12.00 points" in text
    assert "Runs trained on Keras" in text and "/ jax." in text
    # Jumbo 92 ± 2.83 vs Registers 80 ± 0: beyond the spread, one width.
    assert (
        "Jumbo beats Registers: yes (beyond the seed spread in 1 of 1 " in text
    )
    assert "Most at the narrower width: not yet (too few runs)" in text
    assert "Jumbo ahead" in text
    assert "digits/pico/vit/seed 0" in text


def test_sections_share_reference_runs_and_cover_every_variant():
    seeds = [0, 1, 2]
    ffn = recipe.specs("jumbo_ffn", ["digits"], ["pico"], seeds)
    assert len(ffn) == len(seeds) * len(recipe.JUMBO_FFN_VARIANTS)
    compare = recipe.specs("compare", ["digits"], ["pico"], seeds)
    # The per-layer Jumbo runs are the compare runs, not new ones.
    shared = {recipe._key(s) for s in ffn} & {recipe._key(s) for s in compare}
    assert len(shared) == len(seeds)
    drop = recipe.specs("token_drop", ["digits"], ["pico"], seeds)
    assert {s["kind"] for s in drop} == {"compare", "token_drop"}
    assert len(drop) == 2 * len(seeds) * len(recipe.TOKEN_DROP_MODELS)
    deep = recipe.specs("non_deep", ["digits"], ["pico"], seeds)
    assert sorted({s["variant"] for s in deep}) == sorted(
        recipe.NON_DEEP_VARIANTS
    )
    with pytest.raises(ValueError, match="section"):
        recipe.specs("nope", ["digits"], ["pico"], seeds)
    with pytest.raises(ValueError, match="variant"):
        recipe.build_non_deep("9x9", "digits", 10, 8)


def test_non_deep_run_joins_and_scores_the_reparameterised_model(
    monkeypatch,
):
    from keras_jumbo import models

    def tiny(variant, dataset, num_classes, image_size):
        return models.NonDeepViT(
            2,
            2,
            num_classes=num_classes,
            image_size=image_size,
            patch_size=2,
            num_channels=1,
            hidden_dim=16,
            num_heads=2,
        )

    monkeypatch.setattr(recipe, "build_non_deep", tiny)
    spec = recipe._spec(
        "non_deep",
        "digits",
        "non_deep",
        "tiny",
        0,
        epochs=3,
        variant="6x2_cosine",
    )
    record = recipe.run_spec(spec, train_examples=256)
    # Pre-training (2 epochs) then joining (1): λ reached 1, so the plain
    # model exists and computes what the joined branchy model computed.
    assert record["branchy_params"] > record["params"]
    assert (
        abs(record["test_accuracy"] - record["branchy_test_accuracy"])
        <= 1 / record["test_examples"]
    )
    assert record["test_examples"] == 539


def _records_for(kind, model, variant, accuracies, **extra):
    return [
        dict(
            kind=kind,
            dataset="digits",
            model=model,
            size="tiny" if kind == "non_deep" else "pico",
            seed=seed,
            epochs=30,
            variant=variant,
            test_accuracy=accuracy,
            params=100 if variant in (None, "per_layer") else 25,
            macs=1e6,
            inference_images_per_second=50.0,
            train_examples=1000,
            train_seconds=10.0 if kind != "token_drop" else 5.0,
            **extra,
        )
        for seed, accuracy in enumerate(accuracies)
    ]


def test_ablation_sections_from_records(tmp_path):
    records = _records_for("compare", "jumbo", None, [0.90, 0.92])
    records += _records_for("jumbo_ffn", "jumbo", "shared", [0.80, 0.82])
    records += _records_for("compare", "registers", None, [0.90, 0.90])
    records += _records_for("token_drop", "registers", "0.9->0.1", [0.85, 0.85])
    records += _records_for(
        "non_deep",
        "non_deep",
        "6x2_linear",
        [0.95, 0.97],
        branchy_test_accuracy=0.95,
    )
    records += _records_for("non_deep", "non_deep", "plain6", [0.90, 0.90])
    ffn = "\n".join(recipe.jumbo_ffn_markdown(records))
    assert "| shared | 25 | 81.00 ± 1.41 | 50 | 2 |" in ffn
    assert "| lora8 | | | | 0 |" in ffn
    assert "shared − per_layer = -10.00 points" in ffn
    assert "per_layer ahead; parameters 0.25x" in ffn
    assert (
        "costs no more than the seed spread: no (0 of 1)." in ffn
    )  # shared is 10 points behind per-layer here
    drop = "\n".join(recipe.token_drop_markdown(records))
    # training images/s = 1000 examples x 30 epochs / seconds
    assert "| registers | none | 90.00 ± 0.00 | 3000 | 2 |" in drop
    assert "| registers | 90% -> 10% | 85.00 ± 0.00 | 6000 | 2 |" in drop
    assert "training throughput 2.00x" in drop
    # Faster; accuracy 5 points lower with a zero spread: "none ahead".
    assert "cuts the training time (whole-fit timing): yes (1 of 1: " in drop
    assert "beyond the seed spread: no (0 of 1)." in drop
    deep = "\n".join(recipe.non_deep_markdown(records))
    assert "96.00 ± 1.41 | 95.00 ± 0.00 |" in deep
    assert "Table 6: joined 6x2 vs plain 6-layer: +6.00 points" in deep
    assert "6x2_linear ahead" in deep
    assert "plain ViT-12 | 12 | | | | | | 0 |" in deep
    assert (
        "**Does the claim hold here?** joined 6x2 beats the plain 6-layer "
        "ViT (Table 6): yes." in deep
    )  # no 12-layer or schedule runs: those claims are not answered
    text = _document_from_records(tmp_path, records)
    for title in ("(Table 3)", "(§4.2)", "(Tables 1, 5, 6)"):
        assert title in text
    assert "non_deep:digits/tiny/non_deep/plain12/seed 0" in text
    assert (
        "`KERAS_BACKEND=jax python -m recipes.image_results --sections "
        "token_drop --records " in text
    )


def test_resnas_run_searches_on_held_out_training_data():
    spec = recipe.specs("resnas", ["digits"], ["pico"], [0])[0]
    assert spec["dataset"] == "fashion_mnist"
    spec = dict(spec, epochs=1)
    record = recipe.run_resnas(
        spec,
        dict(
            train_examples=600,
            search_per_class=10,
            test_examples=200,
            random_subnets=3,
            search=dict(
                population_size=4, num_parents=2, num_children=2, iterations=1
            ),
        ),
    )
    # 10 images of each of the 10 classes held out of the 600 training
    # images for the search; the test split is scored, not searched on.
    assert record["search_examples"] == 100
    assert record["backend"] == keras.backend.backend()
    assert record["train_examples"] == 500
    assert record["test_examples"] == 200
    assert 4 <= record["evaluated"] <= 4 + 2
    assert len(record["random_test_accuracies"]) == 3
    low = 0.975 * record["mac_budget"]
    assert low <= record["searched_macs"] <= record["mac_budget"]
    for name in ("test_accuracy", "random_search_test_accuracy"):
        assert (record[name] * 200) == pytest.approx(round(record[name] * 200))


def test_resnas_section_from_records():
    def run(seed, searched, random_pick, randoms):
        return dict(
            kind="resnas",
            seed=seed,
            test_accuracy=searched,
            search_accuracy=searched + 0.05,
            random_search_search_accuracy=random_pick + 0.04,
            random_search_test_accuracy=random_pick,
            random_test_accuracies=randoms,
            largest_test_accuracy=0.9,
            evaluated=120,
            mac_budget=2.0e6,
            search_examples=1000,
            test_examples=10000,
            train_seconds=60.0,
        )

    lines = recipe.resnas_markdown(
        [run(0, 0.80, 0.78, [0.70, 0.72]), run(1, 0.82, 0.83, [0.74, 0.76])]
    )
    text = "\n".join(lines)
    assert (
        "| evolutionary search's pick | 81.00 ± 1.41 | 80.00, 82.00 |" in text
    )
    assert "| random sub-networks in the MAC window | 73.00 ± 2.83 |" in text
    assert "Evolutionary − random search: +0.50 points" in text
    assert "search ahead in 1 of 2 seeds" in text
    assert "Evolutionary − mean random sub-network: +8.00 points" in text
    # Search vs random: +0.50 points, largest std 3.54 (0.78, 0.83).
    assert "test split: +0.50 points (largest std 3.54): within the" in text
    assert "evolutionary pick scored +1.50 points vs the random" in text
    assert "span 2.00 points of test accuracy per seed" in text


def test_no_verdict_from_one_seed():
    one = {"accuracy": (0.90, 0.0), "seeds": 1}
    three = {"accuracy": (0.80, 0.01), "seeds": 3}
    assert (
        recipe._verdict(one, three, ("a", "b"))[2] == "no verdict yet (1 seed)"
    )
    gap, spread, words = recipe._verdict(dict(one, seeds=3), three, ("a", "b"))
    assert (gap, spread, words) == (pytest.approx(10.0), 1.0, "a ahead")
