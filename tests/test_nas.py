"""Search space, super-network (multi-architectural sampling), extraction,
evolutionary search, token labelling (ViT-ResNAS §2.3-2.4)."""

import itertools

import keras
import numpy as np
import pytest

from keras_jumbo import models
from keras_jumbo import nas
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from keras_jumbo.testing import run_model_test
from tests.conftest import numpy


def tiny_space():
    return nas.SearchSpace(
        embed_dims=((16, 12, 8), (24, 20), (32, 28)),
        head_dims=(4, 6, 8),
        num_heads=((3, 2), (4, 2), (4, 3)),
        mlp_dims=((32, 16), (48, 24), (64, 32)),
        skippable=((False, True), (False, True), (False,)),
        stem_filters=4,
    )


@pytest.fixture(scope="module")
def supernet():
    keras.utils.set_random_seed(0)
    model = nas.build_supernet(tiny_space(), num_classes=5, image_size=56)
    randomize_weights(model)
    return model


def images(batch, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(batch, 56, 56, 3)).astype("float32")


def test_codes_round_trip_and_validation():
    space = tiny_space()
    arch = space.largest()
    assert space.decode(space.encode(arch)) == arch
    assert len(space.encode(arch)) == space.code_length == 3 + 3 * 5
    small = space.smallest()
    assert small["embed_dims"] == (8, 20, 28)
    assert small["blocks"][0] == ((2, 16), None)
    with pytest.raises(ValueError, match="outside the search space"):
        space.validate({**arch, "embed_dims": (10, 24, 32)})
    with pytest.raises(ValueError, match="not skippable"):
        space.validate({**arch, "blocks": ((None, None), *arch["blocks"][1:])})
    with pytest.raises(ValueError, match="outside the search space"):
        blocks = (((5, 32), (3, 32)), *arch["blocks"][1:])
        space.validate({**arch, "blocks": blocks})
    with pytest.raises(ValueError, match=">= every width"):
        nas.SearchSpace(
            embed_dims=((16,), (12,)),
            head_dims=(4, 4),
            num_heads=((2,), (2,)),
            mlp_dims=((8,), (8,)),
            skippable=((False,), (False,)),
        )


def test_sampling_warms_up_from_the_largest():
    space, rng = tiny_space(), np.random.default_rng(0)
    assert all(
        space.sample(rng, progress=0.0) == space.largest() for _ in range(5)
    )
    seen = {space.key(space.sample(rng, progress=1.0)) for _ in range(50)}
    assert len(seen) > 40


def test_presets_contain_the_searched_networks():
    for size in ("tiny", "small", "medium"):
        space = nas.SearchSpace.preset(size)
        arch = models.vit_res.ARCHITECTURES[f"vit_resnas_{size}"]
        # Place the searched blocks in the first slots of each stage.
        blocks = []
        for stage, slots in zip(arch["blocks"], space.skippable, strict=True):
            skip = len(slots) - len(stage)
            skipped = [j for j, s in enumerate(slots) if s][::-1][:skip]
            chosen = iter(stage)
            blocks.append(
                tuple(
                    None if j in skipped else next(chosen)
                    for j in range(len(slots))
                )
            )
        found = {"embed_dims": arch["embed_dims"], "blocks": tuple(blocks)}
        space.validate(found)
        assert space.to_architecture(found)["blocks"] == arch["blocks"]


def test_supernet_model_checks(supernet):
    space = tiny_space()
    archs = [space.largest(), space.smallest()]
    inputs = {
        "images": images(4),
        "architecture": nas.architecture_codes(space, archs, 4),
    }
    run_model_test(
        nas.build_supernet(space, num_classes=5, image_size=56), inputs
    )


def test_one_pass_runs_each_sub_batch_as_its_extracted_subnet(supernet):
    space, rng = tiny_space(), np.random.default_rng(1)
    archs = [space.largest(), space.smallest()] + [
        space.sample(rng) for _ in range(2)
    ]
    x = images(8)
    logits = numpy(
        supernet(
            {
                "images": x,
                "architecture": nas.architecture_codes(space, archs, 8),
            }
        )
    )
    for i, arch in enumerate(archs):
        subnet = nas.extract_subnet(supernet, space, arch)
        assert not any("slot" in layer.name for layer in subnet.layers)
        assert_allclose(
            logits[2 * i : 2 * i + 2], subnet(x[2 * i : 2 * i + 2]), atol=1e-5
        )
        # One MAC counter: the space's formula == count_macs of the model.
        assert space.count_macs(arch, 56, 5) == nas.count_macs(subnet)


