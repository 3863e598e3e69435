"""Load a model with its weights by preset name, path or URL; save one.

The layout of a saved preset is keras-hub's: a directory with
`config.json` (the model class and its config, as
`keras.saving.serialize_keras_object` writes it) and `model.weights.h5`.
Official PyTorch checkpoints (`.pth`) are converted once with
`keras_jumbo.convert.load_official_jumbo` and the converted model is cached
in that layout under `<cache>/keras_jumbo/converted/`, so the next load
needs neither torch nor the network. `<cache>` is `cache_dir`, else
`$KERAS_HOME`, else `~/.keras` (as `keras.utils.get_file`).
"""

import hashlib
import json
import logging
import os
import shutil
import tempfile
import urllib.parse
import urllib.request

import keras

from keras_jumbo.presets.jumbo_vit import JUMBO_VIT_PRESETS

logger = logging.getLogger("keras_jumbo")

# Bumped when the weight layout of a saved model changes (2: the encoder
# blocks became ViTBlock/JumboBlock/..., whose class names are part of the
# `.weights.h5` paths); older converted caches are then converted again.
PRESET_FORMAT_VERSION = 2
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
PRESETS = {**JUMBO_VIT_PRESETS}


def list_presets(class_name=None):
    """Sorted preset names, optionally only those of one model class.

    Example:
    >>> list_presets("JumboViT")[:2]
    ['jumbo_base_imagenet1k', 'jumbo_nano_imagenet1k']
    """
    return sorted(
        name
        for name, info in PRESETS.items()
        if class_name is None or info["class_name"] == class_name
    )


def preset_info(name):
    """A copy of a preset's entry: class, config, URL, accuracy, ..."""
    if name not in PRESETS:
        raise ValueError(
            f"Unknown preset. Known: {list_presets()}. Received: {name!r}"
        )
    return json.loads(json.dumps(PRESETS[name]))


def cache_root(cache_dir=None):
    """`<cache>/keras_jumbo`, where downloads and converted presets live."""
    base = cache_dir or os.environ.get("KERAS_HOME")
    base = base or os.path.join(os.path.expanduser("~"), ".keras")
    return os.path.join(os.fspath(base), "keras_jumbo")


