import json

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
    text = doc.read_text()
    assert "| pico | jumbo | 10 | 2.0M | 92.00 ± 2.83 | 100 | 2 |" in text
    assert "Jumbo − Registers = +12.00 points" in text
    assert "Jumbo ahead" in text
    assert "digits/pico/vit/seed 0" in text
