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


@pytest.mark.skipif(
    keras.backend.backend() != "jax",
    reason="keras.distribution is a JAX feature; runs in the JAX pass",
)
def test_jax_data_and_model_parallel_match_single_device():
    losses = _run_distributed("jax", ["none", "data", "model"])
    np.testing.assert_allclose(losses["data"], losses["none"], rtol=1e-5)
    np.testing.assert_allclose(losses["model"], losses["none"], rtol=1e-5)
    assert "'model'" in losses["model_sharding"]  # the Jumbo FFN is split


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="MirroredStrategy is a TensorFlow feature; runs in the TF pass",
)
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
