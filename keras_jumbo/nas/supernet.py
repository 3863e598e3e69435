"""The ViT-Res super-network, multi-architectural sampling, extraction."""

import keras
import numpy as np
from keras import ops

from keras_jumbo._keras_internals import sublayers
from keras_jumbo.layers import ApplyChannelMask
from keras_jumbo.layers import ChannelMask
from keras_jumbo.layers import MaskedViTBlock
from keras_jumbo.layers import ResidualSpatialReduction
from keras_jumbo.layers import TokenPooling
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.layers._utils import standardize_data_format
from keras_jumbo.models.base import ConfiguredModel
from keras_jumbo.models.base import check_not_quantized
from keras_jumbo.models.base import constructor_arguments
from keras_jumbo.models.vit_res import MULTI_STAGE_LAYERS
from keras_jumbo.models.vit_res import build_vit_res
from keras_jumbo.models.vit_res import stem_tokens
from keras_jumbo.models.vit_res import token_grid_size
from keras_jumbo.nas.search_space import SearchSpace
from keras_jumbo.nas.search_space import as_rng
from keras_jumbo.schedules import drop_path_rates


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ViTResSuperNet(ConfiguredModel):
    """The weight-sharing super-network of `space` (ViT-ResNAS §2.3).

    Inputs: `{"images": ..., "architecture": int codes (batch,
    space.code_length)}` -- one code per example, so one forward pass runs
    a different sub-network on each sub-batch (multi-architectural
    sampling). The codes become prefix channel masks: the stage width
    (tokens are zero beyond it, norms are `MaskedLayerNorm` over the
    active channels), heads and FFN units per block, and a keep flag per
    skippable block. With a sub-network's code, the output equals the
    standalone sub-network returned by `extract_subnet` (tested).

    Args:
        space: a `SearchSpace` (or its config dict).
        num_classes, image_size, num_channels, drop_path_rate,
        layer_norm_epsilon, data_format, name: as `ViTRes`.

    The model returns logits; `space` and the other arguments are its
    config and attributes (what `extract_subnet` reads).

    Example:
    >>> space = SearchSpace.preset("tiny")
    >>> supernet = ViTResSuperNet(space, num_classes=10, image_size=56)
    >>> supernet.space.code_length
    57
    """

    # Layers of the graph, as attributes (as `ViTRes`): `blocks[s][j]` is
    # block slot j of stage s.
    exposed_layers = MULTI_STAGE_LAYERS

    def check_input_values(self, inputs):
        """Refuse architecture codes outside the search space (numpy codes:
        every `fit`/`predict`/call with arrays; inside a traced step the
        values are not known and a code is used as given)."""
        codes = inputs.get("architecture") if isinstance(inputs, dict) else None
        if not isinstance(codes, np.ndarray) or codes.ndim != 2:
            return
        for row in np.unique(codes, axis=0):
            try:
                self.space.decode(row)
            except ValueError as error:
                raise ValueError(
                    f"Architecture code {row.tolist()} is outside the "
                    f"super-network's search space: {error}"
                ) from None

    def __init__(
        self,
        space,
        *,
        num_classes=1000,
        image_size=224,
        num_channels=3,
        drop_path_rate=0.0,
        layer_norm_epsilon=1e-6,
        data_format=None,
        name="vit_res_supernet",
        **kwargs,
    ):
        config = constructor_arguments(locals())
        if isinstance(space, dict):
            # A saved config: `{"embed_dims": ...}` or its serialised form.
            space = SearchSpace.from_config(space.get("config", space))
        if not isinstance(space, SearchSpace):
            raise TypeError(
                "`space` must be a SearchSpace. "
                f"Received: {type(space).__name__}"
            )
        data_format = standardize_data_format(data_format)
        config.update(space=space, data_format=data_format)
        inputs, logits, layers = _supernet_graph(
            space,
            num_classes=num_classes,
            image_size=image_size,
            num_channels=num_channels,
            drop_path_rate=drop_path_rate,
            layer_norm_epsilon=layer_norm_epsilon,
            data_format=data_format,
        )
        for key, layer in layers.items():
            setattr(self, key, layer)
        self._finish(inputs, logits, config, name, kwargs)


def build_supernet(space, **kwargs):
    """`ViTResSuperNet(space, **kwargs)` (the name earlier releases used)."""
    return ViTResSuperNet(space, **kwargs)


