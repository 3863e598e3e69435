"""Presets, offline end to end: official checkpoints served by file:// URLs.

The official weights cannot be downloaded here (no network), so the tests
serve checkpoints written by the test (the official-model fixture, and a
224 px / 1000-class checkpoint made from it) through `file://` URLs: the
same download, strict conversion, converted cache and
second load without the converter that a user's first call goes through.
"""

import hashlib
import http.server
import logging
import os
import threading

import keras
import numpy as np
import pytest

from keras_jumbo import presets
from keras_jumbo.convert import load_official_jumbo
from keras_jumbo.convert import official_jumbo
from keras_jumbo.convert import official_jumbo_model
from keras_jumbo.layers import ImageNetPreprocessing
from keras_jumbo.models import JumboViT
from keras_jumbo.models import ViT
from keras_jumbo.models import list_presets
from keras_jumbo.presets import loader
from keras_jumbo.testing import assert_allclose
from keras_jumbo.testing import randomize_weights
from keras_jumbo.testing import run_layer_test
from tests.conftest import official_fixture


@pytest.fixture(scope="module")
def official():
    state, images, logits, _, config = official_fixture()
    return state, np.transpose(images, (0, 2, 3, 1)), logits, config


def write_pth(state, path):
    import torch  # part of the test install (.ci/install.sh)

    torch.save(
        {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}, path
    )
    return str(path)


def imagenet_checkpoint(state, seed=0):
    """The fixture's weights as a 224 px, 1000-class pico checkpoint."""
    rng = np.random.default_rng(seed)
    dim = state["pos_embed"].shape[-1]
    width = state["head.weight"].shape[-1]
    return {
        **state,
        "pos_embed": rng.normal(0, 0.02, (1, 196, dim)).astype("float32"),
        "head.weight": rng.normal(0, 0.05, (1000, width)).astype("float32"),
        "head.bias": rng.normal(0, 0.05, (1000,)).astype("float32"),
    }


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_every_official_size_has_a_preset():
    names = list_presets()
    assert names == list_presets("JumboViT")
    for size, top1 in (
        ("pico", 69.156),
        ("nano", 74.528),
        ("tiny", 78.366),
        ("small", 82.558),
        ("base", 84.954),
    ):
        info = presets.preset_info(f"jumbo_{size}_imagenet1k")
        assert info["url"].endswith(f"/jumbo_{size}.pth")
        assert info["imagenet1k_top1"] == top1
        assert info["config"]["size"] == size
    assert list_presets("ViT") == []


