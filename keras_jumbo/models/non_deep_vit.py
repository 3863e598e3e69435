"""The Non-Deep ViT model class (parallel branches, progressive joining)."""

import keras

from keras_jumbo.layers import ParallelBranchBlock
from keras_jumbo.layers._utils import check_rate
from keras_jumbo.models.base import constructor_arguments
from keras_jumbo.models.vision_transformer import VisionTransformerBase
from keras_jumbo.models.vision_transformer import graph_defaults
from keras_jumbo.schedules import drop_path_rates


@keras.saving.register_keras_serializable(package="keras_jumbo")
class NonDeepViT(VisionTransformerBase):
    """A wide, shallow ViT of `depth` blocks with `num_branches` branches.

    Each block is a `ParallelBranchBlock`: n attention and FFN branches over
    one normalised input, joined progressively by λ (driven by
    `keras_jumbo.callbacks.JoinSchedule`). Once λ reaches 1,
    `keras_jumbo.convert.reparameterize(model)` returns a plain `depth`-layer
    ViT computing the same function (Non-Deep ViT §3.4).

    The defaults are the paper's setup (§4 "Model setup"; Tables 1 and 6):
    DeiT-Tiny geometry (width 192, patch 16, 224 px, FFN 4x) with 12 heads,
    global average pooling instead of the class token, and L=12 layers
    folded into depth L/n with n branches: 6x2, 4x3, 3x4.

    Args:
        depth: int, blocks L/n (6, 4, 3 in the paper for n = 2, 3, 4).
        num_branches: int, branches n per block. n=1 builds the plain
            depth-L ViT from the same blocks, so `reparameterize` turns it
            into exactly the stock-layer graph of the reparameterised models
            (a like-for-like latency baseline).
        num_classes: int.
        hidden_dim: width (192).
        num_heads: heads (12).
        mlp_ratio: FFN ratio (4).
        image_size, patch_size, num_channels: 224, 16, 3.
        head: `"avg"` (the paper: global average pooling) or `"token"`.
        use_class_token: bool; needed for `head="token"`.
        include_top: bool.
        initial_lambda: float in [0, 1]; 1 = instant joining (ablation).
        diversity_weight: α, the weight of the diversity regularisation
            (mean squared pairwise cosine similarity of branch outputs,
            averaged over all attention and FFN modules; §4, Table 5,
            default 0.05). 0 disables it. Added in training only, so the
            loss `evaluate` reports is the task loss alone.
        dropout_rate, attention_dropout_rate, drop_path_rate,
        drop_path_schedule, layer_norm_epsilon, activation,
        classifier_activation, head_dropout_rate, data_format: as `ViT`.
        name: default `non_deep_vit_<depth>x<num_branches>`.

    Example:
    >>> model = NonDeepViT(depth=2, num_branches=2, num_classes=10,
    ...                    image_size=32, hidden_dim=32, num_heads=4)
    >>> model(np.zeros((1, 32, 32, 3))).shape
    (1, 10)

    The depth-scaled baselines (DeiT-6/4/3) are plain ViTs:
    `keras_jumbo.models.ViT("tiny", depth=6, num_heads=12, head="avg",
    use_class_token=False)`.
    """

    def __init__(
        self,
        depth=6,
        num_branches=2,
        *,
        num_classes=1000,
        hidden_dim=192,
        num_heads=12,
        mlp_ratio=4.0,
        image_size=224,
        patch_size=16,
        num_channels=3,
        head="avg",
        use_class_token=False,
        include_top=True,
        initial_lambda=0.0,
        diversity_weight=0.05,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        drop_path_rate=0.0,
        drop_path_schedule="linear",
        head_dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        activation="gelu",
        classifier_activation=None,
        data_format=None,
        name=None,
        **kwargs,
    ):
        config = constructor_arguments(locals())
        if isinstance(num_branches, bool) or not isinstance(num_branches, int):
            raise TypeError(
                f"`num_branches` must be an int. Received: {num_branches!r}"
            )
        if num_branches < 1:
            raise ValueError(
                "`num_branches` must be >= 1. "
                f"Received: num_branches={num_branches}"
            )
        if head not in ("avg", "token"):
            raise ValueError(
                "NonDeepViT pools with `head='avg'` (the paper) or "
                f"`head='token'`. Received: head={head!r}"
            )
        for key in ("initial_lambda", "diversity_weight"):
            value = config[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(
                    f"`{key}` must be a number. Received: {key}={value!r}"
                )
        if not 0.0 <= initial_lambda <= 1.0:
            raise ValueError(
                "`initial_lambda` must be in [0, 1]. "
                f"Received: initial_lambda={initial_lambda}"
            )
        check_rate("drop_path_rate", drop_path_rate)
        self._build(
            config,
            {**graph_defaults(), **config},
            name or f"non_deep_vit_{depth}x{num_branches}",
            kwargs,
        )

    def _build_blocks(self, graph, mlp_dim):
        depth = graph["depth"]
        rates = drop_path_rates(
            graph["drop_path_rate"], depth, graph["drop_path_schedule"]
        )
        return [
            ParallelBranchBlock(
                graph["num_heads"],
                mlp_dim,
                num_branches=graph["num_branches"],
                initial_lambda=graph["initial_lambda"],
                # α · mean over every attention and FFN module (§4).
                diversity_weight=graph["diversity_weight"] / depth,
                dropout_rate=graph["dropout_rate"],
                attention_dropout_rate=graph["attention_dropout_rate"],
                drop_path_rate=rates[index],
                layer_norm_epsilon=graph["layer_norm_epsilon"],
                activation=graph["activation"],
                name=f"branch_block_{index}",
            )
            for index in range(depth)
        ]