def save_to_preset(model, preset_dir):
    """Write `model` as a preset directory (`config.json` + weights).

    The directory appears complete or not at all: it is written next to
    its final place and renamed into it. `from_preset(preset_dir)` loads it
    back as the same class.
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            "`model` must be a keras_jumbo model. Received: "
            f"{type(model).__name__}"
        )
    preset_dir = os.path.abspath(os.fspath(preset_dir))
    parent = os.path.dirname(preset_dir)
    os.makedirs(parent, exist_ok=True)
    partial = tempfile.mkdtemp(prefix=".partial-", dir=parent)
    try:
        config = {
            "keras_jumbo_preset_version": PRESET_FORMAT_VERSION,
            "model": keras.saving.serialize_keras_object(model),
        }
        with open(os.path.join(partial, CONFIG_FILE), "w") as file:
            json.dump(config, file, indent=2)
        model.save_weights(os.path.join(partial, WEIGHTS_FILE))
        if os.path.isdir(preset_dir):
            shutil.rmtree(preset_dir)
        os.replace(partial, preset_dir)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return preset_dir


def load_preset_dir(preset_dir):
    """The model saved by `save_to_preset(model, preset_dir)`."""
    config_path = os.path.join(preset_dir, CONFIG_FILE)
    weights_path = os.path.join(preset_dir, WEIGHTS_FILE)
    for path in (config_path, weights_path):
        if not os.path.isfile(path):
            raise ValueError(
                f"Not a preset directory: {path!r} is missing. "
                f"Received: preset={preset_dir!r}"
            )
    with open(config_path) as file:
        config = json.load(file)
    version = config.get("keras_jumbo_preset_version")
    if version != PRESET_FORMAT_VERSION:
        raise ValueError(
            f"Preset format version {version!r} in {config_path!r}; this "
            f"keras_jumbo reads version {PRESET_FORMAT_VERSION}"
        )
    import keras_jumbo  # noqa: F401  (registers the model classes)

    model = keras.saving.deserialize_keras_object(config["model"])
    model.load_weights(weights_path)
    return model


def _local_path(preset):
    if preset.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(preset).path)
    if os.path.exists(preset):
        return preset
    return None


def _file_digest(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download(url, sha256, cache_dir, what):
    """`url` into the cache, resuming an interrupted download.

    Bytes arrive in `<name>.part`; a later call asks the server for the rest
    (an HTTP `Range` request) and starts over if the server ignores it. The
    file takes its final name only when complete (and its SHA-256 matches,
    when one is pinned). A failure before any byte arrived (offline) leaves
    nothing in the cache.
    """
    name = os.path.basename(urllib.parse.urlparse(url).path) or "weights.pth"
    directory = cache_root(cache_dir)
    os.makedirs(directory, exist_ok=True)
    target = os.path.join(directory, name)
    if os.path.isfile(target) and (
        sha256 is None or _file_digest(target) == sha256
    ):
        return target
    part = target + ".part"
    try:
        _fetch(url, part)
    except Exception as error:
        received = os.path.getsize(part) if os.path.isfile(part) else 0
        if os.path.isfile(part) and not received:
            os.remove(part)
        kept = (
            f"The {received} bytes received are kept in {part}; calling "
            "again resumes from there."
            if received
            else "Nothing was kept in the cache."
        )
        raise OSError(
            f"Could not download {what} from {url} "
            f"({type(error).__name__}: {str(error)[:200]}). {kept} Without "
            "internet access, download the file on another machine and pass "
            "its local path, e.g. "
            f"`JumboViT.from_preset('/path/to/{name}')` (or a file:// URL)."
        ) from error
    if sha256 is not None:
        digest = _file_digest(part)
        if digest != sha256:
            os.remove(part)
            raise ValueError(
                f"The download of {what} from {url} has SHA-256 {digest}, "
                f"not the pinned {sha256}; it was removed."
            )
    os.replace(part, target)
    return target


def _fetch(url, part):
    """Append the missing bytes of `url` to `part` (all of them if the
    server cannot send a range)."""
    start = os.path.getsize(part) if os.path.isfile(part) else 0
    headers = {"User-Agent": "keras_jumbo"}
    if start and url.startswith(("http://", "https://")):
        headers["Range"] = f"bytes={start}-"
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        resumed = "Range" in headers and getattr(response, "status", 0) == 206
        length = response.headers.get("Content-Length")
        logger.info(
            "Downloading %s%s", url, f" from byte {start}" if resumed else ""
        )
        written = 0
        with open(part, "ab" if resumed else "wb") as file:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                file.write(chunk)
                written += len(chunk)
    if length is not None and written < int(length):
        raise OSError(
            f"the connection closed after {written} of {length} bytes"
        )


def _convert(path, expected, what, downloaded):
    """The official checkpoint at `path` as a `JumboViT` (strict load)."""
    from keras_jumbo.convert.official_jumbo import load_official_jumbo
    from keras_jumbo.convert.official_jumbo import official_config
    from keras_jumbo.convert.official_jumbo import official_jumbo_model
    from keras_jumbo.convert.official_jumbo import read_state_dict

    try:
        state = read_state_dict(path)
        found = official_config(state)
        if expected is not None:
            wanted = {key: expected[key] for key in found}
            if found != wanted:
                raise ValueError(
                    f"The checkpoint does not match {what}: the preset is "
                    f"{wanted}, the checkpoint {found}. Received: {path!r}"
                )
        include_top = "num_classes" in found
        model = official_jumbo_model(
            found["size"],
            num_classes=found.get("num_classes", 1000),
            image_size=found["image_size"],
            include_top=include_top,
        )
        load_official_jumbo(model, state, skip_head=not include_top)
    except Exception:
        if downloaded and os.path.isfile(path):
            os.remove(path)  # a bad download must not stay in the cache
        raise
    return model


def _cached_or_converted(key, path_or_url, expected, sha256, cache_dir, what):
    converted = os.path.join(
        cache_root(cache_dir), "converted", f"{key}-v{PRESET_FORMAT_VERSION}"
    )
    if os.path.isfile(os.path.join(converted, WEIGHTS_FILE)):
        return load_preset_dir(converted)
    downloaded = path_or_url.startswith(("http://", "https://", "file://"))
    if downloaded:
        path = _download(path_or_url, sha256, cache_dir, what)
    else:
        path = path_or_url
    model = _convert(path, expected, what, downloaded)
    save_to_preset(model, converted)
    logger.info("Converted %s; cached as %s", what, converted)
    return model


def load_preset(preset, cache_dir=None):
    """The model of `preset`, with its weights, as the preset stores it.

    `preset` is a name from `list_presets()`, a directory written by
    `save_to_preset`, the path of an official Jumbo `.pth` checkpoint, or
    an `http(s)://` or `file://` URL of one.
    """
    if not isinstance(preset, (str, os.PathLike)):
        raise TypeError(
            "`preset` must be a preset name, a directory, a .pth path or a "
            f"URL. Received: preset={preset!r}"
        )
    preset = os.fspath(preset)
    if preset in PRESETS:
        info = PRESETS[preset]
        return _cached_or_converted(
            preset,
            info["url"],
            info["config"],
            info["sha256"],
            cache_dir,
            f"preset {preset!r}",
        )
    path = _local_path(preset)
    if path is not None and os.path.isdir(path):
        return load_preset_dir(path)
    if path is not None and os.path.isfile(path):
        stem = os.path.splitext(os.path.basename(path))[0]
        key = f"{stem}-{_file_digest(path)[:16]}"
        return _cached_or_converted(
            key, path, None, None, cache_dir, f"checkpoint {path!r}"
        )
    if preset.startswith(("http://", "https://")):
        key = "url-" + hashlib.sha256(preset.encode()).hexdigest()[:16]
        return _cached_or_converted(
            key, preset, None, None, cache_dir, f"checkpoint {preset!r}"
        )
    raise ValueError(
        "Unknown preset: not a preset name, a directory, a file or a URL. "
        f"Known names: {list_presets()}. Received: preset={preset!r}"
    )