def test_multi_architecture_batches():
    space = tiny_space()
    x, y = images(32), np.arange(32) % 5
    data = nas.MultiArchitectureBatches(
        x, y, space, batch_size=16, num_architectures=4, warmup_steps=2, seed=0
    )
    assert len(data) == 2
    inputs, labels = data[0]
    codes = inputs["architecture"]
    assert codes.shape == (16, space.code_length)
    # Step 0 of the warm-up: only the largest network.
    assert np.all(codes == space.encode(space.largest()))
    data.on_epoch_end()
    inputs, _ = data[1]  # step 3: past the warm-up
    sub_batches = inputs["architecture"].reshape(4, 4, -1)
    assert np.all(sub_batches == sub_batches[:, :1])  # one arch per sub-batch
    with pytest.raises(ValueError, match="divisible"):
        nas.MultiArchitectureBatches(
            x, y, space, batch_size=10, num_architectures=4
        )
    with pytest.raises(ValueError, match="batch_size=64"):
        nas.MultiArchitectureBatches(
            x, y, space, batch_size=64, num_architectures=4
        )


def test_search_space_names_a_flat_argument():
    kwargs = dict(
        embed_dims=((16,), (24,)),
        head_dims=(4, 4),
        num_heads=((2,), (2,)),
        mlp_dims=((8,), (8,)),
        skippable=((False,), (False,)),
    )
    with pytest.raises(TypeError, match="embed_dims=16"):
        nas.SearchSpace(**{**kwargs, "embed_dims": (16, 24)})
    with pytest.raises(TypeError, match="skippable"):
        nas.SearchSpace(**{**kwargs, "skippable": (False, False)})


def test_codes_outside_the_space_and_bad_evaluation_data(supernet):
    space = tiny_space()
    x = images(2)
    codes = nas.architecture_codes(space, [space.largest()], 2)
    codes[1, 0] = 10  # a stage-0 width that is not a choice
    with pytest.raises(ValueError, match=r"outside the.*search space.*10"):
        supernet({"images": x, "architecture": codes})
    with pytest.raises(ValueError, match="outside the"):
        supernet.predict({"images": x, "architecture": codes}, verbose=0)
    with pytest.raises(ValueError, match="2 images, labels.shape=.3,."):
        nas.evaluate_subnet(supernet, space, space.largest(), x, np.zeros(3))


def test_supernet_trains_with_multi_architectural_sampling(supernet):
    space = tiny_space()
    model = nas.build_supernet(space, num_classes=5, image_size=56)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    x, y = images(32), np.arange(32) % 5
    data = nas.MultiArchitectureBatches(
        x, y, space, batch_size=16, num_architectures=4
    )
    history = model.fit(data, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))
    accuracy = nas.evaluate_subnet(
        model, space, space.smallest(), x, y, batch_size=16
    )
    assert 0.0 <= accuracy <= 1.0


def test_evolutionary_search_finds_the_best_admissible_network():
    space = tiny_space()
    largest = space.count_macs(space.largest(), 56, 5)
    budget = int(0.9 * largest)

    def score(arch):  # prefers wide first stages: a known optimum
        return sum(arch["embed_dims"]) + 0.01 * sum(
            s[0] for st in arch["blocks"] for s in st if s
        )

    result = nas.evolutionary_search(
        space,
        score,
        budget,
        population_size=20,
        num_parents=5,
        num_children=10,
        iterations=3,
        lower_ratio=0.8,
        image_size=56,
        num_classes=5,
        seed=0,
    )
    assert 0.8 * budget <= result["macs"] <= budget
    assert result["history"] == sorted(result["history"])
    # Exhaustive: the space has 19200 sub-networks; the search (70
    # evaluations) must land in the top 5% of the admissible ones.
    genes = space._genes()
    scores = []
    for code in itertools.product(*genes):
        arch = space.decode(code)
        if 0.8 * budget <= space.count_macs(arch, 56, 5) <= budget:
            scores.append(score(arch))
    assert result["score"] >= np.percentile(scores, 95)
    smallest = space.count_macs(space.smallest(), 56, 5)
    with pytest.raises(ValueError, match="smallest sub-network"):
        nas.evolutionary_search(
            space, score, smallest - 1, image_size=56, num_classes=5
        )


