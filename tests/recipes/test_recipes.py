import dataclasses
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_jumbo import models
from recipes import common
from recipes import jumbo_imagenet1k

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SMALL = ["--smoke", "--train-examples", "384", "--val-examples", "64"]


def _tiny_recipe():
    def build(num_classes, image_size, smoke):
        return models.JumboViT(
            "pico",
            num_classes=num_classes,
            image_size=image_size,
            patch_size=7,
            depth=1,
            jumbo_mlp_ratio=1,
            drop_path_rate=0.2,
            dropout_rate=0.1,
        )

    return common.ImageRecipe(
        name="tiny",
        build_model=build,
        image_size=28,
        epochs=3,
        batch_size=64,
        learning_rate=2e-3,
        weight_decay=0.05,
        augmentation="three_augment",
        mixup_alpha=0.8,
        cutmix_alpha=1.0,
    )


class _Interrupt(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if self._epoch == 2 and batch == 2:
            raise KeyboardInterrupt("simulated preemption")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch


def _weights(path):
    return [
        keras.ops.convert_to_numpy(w)
        for w in keras.saving.load_model(path).weights
    ]


def test_interrupted_and_resumed_run_equals_uninterrupted(tmp_path):
    recipe = _tiny_recipe()
    straight = str(tmp_path / "straight")
    common.run(recipe, SMALL + ["--output-dir", straight, "--verbose", "0"])
    resumed = str(tmp_path / "resumed")
    argv = SMALL + ["--output-dir", resumed, "--verbose", "0"]
    with pytest.raises(KeyboardInterrupt):
        common.run(recipe, argv, extra_callbacks=[_Interrupt()])
    assert os.path.exists(os.path.join(resumed, "backup"))
    result = common.run(recipe, argv)
    # Finished: the backup is gone, the log has every epoch once or more.
    assert not os.path.exists(os.path.join(resumed, "backup"))
    assert result["epochs"] == 3
    for a, b in zip(
        _weights(os.path.join(straight, "model.keras")),
        _weights(os.path.join(resumed, "model.keras")),
        strict=True,
    ):
        np.testing.assert_allclose(a, b, atol=1e-6)
    with open(os.path.join(straight, "result.json")) as handle:
        assert json.load(handle)["val_accuracy"] == result["val_accuracy"]


def test_recipe_errors(tmp_path):
    out = ["--output-dir", str(tmp_path)]
    with pytest.raises(ValueError, match="--smoke, --data-dir"):
        common.run(_tiny_recipe(), out)
    with pytest.raises(ValueError, match="--init"):
        common.run(jumbo_imagenet1k.finetune("nano"), out + ["--data-dir", "x"])
    with pytest.raises(ValueError, match="augmentation"):
        common.run(
            dataclasses.replace(_tiny_recipe(), augmentation="autoaugment"),
            SMALL + out,
        )


def test_recipe_constants_follow_the_paper():
    pre = jumbo_imagenet1k.pretrain("nano")
    assert (pre.image_size, pre.epochs, pre.batch_size) == (128, 400, 1024)
    assert (pre.weight_decay, pre.clipnorm, pre.warmup_fraction) == (
        0.05,
        1.0,
        0.1,
    )
    assert (pre.mixup_alpha, pre.cutmix_alpha, pre.teacher_image_size) == (
        0.8,
        1.0,
        224,
    )
    fine = jumbo_imagenet1k.finetune("nano")
    assert (fine.image_size, fine.epochs, fine.learning_rate) == (224, 20, 5e-5)
    assert (fine.weight_decay, fine.warmup_fraction) == (0.1, 0.25)
    schedule = common.warmup_cosine(1e-3, 1000, 0.1, 1e-5)
    np.testing.assert_allclose(float(schedule(100)), 1e-3, rtol=1e-5)
    np.testing.assert_allclose(float(schedule(1000)), 1e-5, rtol=1e-4)
    np.testing.assert_allclose(float(schedule(50)), 5e-4, rtol=1e-5)


_DISTRIBUTED = r"""
import json, os, sys
import keras, numpy as np
import keras_jumbo as kj
kind = sys.argv[1]
rng = np.random.default_rng(0)
x = rng.normal(size=(16, 16, 16, 3)).astype("float32")
y = rng.integers(0, 5, size=(16,))
losses = {}
for kind in sys.argv[1:]:
    keras.utils.set_random_seed(0)
    devices = None
    if kind == "mirrored":
        import tensorflow as tf
        devices = ["/cpu:0", "/cpu:1"]
    with kj.distribution.distribution_scope(kind, devices=devices):
        model = kj.models.JumboViT(
            "pico", num_classes=5, image_size=16, patch_size=8, depth=2
        )
        model.compile(
            optimizer=keras.optimizers.AdamW(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        history = model.fit(
            x, y, batch_size=8, epochs=2, shuffle=False, verbose=0
        )
    losses[kind] = history.history["loss"]
    kernel = [v for v in model.weights if "jumbo_mlp/fc1/kernel" in v.path][0]
    losses[kind + "_sharding"] = str(getattr(kernel.value, "sharding", ""))
print(json.dumps(losses))
"""

_TF_TWO_CPUS = r"""
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2
)
"""


def _run_distributed(backend, kinds):
    env = dict(
        os.environ,
        KERAS_BACKEND=backend,
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        PYTHONPATH=os.path.abspath(ROOT),
    )
    script = (_TF_TWO_CPUS if backend == "tensorflow" else "") + _DISTRIBUTED
    out = subprocess.run(
        [sys.executable, "-c", script, *kinds],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.once
def test_jax_data_and_model_parallel_match_single_device():
    losses = _run_distributed("jax", ["none", "data", "model"])
    np.testing.assert_allclose(losses["data"], losses["none"], rtol=1e-5)
    np.testing.assert_allclose(losses["model"], losses["none"], rtol=1e-5)
    assert "'model'" in losses["model_sharding"]  # the Jumbo FFN is split


@pytest.mark.once
def test_tf_mirrored_strategy_matches_single_device():
    losses = _run_distributed("tensorflow", ["none", "mirrored"])
    np.testing.assert_allclose(losses["mirrored"], losses["none"], rtol=1e-4)


def test_distribution_errors():
    from keras_jumbo import distribution

    with pytest.raises(ValueError, match="kind"):
        distribution.distribution_scope("fsdp")
    other = "mirrored" if keras.backend.backend() != "tensorflow" else "data"
    with pytest.raises(ValueError, match="KERAS_BACKEND"):
        distribution.distribution_scope(other)


def _image_folder(root, rng, classes=3, per_class=8, size=20):
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"class_{c}"
            folder.mkdir(parents=True)
            for i in range(per_class):
                image = rng.integers(0, 256, size=(size, size, 3))
                image[..., c] = 255  # a learnable colour cue
                keras.utils.save_img(
                    str(folder / f"{i}.png"), image.astype("uint8")
                )
    return str(root)


def _tiny_jumbo(num_classes, image_size, smoke):
    return models.JumboViT(
        "pico",
        num_classes=num_classes,
        image_size=image_size,
        patch_size=8,
        depth=1,
        jumbo_mlp_ratio=1,
    )


def test_directory_pipeline_run_with_mixed_precision_and_logs(tmp_path, rng):
    data_dir = _image_folder(tmp_path / "images", rng)
    recipe = dataclasses.replace(
        _tiny_recipe(),
        build_model=_tiny_jumbo,
        image_size=16,
        epochs=2,
        batch_size=8,
    )
    out = tmp_path / "run"
    result = common.run(
        recipe,
        [
            "--data-dir",
            data_dir,
            "--output-dir",
            str(out),
            "--val-examples",
            "24",
            "--mixed-precision",
            "bfloat16",
            "--tensorboard",
            "--verbose",
            "0",
        ],
    )
    assert 0.0 <= result["val_accuracy"] <= 1.0
    assert np.isfinite(result["last_loss"])
    with open(out / "log.csv") as handle:
        assert len(handle.read().strip().splitlines()) == 3  # header + 2
    assert os.listdir(out / "tensorboard")
    model = keras.saving.load_model(str(out / "model.keras"))
    assert model.output_shape == (None, 3)
    assert "bfloat16" in model.dtype_policy.name


def test_tfds_pipeline_reads_prepared_data_only(tmp_path):
    import tensorflow_datasets as tfds  # the `data` extra; CI installs it

    from keras_jumbo import data

    with pytest.raises(Exception, match="download|not found|exist|data"):
        data.tfds_dataset(
            "mnist", "train", 16, 4, data_dir=str(tmp_path / "empty")
        )
    with tfds.testing.mock_data(num_examples=24):
        dataset = data.tfds_dataset("mnist", "train", 16, 4, num_classes=10)
        images, labels = next(iter(dataset.as_numpy_iterator()))
    assert images.shape == (4, 16, 16, 1)
    np.testing.assert_allclose(labels.sum(-1), 1.0)
    assert images.min() >= 0.0 and images.max() <= 255.0


def test_supernet_recipe_maps_streamed_batches_to_subnetworks(rng):
    from keras_jumbo import nas
    from recipes import vit_resnas_supernet

    recipe = vit_resnas_supernet.recipe("tiny")
    space = vit_resnas_supernet.smoke_space()
    recipe.state.update(space=space, seed=0)
    images = rng.normal(size=(16, 56, 56, 3)).astype("float32")
    labels = np.eye(10, dtype="float32")[rng.integers(0, 10, 16)]
    # Warm-up (first 25% of the steps): only the largest sub-network.
    inputs, out_labels = recipe.map_stream(images, labels, 0, 100)
    largest = np.asarray(space.encode(space.largest()))
    np.testing.assert_array_equal(
        inputs["architecture"], np.tile(largest, (16, 1))
    )
    np.testing.assert_array_equal(out_labels, labels)
    # Afterwards any sub-network; a batch of 12 splits into 4 sub-batches.
    inputs, _ = recipe.map_stream(images[:12], labels[:12], 60, 100)
    codes = inputs["architecture"]
    assert codes.shape == (12, len(largest))
    assert len({tuple(row) for row in codes}) > 1
    for row in codes:
        space.validate(space.decode(row))
    supernet = nas.build_supernet(space, num_classes=10, image_size=56)
    assert supernet(inputs).shape == (12, 10)


def test_supernet_validation_arrays_from_memory_and_stream(rng):
    from recipes import vit_resnas_supernet

    batches = [
        (rng.normal(size=(n, 4, 4, 1)), np.eye(3)[rng.integers(0, 3, n)])
        for n in (5, 5, 2)
    ]

    class InMemory(keras.utils.PyDataset):
        def __len__(self):
            return len(batches)

        def __getitem__(self, index):
            return batches[index]

    expected_images = np.concatenate([b[0] for b in batches])
    expected_labels = np.concatenate([b[1] for b in batches])
    for source, steps in ((InMemory(), None), (iter(batches * 2), 3)):
        images, labels = vit_resnas_supernet._arrays(source, steps)
        np.testing.assert_array_equal(images, expected_images)
        np.testing.assert_array_equal(labels, expected_labels)


def test_supernet_search_budget_is_the_papers_per_space():
    from keras_jumbo import nas
    from recipes import vit_resnas_supernet as resnas

    for name, budget in (("tiny", 1.8e9), ("small", 2.8e9), ("medium", 4.5e9)):
        space = nas.SearchSpace.preset(name)
        assert resnas.search_budget(name, space, 224, 1000) == int(budget)
        # Another size / class count: the same relative place in the space,
        # between the smallest and the largest sub-network there.
        low = space.count_macs(space.smallest(), 112, 10)
        high = space.count_macs(space.largest(), 112, 10)
        scaled = resnas.search_budget(name, space, 112, 10)
        assert low < scaled < high
        assert (scaled - low) / (high - low) == pytest.approx(
            (budget - space.count_macs(space.smallest(), 224, 1000))
            / (
                space.count_macs(space.largest(), 224, 1000)
                - space.count_macs(space.smallest(), 224, 1000)
            ),
            abs=1e-6,
        )
    small, medium = (
        resnas.search_budget(n, nas.SearchSpace.preset(n), 224, 1000)
        for n in ("small", "medium")
    )
    assert small < medium  # one space, two searches


def test_supernet_search_data_is_held_out_of_training(rng):
    from recipes import vit_resnas_supernet as resnas

    labels = np.repeat(np.arange(4), 40)
    train, search = resnas.hold_out_per_class(labels, 25, seed=1)
    assert len(np.intersect1d(train, search)) == 0
    assert len(train) + len(search) == len(labels)
    assert np.all(np.bincount(labels[search]) == 25)
    with pytest.raises(ValueError, match="search_per_class=40"):
        resnas.hold_out_per_class(labels, 40)

    # The recipe trains on the rest and searches on the held-out rows.
    recipe = resnas.recipe("tiny", search_per_class=5)
    images = rng.integers(0, 255, size=(160, 8, 8, 3)).astype("uint8")
    images[:, 0, 0, 0] = np.arange(160)  # a row id in every image
    args = dataclasses.make_dataclass("Args", ["smoke", "seed"])(True, 0)
    ready = dataclasses.replace(
        recipe.for_smoke(), batch_size=8, epochs=1, image_size=8
    )
    train_data = recipe.make_train_data(
        images, labels, ready, args, {"num_classes": 4}
    )
    held_images, held_labels = recipe.state["search_arrays"]
    assert len(held_images) == 4 * 5
    trained_ids = set(train_data.images[:, 0, 0, 0].round().astype(int))
    held_ids = set(held_images[:, 0, 0, 0].round().astype(int))
    assert trained_ids.isdisjoint(held_ids)
    assert len(trained_ids) + len(held_ids) == 160


def test_supernet_recipe_refuses_streamed_data_without_search_images():
    from recipes import vit_resnas_supernet as resnas

    with pytest.raises(SystemExit, match="held-out search images"):
        resnas.main(["--data-dir", "/nonexistent"])


def test_non_deep_stages_follow_the_paper():
    from recipes import non_deep_vit

    pre = non_deep_vit.pretrain("6x2")
    assert (pre.epochs, pre.batch_size, pre.learning_rate) == (300, 1024, 1e-3)
    assert (pre.weight_decay, pre.warmup_fraction) == (0.05, 5 / 300)
    join = non_deep_vit.join("6x2")
    assert join.epochs == 48  # 60k steps of ImageNet-1K at batch 1024
    # λ: 10k-step linear warm-up once the run holds it and the 50k-step
    # adjustment; shorter runs warm up over 60% of their steps.
    (schedule,) = join.callbacks(None, None, 48 * 1252)
    assert (schedule.schedule, schedule.warmup_steps) == ("linear", 10_000)
    assert non_deep_vit.join_warmup_steps(1000) == 600
    fine = non_deep_vit.finetune("6x2")
    assert (fine.epochs, fine.learning_rate, fine.weight_decay) == (
        300,
        1e-3,
        0.05,
    )
    assert (fine.mixup_alpha, fine.cutmix_alpha, fine.needs_init) == (
        0.2,
        0.0,
        True,
    )
    with pytest.raises(ValueError, match="attention-teacher"):
        non_deep_vit.recipe("6x2", "join", teacher="vit.keras")


class _Record(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.trained = self.model


def test_non_deep_stages_chain_pretrain_join_finetune(tmp_path):
    """Tiny settings: pretrain (attention-map distillation from a small ViT)
    -> join (λ to 1) -> reparameterise -> fine-tune the plain model."""
    from keras_jumbo import convert
    from keras_jumbo import losses
    from keras_jumbo.layers import ParallelBranchBlock
    from recipes import non_deep_vit

    out = {s: str(tmp_path / s) for s in non_deep_vit.STAGES}
    seen = _Record()
    pre = common.run(
        non_deep_vit.recipe("6x2", "pretrain"),
        SMALL + ["--output-dir", out["pretrain"], "--verbose", "0"],
        extra_callbacks=[seen],
    )
    assert isinstance(seen.trained, losses.AttentionMapDistiller)
    branchy = keras.saving.load_model(
        os.path.join(out["pretrain"], "model.keras")
    )
    assert isinstance(branchy, models.NonDeepViT)
    assert set(convert.get_join_lambda(branchy)) == {0.0}  # unjoined
    assert pre["epochs"] == 1

    joined = common.run(
        non_deep_vit.recipe("6x2", "join"),
        SMALL
        + [
            "--init",
            os.path.join(out["pretrain"], "model.keras"),
            "--output-dir",
            out["join"],
            "--verbose",
            "0",
        ],
    )
    assert joined["plain_layers"] == 3
    # The reparameterised model computes what the joined one does.
    assert joined["plain_val_accuracy"] == joined["val_accuracy"]
    plain_path = os.path.join(out["join"], "plain.keras")
    assert not any(
        isinstance(layer, ParallelBranchBlock)
        for layer in keras.saving.load_model(plain_path).layers
    )

    fine = common.run(
        non_deep_vit.recipe("6x2", "finetune"),
        SMALL
        + [
            "--init",
            plain_path,
            "--output-dir",
            out["finetune"],
            "--verbose",
            "0",
        ],
    )
    assert fine["epochs"] == 1 and 0.0 <= fine["val_accuracy"] <= 1.0
    tuned = keras.saving.load_model(
        os.path.join(out["finetune"], "model.keras")
    )
    assert len(tuned.weights) == len(
        keras.saving.load_model(plain_path).weights
    )
    with pytest.raises(ValueError, match="--init plain.keras"):
        common.run(
            non_deep_vit.recipe("6x2", "finetune"),
            SMALL + ["--output-dir", str(tmp_path / "none")],
        )


def test_jit_compile_flag_per_backend(monkeypatch):
    """Keras' "auto" turns XLA off for TensorFlow on CPU-only machines,
    where XLA trains pico 1.26x faster; the recipes' "auto" keeps it on.
    On PyTorch "auto" compiles long runs only, and only with a compiler."""
    backend = keras.backend.backend()
    long_run = common.TORCH_COMPILE_MIN_STEPS
    monkeypatch.setattr(common, "cxx_compiler", lambda: "g++")
    expected = {"tensorflow": True, "torch": False, "jax": "auto"}[backend]
    assert common.resolve_jit_compile("auto", long_run - 1) == expected
    expected = {"tensorflow": True, "torch": True, "jax": "auto"}[backend]
    assert common.resolve_jit_compile("auto", long_run) == expected
    assert (
        common.resolve_jit_compile("auto", long_run, False)
        == {
            "tensorflow": True,
            "torch": False,
            "jax": "auto",
        }[backend]
    )
    monkeypatch.setattr(common, "cxx_compiler", lambda: None)
    expected = {"tensorflow": True, "torch": False, "jax": "auto"}[backend]
    assert common.resolve_jit_compile("auto", long_run) == expected
    for steps in (1, long_run):
        assert common.resolve_jit_compile("true", steps) is True
        assert common.resolve_jit_compile("false", steps) is False
    with pytest.raises(ValueError, match="jit_compile='yes'"):
        common.resolve_jit_compile("yes", 1)


def test_allocator_flag_keeps_freed_memory_on_jax_only(monkeypatch):
    calls = []
    monkeypatch.setattr(
        common.kj_runtime, "keep_freed_memory", lambda: calls.append(1) or True
    )
    monkeypatch.setattr(common.kj_runtime, "huge_pages_active", lambda: False)
    on_jax = keras.backend.backend() == "jax"
    assert common.apply_allocator("auto") is on_jax
    assert common.apply_allocator("default") is False
    assert calls == ([1] if on_jax else [])
    with pytest.raises(ValueError, match="allocator='keep'"):
        common.apply_allocator("keep")


def test_allocator_flag_keeps_freed_memory_on_huge_pages_too(monkeypatch):
    """In a process on huge pages, freed memory is kept on JAX as well:
    every image recipe, the Non-Deep ViT's branchy stages included (their
    steps stopped faulting once the models' steps waited for their
    batches; benchmarks/README.md, forty-third session)."""
    calls = []
    monkeypatch.setattr(
        common.kj_runtime, "keep_freed_memory", lambda: calls.append(1) or True
    )
    monkeypatch.setattr(common.kj_runtime, "huge_pages_active", lambda: True)
    keeps = keras.backend.backend() == "jax"
    assert common.apply_allocator("auto") is keeps
    assert calls == ([1] if keeps else [])


@pytest.mark.parametrize(
    "argv, restarts",
    [
        ([], True),
        (["--smoke", "--allocator", "auto"], True),
        (["--allocator", "default", "--smoke"], False),
        (["--smoke", "--allocator=default"], False),
    ],
)
def test_recipe_scripts_restart_with_huge_pages_unless_told_not_to(
    monkeypatch, argv, restarts
):
    """The scripts' `__main__` step: the runtime's restart (which itself
    checks that huge pages change something) unless `--allocator
    default`; the command line is read from `sys.argv` by default."""
    calls = []
    monkeypatch.setattr(
        common.kj_runtime,
        "restart_with_huge_pages",
        lambda: calls.append(1) or False,
    )
    assert common.restart_with_huge_pages(argv) is False
    assert calls == ([1] if restarts else [])
    monkeypatch.setattr(common.sys, "argv", ["recipe.py", *argv])
    calls.clear()
    common.restart_with_huge_pages()
    assert calls == ([1] if restarts else [])


@pytest.mark.parametrize(
    "huge, kept, label",
    [
        (False, False, "default"),
        (False, True, "kept"),
        (True, False, "huge-pages"),
        (True, True, "huge-pages+kept"),
    ],
)
def test_allocator_label_names_huge_pages_and_kept_memory(
    monkeypatch, huge, kept, label
):
    """What the benchmarks record (throughput.py's CSV column,
    jumbo_vs_registers.py's header line)."""
    monkeypatch.setattr(common.kj_runtime, "huge_pages_active", lambda: huge)
    assert common.allocator_label(kept) == label


def test_cxx_compiler_prefers_cxx_variable(monkeypatch, tmp_path):
    compiler = tmp_path / "my-c++"
    compiler.write_text("#!/bin/sh\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CXX", str(compiler))
    assert common.cxx_compiler() == str(compiler)
    monkeypatch.setenv("CXX", "")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert common.cxx_compiler() is None