def test_file_url_preset_reproduces_official_logits_then_loads_from_cache(
    official, tmp_path, monkeypatch
):
    state, images, logits, config = official
    source = write_pth(state, tmp_path / "jumbo_pico.pth")
    monkeypatch.setitem(
        loader.PRESETS,
        "test_pico_64px",
        {
            "class_name": "JumboViT",
            "config": {
                "size": "pico",
                "num_classes": config["num_classes"],
                "image_size": config["img_size"],
            },
            "url": "file://" + source,
            "sha256": sha256(source),
        },
    )
    cache = tmp_path / "cache"
    model = JumboViT.from_preset("test_pico_64px", cache_dir=cache)
    assert isinstance(model, JumboViT)
    assert model.get_config()["layer_norm_epsilon"] == 1e-5
    assert_allclose(model(images), logits, atol=1e-4, rtol=0)
    assert os.path.isfile(cache / "keras_jumbo" / "jumbo_pico.pth")

    # Second load: neither the converter (torch) nor the file is needed.
    os.remove(source)
    os.remove(cache / "keras_jumbo" / "jumbo_pico.pth")

    def no_conversion(*args, **kwargs):
        raise AssertionError("the cached load converted again")

    monkeypatch.setattr(official_jumbo, "read_state_dict", no_conversion)
    again = JumboViT.from_preset("test_pico_64px", cache_dir=cache)
    assert_allclose(again(images), logits, atol=1e-4, rtol=0)


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves `payload`, honouring `Range: bytes=N-`; the first response
    stops after `cut` bytes (a dropped connection)."""

    payload = b""
    cut = None
    ranges = []

    def do_GET(self):
        requested = self.headers.get("Range")
        type(self).ranges.append(requested)
        start = int(requested.split("=")[1].split("-")[0]) if requested else 0
        body = self.payload[start:]
        self.send_response(206 if requested else 200)
        self.send_header("Content-Length", str(len(body)))
        if requested:
            self.send_header(
                "Content-Range",
                f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}",
            )
        self.end_headers()
        if self.cut is not None:
            self.wfile.write(body[: self.cut])
            type(self).cut = None
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_interrupted_download_resumes(official, tmp_path, monkeypatch):
    state, images, logits, config = official
    source = write_pth(state, tmp_path / "jumbo_pico.pth")
    payload = open(source, "rb").read()
    handler = type(
        "Handler",
        (_RangeHandler,),
        {"payload": payload, "cut": len(payload) // 3, "ranges": []},
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/jumbo_pico.pth"
        monkeypatch.setitem(
            loader.PRESETS,
            "test_pico_http",
            {
                "class_name": "JumboViT",
                "config": {
                    "size": "pico",
                    "num_classes": config["num_classes"],
                    "image_size": config["img_size"],
                },
                "url": url,
                "sha256": sha256(source),
            },
        )
        cache = tmp_path / "cache"
        part = cache / "keras_jumbo" / "jumbo_pico.pth.part"
        with pytest.raises(OSError, match="resumes"):
            JumboViT.from_preset("test_pico_http", cache_dir=cache)
        assert os.path.getsize(part) == len(payload) // 3
        assert not os.path.exists(cache / "keras_jumbo" / "jumbo_pico.pth")

        model = JumboViT.from_preset("test_pico_http", cache_dir=cache)
        assert handler.ranges == [None, f"bytes={len(payload) // 3}-"]
        assert not os.path.exists(part)
        assert sha256(cache / "keras_jumbo" / "jumbo_pico.pth") == sha256(
            source
        )
        assert_allclose(model(images), logits, atol=1e-4, rtol=0)
    finally:
        server.shutdown()
        server.server_close()


def test_pinned_sha256_mismatch_is_refused(official, tmp_path, monkeypatch):
    state, *_ = official
    source = write_pth(state, tmp_path / "jumbo_pico.pth")
    info = dict(
        loader.PRESETS["jumbo_pico_imagenet1k"],
        url="file://" + source,
        sha256="0" * 64,
    )
    monkeypatch.setitem(loader.PRESETS, "jumbo_pico_imagenet1k", info)
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not the pinned 0000"):
        JumboViT.from_preset("jumbo_pico_imagenet1k", cache_dir=cache)
    files = [f for _, _, names in os.walk(cache) for f in names]
    assert files == []


def test_named_preset_with_new_head_keeps_the_backbone(
    official, tmp_path, monkeypatch, caplog
):
    state, *_ = official
    checkpoint = imagenet_checkpoint(state)
    source = write_pth(checkpoint, tmp_path / "jumbo_pico.pth")
    info = dict(loader.PRESETS["jumbo_pico_imagenet1k"], url="file://" + source)
    monkeypatch.setitem(loader.PRESETS, "jumbo_pico_imagenet1k", info)
    cache = tmp_path / "cache"
    reference = load_official_jumbo(official_jumbo_model("pico"), checkpoint)
    rng = np.random.default_rng(0)
    images = rng.normal(size=(2, 224, 224, 3)).astype("float32")

    model = JumboViT.from_preset("jumbo_pico_imagenet1k", cache_dir=cache)
    assert model.num_classes == 1000 and model.image_size == (224, 224)
    assert_allclose(model(images), reference(images), atol=1e-5, rtol=0)

    features = JumboViT.from_preset(
        "jumbo_pico_imagenet1k", include_top=False, cache_dir=cache
    )
    assert features.classifier is None
    pooled = keras.Model(reference.input, reference.pooling.output)
    assert_allclose(features(images), pooled(images), atol=1e-5, rtol=0)

    with caplog.at_level(logging.WARNING, logger="keras_jumbo"):
        ten = JumboViT.from_preset(
            "jumbo_pico_imagenet1k", num_classes=10, cache_dir=cache
        )
    assert "head is new (10 classes" in caplog.text
    assert ten.num_classes == 10
    body = keras.Model(ten.input, ten.pooling.output)
    assert_allclose(body(images), pooled(images), atol=1e-5, rtol=0)
    assert_allclose(ten(images), np.zeros((2, 10)), atol=0)  # zero head

    at_128 = JumboViT.from_preset(
        "jumbo_pico_imagenet1k", image_size=128, cache_dir=cache
    )
    assert at_128.grid_size == (8, 8)
    table = reference.position_embedding.resampled((8, 8))
    assert_allclose(at_128.position_embedding.embeddings, table, atol=1e-6)


def test_preprocess_predict_decode_end_to_end(official, tmp_path):
    state, *_ = official
    checkpoint = imagenet_checkpoint(state, seed=1)
    source = write_pth(checkpoint, tmp_path / "jumbo_pico.pth")
    model = JumboViT.from_preset(source, cache_dir=tmp_path / "cache")
    assert model.get_config()["size"] == "pico"
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(300, 400, 3)).astype("uint8")
    batch = ImageNetPreprocessing(224)(image)
    logits = model.predict(batch, verbose=0)
    top5 = presets.decode_predictions(logits, top=5)[0]
    order = np.argsort(-logits[0])[:5]
    classes = presets.imagenet_classes()
    assert [row[:2] for row in top5] == [classes[i] for i in order]
    probabilities = np.exp(logits[0] - logits[0].max())
    probabilities /= probabilities.sum()
    np.testing.assert_allclose(
        [row[2] for row in top5], probabilities[order], rtol=1e-5
    )


def test_saved_preset_directory_round_trips(tmp_path, caplog):
    model = JumboViT(
        "pico", image_size=16, patch_size=8, num_classes=3, jumbo_multiplier=2
    )
    randomize_weights(model)
    path = model.save_to_preset(tmp_path / "my_preset")
    assert sorted(os.listdir(path)) == ["config.json", "model.weights.h5"]
    x = np.random.default_rng(0).normal(size=(2, 16, 16, 3))
    loaded = JumboViT.from_preset(path)
    assert loaded.get_config() == model.get_config()
    assert_allclose(loaded(x), model(x), atol=0)
    with caplog.at_level(logging.WARNING, logger="keras_jumbo"):
        same = JumboViT.from_preset(path, num_classes=3, dropout_rate=0.1)
    assert "head is new" not in caplog.text
    assert_allclose(same(x), model(x), atol=0)
    with pytest.raises(ValueError, match="not a ViT.*JumboViT.from_preset"):
        ViT.from_preset(path)
    with pytest.raises(ValueError, match="alter"):
        JumboViT.from_preset(path, hidden_dim=32, num_heads=2)
    with pytest.raises(ValueError, match="num_classes"):
        JumboViT.from_preset(path, num_classes=0)
    with pytest.raises(TypeError, match="hiden_dim"):
        JumboViT.from_preset(path, hiden_dim=8)


def test_preset_errors_name_the_argument(official, tmp_path, monkeypatch):
    state, *_ = official
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="jumbo_pico_imagenet1k.*'jumbo_huge'"):
        JumboViT.from_preset("jumbo_huge", cache_dir=cache)
    with pytest.raises(TypeError, match="preset=123"):
        JumboViT.from_preset(123)

    # Offline: a clear error pointing at a local file; nothing cached.
    info = dict(
        loader.PRESETS["jumbo_pico_imagenet1k"],
        url="http://127.0.0.1:9/jumbo_pico.pth",
    )
    monkeypatch.setitem(loader.PRESETS, "jumbo_pico_imagenet1k", info)
    with pytest.raises(OSError, match="local path"):
        JumboViT.from_preset("jumbo_pico_imagenet1k", cache_dir=cache)
    files = [f for _, _, names in os.walk(cache) for f in names]
    assert files == []

    # A checkpoint of another size (64 px, 10 classes) under the preset.
    other = write_pth(state, tmp_path / "jumbo_pico.pth")
    info = dict(info, url="file://" + other)
    monkeypatch.setitem(loader.PRESETS, "jumbo_pico_imagenet1k", info)
    with pytest.raises(ValueError, match="does not match preset"):
        JumboViT.from_preset("jumbo_pico_imagenet1k", cache_dir=cache)
    # The bad download is not kept.
    assert not os.path.exists(cache / "keras_jumbo" / "jumbo_pico.pth")
    wider = dict(state)
    wider["patch_embed.proj.weight"] = np.zeros((128, 3, 16, 16), "float32")
    wider_path = write_pth(wider, tmp_path / "wider.pth")
    info = dict(info, url="file://" + wider_path)
    monkeypatch.setitem(loader.PRESETS, "jumbo_pico_imagenet1k", info)
    with pytest.raises(ValueError, match="'size': 'nano'"):
        JumboViT.from_preset("jumbo_pico_imagenet1k", cache_dir=cache)
    # A local file of inconsistent shapes: the key and both shapes named.
    with pytest.raises(
        ValueError, match="pos_embed.*(1, 16, 128).*(1, 16, 96)"
    ):
        JumboViT.from_preset(wider_path, cache_dir=cache)

    # Corrupt and truncated files.
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(os.urandom(4096))
    with pytest.raises(ValueError, match="corrupt"):
        JumboViT.from_preset(str(corrupt), cache_dir=cache)
    whole = open(other, "rb").read()
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match="truncated"):
        JumboViT.from_preset(str(truncated), cache_dir=cache)
    assert not os.path.exists(cache / "keras_jumbo" / "converted" / "corrupt")


def test_imagenet_class_names():
    classes = presets.imagenet_classes()
    assert len(classes) == 1000
    assert len({wordnet_id for wordnet_id, _ in classes}) == 1000
    assert [wordnet_id for wordnet_id, _ in classes] == sorted(
        wordnet_id for wordnet_id, _ in classes
    )
    assert classes[0] == ("n01440764", "tench")
    logits = np.zeros((1, 1000))
    logits[0, 2] = 5.0
    best = presets.decode_predictions(logits, top=1)[0][0]
    assert best[:2] == ("n01484850", "great white shark")
    with pytest.raises(ValueError, match="logits"):
        presets.decode_predictions(np.zeros((1, 10)))


def test_imagenet_preprocessing_layer_checks():
    run_layer_test(
        ImageNetPreprocessing,
        {"image_size": 8},
        input_shape=(2, 12, 10, 3),
        expected_output_shape=(2, 8, 8, 3),
        expected_num_trainable_weights=0,
        run_training_check=False,
    )


@pytest.mark.parametrize("shape", [(37, 53), (16, 20), (24, 24)])
def test_imagenet_preprocessing_matches_the_official_transform(shape):
    """Against the official torchvision steps, written out with torch.

    `ToTensor` (÷255), `ResizeSmall` (torchvision `Resize(antialias=True)`
    on a tensor is `interpolate(bilinear, antialias=True)`), `CenterCrop`,
    `Normalize`.
    """
    import torch

    size = 24
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, size=(*shape, 3)).astype("uint8")
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255.0
    h, w = shape
    ratio = size / min(h, w)
    new_h, new_w = int(h * ratio), int(w * ratio)
    x = torch.nn.functional.interpolate(
        x, size=(new_h, new_w), mode="bilinear", antialias=True
    )
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    x = x[:, :, top : top + size, left : left + size]
    mean = torch.tensor([0.485, 0.456, 0.406])[:, None, None]
    std = torch.tensor([0.229, 0.224, 0.225])[:, None, None]
    expected = ((x - mean) / std).permute(0, 2, 3, 1).numpy()
    got = ImageNetPreprocessing(size)(image)
    assert_allclose(got, expected, atol=2e-4, rtol=0)
    first = ImageNetPreprocessing(size, data_format="channels_first")(image)
    assert_allclose(first, np.transpose(expected, (0, 3, 1, 2)), atol=2e-4)