def _supernet_graph(
    space,
    *,
    num_classes,
    image_size,
    num_channels,
    drop_path_rate,
    layer_norm_epsilon,
    data_format,
):
    check_positive_int("num_classes", num_classes)
    check_positive_int("num_channels", num_channels)
    check_rate("drop_path_rate", drop_path_rate)
    grid = token_grid_size(image_size, space.num_stages)
    if data_format == "channels_last":
        input_shape = (image_size, image_size, num_channels)
    else:
        input_shape = (num_channels, image_size, image_size)
    widths = [max(d) for d in space.embed_dims]
    depth = sum(len(stage) for stage in space.skippable)
    rates = drop_path_rates(drop_path_rate, depth)

    images = keras.Input(shape=input_shape, name="images")
    codes = keras.Input(
        shape=(space.code_length,), dtype="int32", name="architecture"
    )
    embed_masks = [
        ChannelMask(widths[s], s, name=f"embed_mask_{s}")(codes)
        for s in range(space.num_stages)
    ]
    x, layers = stem_tokens(
        images,
        space.stem_filters,
        widths[0],
        grid,
        layer_norm_epsilon,
        data_format,
        make_classifier=lambda: keras.layers.Dense(num_classes, name="head"),
    )
    x = ApplyChannelMask(name="embed_masking")([x, embed_masks[0]])
    column = space.num_stages
    index = 0
    for s, stage in enumerate(space.skippable):
        if s:
            reduction = ResidualSpatialReduction(
                widths[s],
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"reduction_{s}",
            )
            layers["reductions"].append(reduction)
            x = reduction(
                x,
                channel_mask=embed_masks[s - 1],
                output_channel_mask=embed_masks[s],
            )
        head_dim = space.head_dims[s]
        heads, mlp_dim = max(space.num_heads[s]), max(space.mlp_dims[s])
        layers["blocks"].append([])
        for j, skippable in enumerate(stage):
            layer_mask = None
            if skippable:
                layer_mask = ChannelMask(
                    1, column, name=f"stage_{s}_slot_{j}_keep"
                )(codes)
            head_mask = ChannelMask(
                heads * head_dim,
                column + 1,
                unit=head_dim,
                name=f"stage_{s}_slot_{j}_heads",
            )(codes)
            hidden_mask = ChannelMask(
                mlp_dim, column + 2, name=f"stage_{s}_slot_{j}_hidden"
            )(codes)
            column += 3
            block = MaskedViTBlock(
                heads,
                mlp_dim,
                head_dim=head_dim,
                drop_path_rate=rates[index],
                layer_norm_epsilon=layer_norm_epsilon,
                name=f"stage_{s}_slot_{j}",
            )
            layers["blocks"][-1].append(block)
            x = block(
                x,
                embed_mask=embed_masks[s],
                head_mask=head_mask,
                hidden_mask=hidden_mask,
                layer_mask=layer_mask,
            )
            index += 1
    x = layers["final_norm"](x, channel_mask=embed_masks[-1])
    x = TokenPooling("token", 1, name="pooling")(x)
    logits = layers["classifier"](x)
    return {"images": images, "architecture": codes}, logits, layers


