"""ViT-ResNAS search spaces (Appendix B, Table 5) and architecture codes."""

import math

import keras
import numpy as np

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.models.macs import attention_macs
from keras_jumbo.models.macs import dense_macs
from keras_jumbo.models.vit_res import PATCH_SIZE
from keras_jumbo.models.vit_res import STEM_STRIDE
from keras_jumbo.models.vit_res import token_grid_size


def _sequence(name, value, what):
    """`value` as a tuple, or a TypeError naming what each entry is."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise TypeError(
            f"`{name}` must be a sequence with {what}. Received: "
            f"{name}={value!r}"
        )
    return tuple(value)


def _descending(name, values):
    values = _sequence(name, values, "the choices of one stage")
    if not values:
        raise ValueError(f"`{name}` needs at least one choice. Received: ()")
    for value in values:
        check_positive_int(name, value)
    return tuple(sorted(set(values), reverse=True))


@keras.saving.register_keras_serializable(package="keras_jumbo")
class SearchSpace:
    """A ViT-Res super-network's search space.

    Per stage s: the embedding width (`embed_dims[s]` choices), and per
    block slot the number of heads (`num_heads[s]`, heads of width
    `head_dims[s]`) and FFN hidden size (`mlp_dims[s]`); slots marked
    skippable may be removed (Appendix B: each stage is pairs of an always
    present block and a skippable one). The super-network is the largest
    choice everywhere.

    A sub-network ("architecture") is a dict
    `{"embed_dims": (d_1, ..., d_S), "blocks": ((slot, ...), ...)}` where
    each slot is `(num_heads, mlp_dim)` or None (skipped). Its integer code
    (`encode`) is `[d_1..d_S] + [keep, heads, mlp] per slot`, the
    super-network's `architecture` input.

    Args:
        embed_dims: per stage, the width choices.
        head_dims: per stage, the (fixed) head width.
        num_heads: per stage, the head-count choices.
        mlp_dims: per stage, the FFN hidden choices.
        skippable: per stage, one bool per block slot.
        stem_filters: channels of the convolutional stem (not searched).

    Example:
    >>> space = SearchSpace.preset("tiny")
    >>> arch = space.sample(np.random.default_rng(0))
    >>> space.count_macs(arch) <= space.count_macs(space.largest())
    True
    """

    def __init__(
        self,
        embed_dims,
        head_dims,
        num_heads,
        mlp_dims,
        skippable,
        stem_filters=24,
    ):
        per_stage = "one entry per stage"
        embed_dims = _sequence("embed_dims", embed_dims, per_stage)
        head_dims = _sequence("head_dims", head_dims, per_stage)
        num_heads = _sequence("num_heads", num_heads, per_stage)
        mlp_dims = _sequence("mlp_dims", mlp_dims, per_stage)
        skippable = tuple(
            _sequence("skippable", stage, "one bool per block slot")
            for stage in _sequence("skippable", skippable, per_stage)
        )
        stages = len(embed_dims)
        lengths = {
            len(x)
            for x in (embed_dims, head_dims, num_heads, mlp_dims, skippable)
        }
        if lengths != {stages} or not stages:
            raise ValueError(
                "`embed_dims`, `head_dims`, `num_heads`, `mlp_dims` and "
                "`skippable` need one entry per stage. Received lengths: "
                f"{sorted(lengths)}"
            )
        self.embed_dims = tuple(
            _descending("embed_dims", d) for d in embed_dims
        )
        self.head_dims = tuple(
            check_positive_int("head_dims", d) for d in head_dims
        )
        self.num_heads = tuple(_descending("num_heads", h) for h in num_heads)
        self.mlp_dims = tuple(_descending("mlp_dims", f) for f in mlp_dims)
        self.skippable = tuple(
            tuple(bool(s) for s in stage) for stage in skippable
        )
        if any(not stage for stage in self.skippable):
            raise ValueError(
                f"Every stage needs at least one block slot. Received: "
                f"skippable={skippable}"
            )
        self.stem_filters = check_positive_int("stem_filters", stem_filters)
        for s in range(1, stages):
            if min(self.embed_dims[s]) < max(self.embed_dims[s - 1]):
                raise ValueError(
                    "Every width of a stage must be >= every width of the "
                    "previous one (residual spatial reduction zero-pads). "
                    f"Received: embed_dims={self.embed_dims}"
                )

    # --- presets -------------------------------------------------------
    @classmethod
    def preset(cls, name):
        """`"tiny"` (ViT-ResNAS-Tiny) or `"small"` (Small and Medium)."""
        check_choice("name", name, {"tiny", "small", "medium"})
        if name == "tiny":
            return cls(
                embed_dims=(
                    (256, 224, 192, 176, 160),
                    (512, 448, 384, 352, 320),
                    (1024, 896, 768, 704, 640),
                ),
                head_dims=(32, 48, 64),
                num_heads=((6, 5, 4, 3), (12, 10, 8, 6), (12, 10, 8, 6)),
                mlp_dims=(
                    range(384, 769, 64),
                    range(768, 1537, 128),
                    range(1536, 3073, 256),
                ),
                # Three pairs (block, skippable block): 3 to 6 blocks.
                skippable=((False, True) * 3,) * 3,
            )
        return cls(
            embed_dims=(
                (320, 280, 240, 220, 200),
                (640, 560, 480, 440, 400),
                (1280, 1120, 960, 880, 800),
            ),
            head_dims=(32, 48, 64),
            num_heads=((8, 7, 6, 5), (16, 14, 12, 10), (16, 14, 12, 10)),
            mlp_dims=(
                range(480, 961, 80),
                range(960, 1921, 160),
                range(1920, 3841, 320),
            ),
            # One extra skippable block per stage: 3 to 7 blocks (Medium has
            # 7 blocks in stages 1 and 2, Table 8).
            skippable=((False, True) * 3 + (True,),) * 3,
        )

    # --- structure -----------------------------------------------------
    @property
    def num_stages(self):
        return len(self.embed_dims)

    @property
    def code_length(self):
        return self.num_stages + 3 * sum(len(s) for s in self.skippable)

    def _genes(self):
        """Choices per code position (largest first)."""
        genes = [self.embed_dims[s] for s in range(self.num_stages)]
        for s, stage in enumerate(self.skippable):
            for skippable in stage:
                genes.append((1, 0) if skippable else (1,))
                genes.append(self.num_heads[s])
                genes.append(self.mlp_dims[s])
        return genes

    def largest(self):
        """The super-network itself."""
        return self.decode([g[0] for g in self._genes()])

    def smallest(self):
        """Smallest widths, every skippable block skipped."""
        return self.decode([g[-1] for g in self._genes()])

    def encode(self, arch):
        """Architecture dict -> list of ints (validated)."""
        arch = self.validate(arch)
        code = list(arch["embed_dims"])
        for s, stage in enumerate(arch["blocks"]):
            for slot in stage:
                if slot is None:
                    code += [0, self.num_heads[s][0], self.mlp_dims[s][0]]
                else:
                    code += [1, slot[0], slot[1]]
        return code

    def decode(self, code):
        """List of ints -> architecture dict (validated)."""
        code = [int(c) for c in code]
        if len(code) != self.code_length:
            raise ValueError(
                f"An architecture code has {self.code_length} entries. "
                f"Received: {len(code)}"
            )
        embed = tuple(code[: self.num_stages])
        position = self.num_stages
        blocks = []
        for stage in self.skippable:
            slots = []
            for _ in stage:
                keep, heads, mlp = code[position : position + 3]
                position += 3
                slots.append((heads, mlp) if keep else None)
            blocks.append(tuple(slots))
        return self.validate({"embed_dims": embed, "blocks": tuple(blocks)})

    def validate(self, arch):
        """Raise a ValueError if `arch` is not in this space."""
        if not isinstance(arch, dict) or set(arch) != {"embed_dims", "blocks"}:
            raise TypeError(
                "An architecture is a dict with keys 'embed_dims' and "
                f"'blocks'. Received: {arch!r}"
            )
        embed = tuple(int(d) for d in arch["embed_dims"])
        blocks = tuple(
            tuple(None if b is None else tuple(int(v) for v in b) for b in st)
            for st in arch["blocks"]
        )
        if len(embed) != self.num_stages or len(blocks) != self.num_stages:
            raise ValueError(
                f"The search space has {self.num_stages} stages. Received: "
                f"arch={arch!r}"
            )
        for s in range(self.num_stages):
            if embed[s] not in self.embed_dims[s]:
                raise ValueError(
                    f"Sub-network outside the search space: stage {s} width "
                    f"must be one of {self.embed_dims[s]}. Received: "
                    f"{embed[s]}"
                )
            if len(blocks[s]) != len(self.skippable[s]):
                raise ValueError(
                    f"Stage {s} has {len(self.skippable[s])} block slots. "
                    f"Received: {len(blocks[s])}"
                )
            for j, slot in enumerate(blocks[s]):
                if slot is None:
                    if not self.skippable[s][j]:
                        raise ValueError(
                            "Sub-network outside the search space: stage "
                            f"{s} block {j} is not skippable. Received: None"
                        )
                    continue
                heads, mlp = slot
                if (
                    heads not in self.num_heads[s]
                    or mlp not in self.mlp_dims[s]
                ):
                    raise ValueError(
                        "Sub-network outside the search space: stage "
                        f"{s} block {j} needs heads in {self.num_heads[s]} "
                        f"and mlp_dim in {self.mlp_dims[s]}. Received: "
                        f"{slot}"
                    )
        return {"embed_dims": embed, "blocks": blocks}

    def to_architecture(self, arch):
        """The `ViTRes` architecture dict of a sub-network (skips removed)."""
        arch = self.validate(arch)
        return dict(
            stem_filters=self.stem_filters,
            embed_dims=arch["embed_dims"],
            head_dims=self.head_dims,
            blocks=tuple(
                tuple(slot for slot in stage if slot is not None)
                for stage in arch["blocks"]
            ),
        )

    # --- sampling ------------------------------------------------------
    def sample(self, rng, progress=1.0):
        """A random sub-network.

        `progress` in [0, 1] implements the warm-up of Appendix C: at 0
        only the largest choice of every dimension is sampled; the allowed
        choices grow from the largest as `1 + floor(progress * (n - 1))`
        (the reference's filter warm-up), all of them at 1.
        """
        progress = min(max(float(progress), 0.0), 1.0)
        code = []
        for choices in self._genes():
            allowed = 1 + math.floor(progress * (len(choices) - 1))
            code.append(choices[int(rng.integers(allowed))])
        return self.decode(code)

    def mutate(self, arch, rng, probability):
        """Resample every dimension with `probability`."""
        code = self.encode(arch)
        for i, choices in enumerate(self._genes()):
            if rng.random() < probability:
                code[i] = choices[int(rng.integers(len(choices)))]
        return self.decode(code)

    def crossover(self, first, second, rng):
        """Each dimension from one of the two parents at random."""
        a, b = self.encode(first), self.encode(second)
        return self.decode(
            [x if rng.random() < 0.5 else y for x, y in zip(a, b, strict=True)]
        )

    def key(self, arch):
        """A hashable canonical form (skipped slots' settings ignored)."""
        return tuple(self.encode(arch))

    # --- cost ----------------------------------------------------------
    def count_macs(
        self, arch, image_size=224, num_classes=1000, num_channels=3
    ):
        """MACs of one image through the standalone sub-network.

        The same formulas as `keras_jumbo.models.count_macs` applied to
        the built model (tested equal), without building it: stem and
        patch convolutions, per block q/k/v, QKᵀ, AV, projection and FFN,
        each reduction's 3x3 stride-2 convolution and token Linear, head.
        """
        arch = self.validate(arch)
        grid = token_grid_size(image_size, self.num_stages)
        stem = (image_size // STEM_STRIDE) ** 2 * 9 * self.stem_filters
        macs = stem * (num_channels + 2 * self.stem_filters)
        dims = arch["embed_dims"]
        macs += grid * grid * PATCH_SIZE**2 * self.stem_filters * dims[0]
        for s, stage in enumerate(arch["blocks"]):
            if s:
                grid //= 2
                macs += grid * grid * 9 * dims[s - 1] * dims[s]
                macs += dense_macs(1, dims[s - 1], dims[s])
            tokens = grid * grid + 1
            for slot in stage:
                if slot is None:
                    continue
                heads, mlp = slot
                inner = heads * self.head_dims[s]
                macs += dense_macs(tokens, dims[s], 3 * inner)
                macs += attention_macs(
                    tokens, tokens, heads, self.head_dims[s], self.head_dims[s]
                )
                macs += dense_macs(tokens, inner, dims[s])
                macs += 2 * dense_macs(tokens, dims[s], mlp)
        return macs + dense_macs(1, dims[-1], num_classes)

    def get_config(self):
        """The constructor's arguments (lists), for saving with a model."""
        return {
            "embed_dims": [list(d) for d in self.embed_dims],
            "head_dims": list(self.head_dims),
            "num_heads": [list(h) for h in self.num_heads],
            "mlp_dims": [list(f) for f in self.mlp_dims],
            "skippable": [list(stage) for stage in self.skippable],
            "stem_filters": self.stem_filters,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        if not isinstance(other, SearchSpace):
            return NotImplemented
        return self.get_config() == other.get_config()

    def __hash__(self):
        return hash(repr(self))

    def __repr__(self):
        return (
            f"SearchSpace(embed_dims={self.embed_dims}, head_dims="
            f"{self.head_dims}, num_heads={self.num_heads}, mlp_dims="
            f"{self.mlp_dims}, skippable={self.skippable})"
        )


def as_rng(seed):
    """A numpy Generator from a seed (or the Generator itself)."""
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)