def test_evolutionary_search_ranks_nan_last_and_refuses_all_nan():
    space = tiny_space()
    budget = int(0.9 * space.count_macs(space.largest(), 56, 5))
    search = dict(
        population_size=12,
        num_parents=4,
        num_children=6,
        iterations=2,
        lower_ratio=0.8,
        image_size=56,
        num_classes=5,
        seed=0,
    )

    def diverging(arch):  # the widest candidates "diverge"
        width = sum(arch["embed_dims"])
        return float("nan") if (width // 4) % 2 == 0 else float(width)

    result = nas.evolutionary_search(space, diverging, budget, **search)
    assert np.isfinite(result["score"])
    assert result["non_finite"] > 0
    assert result["evaluated"] > result["non_finite"]
    with pytest.raises(ValueError, match="non-finite"):
        nas.evolutionary_search(
            space, lambda arch: float("nan"), budget, **search
        )
    with pytest.raises(ValueError, match="num_parents=13"):
        nas.evolutionary_search(
            space, diverging, budget, **{**search, "num_parents": 13}
        )
    with pytest.raises(ValueError, match="mutation_probability=2"):
        nas.evolutionary_search(
            space, diverging, budget, mutation_probability=2, **search
        )


def test_token_labeling_cutmix_labels_follow_the_box():
    mix = nas.TokenLabelingMix(num_classes=3, grid=4, switch_prob=1.0, seed=0)
    x = np.stack([np.full((8, 8, 1), float(i)) for i in range(4)]).astype(
        "float32"
    )
    labels = np.array([0, 1, 2, 0])
    mixed, targets = mix(x, labels)
    mixed = numpy(mixed)
    patch = numpy(targets["patch_logits"])  # (4, 16, 3)
    image = numpy(targets["logits"])
    for b in range(4):
        # Each 2x2-pixel patch is wholly one source image; its label is that
        # image's class.
        tiles = mixed[b, :, :, 0].reshape(4, 2, 4, 2).transpose(0, 2, 1, 3)
        sources = tiles.reshape(16, 4)
        assert np.all(sources == sources[:, :1])
        expected = np.eye(3)[labels[sources[:, 0].astype(int)]]
        assert_allclose(patch[b], expected, atol=0)
        # The image label is the patch labels' mean (lam = kept fraction).
        assert_allclose(image[b], patch[b].mean(0), atol=1e-6)


def test_token_labeling_mixup_and_training_losses():
    mix = nas.TokenLabelingMix(num_classes=3, grid=2, switch_prob=0.0, seed=0)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype("float32")
    labels = np.array([0, 1, 2, 1])
    mixed, targets = mix(x, labels)
    image = numpy(targets["logits"])
    assert_allclose(image.sum(-1), np.ones(4), atol=1e-6)
    assert_allclose(
        numpy(targets["patch_logits"]), np.repeat(image[:, None], 4, 1), atol=0
    )
    # Mixup: each mixed image is lam * x_b + (1 - lam) * x_partner.
    lam = image.max(-1).min()
    assert 0.0 < lam <= 1.0
    model = models.ViTRes(
        dict(
            stem_filters=4,
            embed_dims=(8, 8, 8),
            head_dims=(4, 4, 4),
            blocks=(((2, 8),),) * 3,
        ),
        num_classes=3,
        image_size=56,
        token_labeling=True,
    )
    model.compile(optimizer="adam", loss=nas.token_labeling_losses())
    big = np.random.default_rng(1).normal(size=(4, 56, 56, 3)).astype("float32")
    mixed, targets = nas.TokenLabelingMix(3, grid=1, seed=0)(big, labels)
    history = model.fit(mixed, targets, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="divisible"):
        nas.TokenLabelingMix(3, grid=3)(x, labels)


def test_channel_mask_layers():
    run_layer_test(
        nas.ChannelMask,
        {"width": 6, "index": 1, "unit": 2},
        input_shape=(3, 4),
        expected_output_shape=(3, 1, 6),
        expected_num_trainable_weights=0,
        run_training_check=False,
        run_mixed_precision_check=False,
    )
    codes = np.array([[0, 3], [0, 1], [5, 0]], "int32")
    mask = numpy(nas.ChannelMask(6, 1, unit=2)(codes))
    assert_allclose(mask[:, 0], np.arange(6)[None] < 2 * codes[:, 1:], atol=0)
    x = np.ones((3, 2, 6), "float32")
    assert_allclose(nas.ApplyChannelMask()([x, mask]), x * mask, atol=0)
    with pytest.raises(ValueError, match="width"):
        nas.ChannelMask(0, 1)


def test_subnet_keeps_the_supernets_dtype_policy():
    space = tiny_space()
    mixed = nas.ViTResSuperNet(
        space, num_classes=5, image_size=56, dtype="mixed_bfloat16"
    )
    subnet = nas.extract_subnet(mixed, space, space.smallest())
    assert subnet.get_config()["dtype"] == "mixed_bfloat16"
    assert {layer.dtype_policy.name for layer in subnet.layers} == {
        "mixed_bfloat16"
    }