def architecture_codes(space, architectures, batch_size):
    """Int codes `(batch_size, code_length)`: the architectures in equal
    contiguous sub-batches (the first sub-batch gets the first one)."""
    count = len(architectures)
    if batch_size % count:
        raise ValueError(
            "The batch must split into equal sub-batches, one per sampled "
            f"sub-network. Received: batch_size={batch_size}, "
            f"num_architectures={count}"
        )
    rows = [space.encode(arch) for arch in architectures]
    return np.repeat(np.asarray(rows, "int32"), batch_size // count, axis=0)


class MultiArchitectureBatches(keras.utils.PyDataset):
    """Batches `({"images", "architecture"}, labels)` for super-network
    training with multi-architectural sampling (ViT-ResNAS §2.3, App. C).

    Every batch samples `num_architectures` (N_a) sub-networks and gives
    each a contiguous sub-batch of `batch_size / N_a` examples, so one
    forward/backward pass trains N_a sub-networks. Sampling warms up from
    the largest sub-network to the full space over `warmup_steps` (the
    paper: the first 25% of training; `SearchSpace.sample(progress)`).

    Args:
        images, labels: arrays (the training split).
        space: the `SearchSpace`.
        batch_size: int, divisible by `num_architectures`.
        num_architectures: N_a (16 in the paper; 1 = single-architecture
            sampling).
        warmup_steps: int >= 0.
        shuffle: bool, reshuffle every epoch.
        seed: int.
        **kwargs: `keras.utils.PyDataset` arguments (workers, ...).
    """

    def __init__(
        self,
        images,
        labels,
        space,
        batch_size=256,
        num_architectures=16,
        warmup_steps=0,
        shuffle=True,
        seed=0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("batch_size", batch_size)
        check_positive_int("num_architectures", num_architectures)
        check_positive_int("warmup_steps", warmup_steps, allow_zero=True)
        if batch_size % num_architectures:
            raise ValueError(
                "`batch_size` must be divisible by `num_architectures`. "
                f"Received: batch_size={batch_size}, "
                f"num_architectures={num_architectures}"
            )
        if len(images) != len(labels):
            raise ValueError(
                f"images and labels differ in length: {len(images)} vs "
                f"{len(labels)}"
            )
        if len(images) < batch_size:
            raise ValueError(
                "Every batch must be full (one sub-batch per sampled "
                f"sub-network), so no batch fits in {len(images)} examples. "
                f"Received: batch_size={batch_size}"
            )
        self.images, self.labels, self.space = images, labels, space
        self.batch_size = batch_size
        self.num_architectures = num_architectures
        self.warmup_steps = warmup_steps
        self.shuffle = shuffle
        self.seed = seed
        self.rng = as_rng(seed)
        self.epoch = 0
        self.order = np.arange(len(images))
        if shuffle:
            self.rng.shuffle(self.order)

    def set_epoch(self, epoch):
        """Make the order and the sampled sub-networks of epoch `epoch` a
        function of `(seed, epoch, batch)` only (an int `seed` is needed),
        so that a resumed run repeats an uninterrupted one; called by
        `keras_jumbo.callbacks.EpochSeed`."""
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(
                f"set_epoch needs an int `seed`. Received: seed={self.seed!r}"
            )
        self.epoch = int(epoch)
        self.order = np.arange(len(self.images))
        if self.shuffle:
            np.random.default_rng([self.seed, self.epoch]).shuffle(self.order)
        self._per_batch_seeds = True

    def __len__(self):
        return len(self.images) // self.batch_size

    def progress(self, step):
        if not self.warmup_steps:
            return 1.0
        return min(1.0, step / self.warmup_steps)

    def __getitem__(self, index):
        step = self.epoch * len(self) + index
        rows = self.order[
            index * self.batch_size : (index + 1) * self.batch_size
        ]
        rng = self.rng
        if getattr(self, "_per_batch_seeds", False):
            rng = np.random.default_rng([self.seed, self.epoch, index])
        archs = [
            self.space.sample(rng, self.progress(step))
            for _ in range(self.num_architectures)
        ]
        codes = architecture_codes(self.space, archs, self.batch_size)
        inputs = {"images": self.images[rows], "architecture": codes}
        return inputs, self.labels[rows]

    def on_epoch_end(self):
        self.epoch += 1
        if self.shuffle:
            self.rng.shuffle(self.order)


def evaluate_subnet(supernet, space, arch, images, labels, batch_size=256):
    """Top-1 accuracy of sub-network `arch` with the shared weights, on
    every example of `images` (the last, smaller batch included)."""
    labels = np.asarray(labels)
    if len(images) != len(labels) or labels.ndim != 1:
        raise ValueError(
            "`labels` must be one class index per image. Received: "
            f"{len(images)} images, labels.shape={labels.shape}"
        )
    if not len(images):
        raise ValueError("No images to evaluate on. Received: 0 images")
    check_positive_int("batch_size", batch_size)
    code = np.asarray([space.encode(arch)], "int32")
    correct = 0
    for start in range(0, len(images), batch_size):
        batch = images[start : start + batch_size]
        codes = np.repeat(code, len(batch), axis=0)
        logits = supernet.predict_on_batch(
            {"images": batch, "architecture": codes}
        )
        predicted = np.argmax(ops.convert_to_numpy(logits), axis=-1)
        correct += int(np.sum(predicted == labels[start : start + batch_size]))
    return correct / len(images)


def _slice_to(value, shape):
    return value[tuple(slice(0, n) for n in shape)]


def _slice_qkv(value, target_shape, super_heads, head_dim):
    """q/k/v projection: kernel (D, 3 * H * hd) or bias (3 * H * hd,)."""
    if value.ndim == 2:
        dim = target_shape[0]
        heads = target_shape[1] // (3 * head_dim)
        grid = value.reshape(value.shape[0], 3, super_heads, head_dim)
        return grid[:dim, :, :heads].reshape(dim, -1)
    heads = target_shape[0] // (3 * head_dim)
    grid = value.reshape(3, super_heads, head_dim)
    return grid[:, :heads].reshape(-1)


def slice_layer_weights(source, target):
    """Copy the leading slices of `source`'s weights into `target`.

    Both layers must be built and of the same kind; every target weight is
    the prefix of the source weight along each axis, except the fused q/k/v
    projection (layout `(3, heads, head_dim)`), which keeps the first heads
    of each of q, k and v.
    """
    if len(source.weights) != len(target.weights):
        raise ValueError(
            f"Layers '{source.name}' and '{target.name}' have different "
            f"weights: {len(source.weights)} vs {len(target.weights)}"
        )
    for src, dst in zip(source.weights, target.weights, strict=True):
        value = ops.convert_to_numpy(src)
        shape = tuple(dst.shape)
        if "/qkv/" in src.path:
            attention = _owner_attention(source, src)
            value = _slice_qkv(
                value, shape, attention.num_heads, attention.head_dim
            )
        else:
            value = _slice_to(value, shape)
        if value.shape != shape:
            raise ValueError(
                f"Cannot slice {src.path} {tuple(src.shape)} to {shape}"
            )
        dst.assign(value)


def _owner_attention(layer, variable):
    for sub in sublayers(layer, include_self=True):
        if hasattr(sub, "qkv") and any(v is variable for v in sub.qkv.weights):
            return sub
    raise ValueError(f"No attention layer owns {variable.path}")


def extract_subnet(supernet, space, arch, name=None):
    """The sub-network `arch` as a standalone `ViTRes` model.

    Its weights are sliced from the super-network (leading channels, first
    heads, first FFN units, the kept block slots); its outputs equal the
    super-network's run with `arch`'s code (tested). Layers are paired by
    the two models' layer attributes (`stem_layers`, `reductions`,
    `blocks[stage][slot]`, ...), and the sub-network's sizes come from the
    super-network's config.
    """
    if not isinstance(space, SearchSpace):
        raise TypeError(
            f"`space` must be a SearchSpace. Received: {type(space).__name__}"
        )
    if not isinstance(supernet, ViTResSuperNet):
        raise TypeError(
            "`supernet` must be a ViTResSuperNet. Received: "
            f"{type(supernet).__name__}"
        )
    if space != supernet.space:
        raise ValueError(
            "`space` is not the super-network's search space. Received: "
            f"{space!r}; the super-network has {supernet.space!r}"
        )
    arch = space.validate(arch)
    check_not_quantized(supernet, "extract_subnet")
    model = build_vit_res(
        space.to_architecture(arch),
        num_classes=supernet.num_classes,
        image_size=supernet.image_size,
        num_channels=supernet.num_channels,
        layer_norm_epsilon=supernet.layer_norm_epsilon,
        data_format=supernet.data_format,
        name=name or "vit_res_subnet",
        # The super-network's `dtype` argument (e.g. mixed_bfloat16), if any.
        **{k: v for k, v in supernet.get_config().items() if k == "dtype"},
    )
    pairs = list(zip(supernet.stem_layers, model.stem_layers, strict=True))
    for attribute in (
        "patch_embedding",
        "position_embedding",
        "class_token",
        "final_norm",
        "classifier",
    ):
        pairs.append((getattr(supernet, attribute), getattr(model, attribute)))
    pairs += list(
        zip(supernet.reductions[1:], model.reductions[1:], strict=True)
    )
    for slots, blocks, stage in zip(
        supernet.blocks, model.blocks, arch["blocks"], strict=True
    ):
        kept = [j for j, slot in enumerate(stage) if slot is not None]
        pairs += [
            (slots[j], block) for j, block in zip(kept, blocks, strict=True)
        ]
    for source, target in pairs:
        if target.weights:
            slice_layer_weights(source, target)
    return model
