"""The Non-Deep ViT builder (parallel branches, progressive joining)."""

from keras_jumbo.models.vision_transformer import build_vision_transformer

# The paper's setup (§4 "Model setup"; Tables 1 and 6): DeiT-Tiny geometry
# (width 192, patch 16, 224 px, FFN 4x) configured with 12 heads, global
# average pooling instead of the class token, and L=12 layers folded into
# depth L/n with n branches: 6x2, 4x3, 3x4.
NON_DEEP_DEFAULTS = dict(
    hidden_dim=192,
    num_heads=12,
    mlp_ratio=4.0,
    image_size=224,
    patch_size=16,
)


def NonDeepViT(
    depth=6,
    num_branches=2,
    *,
    num_classes=1000,
    head="avg",
    use_class_token=False,
    initial_lambda=0.0,
    diversity_weight=0.05,
    **kwargs,
):
    """A wide, shallow ViT of `depth` blocks with `num_branches` branches.

    Each block is a `ParallelBranchBlock`: n attention and FFN branches over
    one normalised input, joined progressively by λ (driven by
    `keras_jumbo.callbacks.JoinSchedule`). Once λ reaches 1,
    `keras_jumbo.convert.reparameterize(model)` returns a plain `depth`-layer
    ViT computing the same function (Non-Deep ViT §3.4).

    Args:
        depth: int, blocks L/n (6, 4, 3 in the paper for n = 2, 3, 4).
        num_branches: int, branches n per block. n=1 builds the plain
            depth-L ViT from the same blocks, so `reparameterize` turns it
            into exactly the stock-layer graph of the reparameterised models
            (a like-for-like latency baseline).
        num_classes: int.
        head: `"avg"` (the paper: global average pooling) or `"token"`.
        use_class_token: bool; needed for `head="token"`.
        initial_lambda: float in [0, 1]; 1 = instant joining (ablation).
        diversity_weight: α, the weight of the diversity regularisation
            (mean squared pairwise cosine similarity of branch outputs,
            averaged over all attention and FFN modules; §4, Table 5,
            default 0.05). 0 disables it.
        **kwargs: `hidden_dim` (192), `num_heads` (12), `mlp_ratio` (4),
            `image_size` (224), `patch_size` (16), `num_channels`,
            `dropout_rate`, `attention_dropout_rate`, `drop_path_rate`,
            `layer_norm_epsilon`, `include_top`, `data_format`, `name`.

    Returns:
        A functional `keras.Model`.

    Example:
    >>> model = NonDeepViT(depth=6, num_branches=2, num_classes=10)

    The depth-scaled baselines (DeiT-6/4/3) are plain ViTs:
    `keras_jumbo.models.ViT("tiny", depth=6, num_heads=12, head="avg",
    use_class_token=False)`.
    """
    if isinstance(num_branches, bool) or not isinstance(num_branches, int):
        raise TypeError(
            f"`num_branches` must be an int. Received: {num_branches!r}"
        )
    if num_branches < 1:
        raise ValueError(
            "`num_branches` must be >= 1. "
            f"Received: num_branches={num_branches}"
        )
    options = {**NON_DEEP_DEFAULTS, **kwargs}
    options.setdefault("name", f"non_deep_vit_{depth}x{num_branches}")
    return build_vision_transformer(
        "tiny",
        depth=depth,
        num_branches=num_branches,
        num_classes=num_classes,
        head=head,
        use_class_token=use_class_token,
        initial_lambda=initial_lambda,
        diversity_weight=diversity_weight,
        **options,
    )
