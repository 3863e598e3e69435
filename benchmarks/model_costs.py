"""Parameters and MACs of the papers' models, next to the papers' figures.

Every count comes from the library's one counter,
`keras_jumbo.models.count_macs` (matrix products and convolutions of one
image: projections, QKᵀ, AV, FFNs, patch projection, head; not norms,
softmax, activations or biases).

`--non-deep` (default): the Non-Deep ViT paper's Table 1 / Table 6 rows
(DeiT-Tiny geometry: width 192, 12 heads, 224 px, average pooling, 1000
classes). The branchy training models and their reparameterised
(collapsed) forms are built with random weights at λ=1.

Command (about 1 minute on 2 CPU cores):
    KERAS_BACKEND=jax python benchmarks/model_costs.py
"""

import argparse
import sys

# Non-Deep ViT Table 1 (and Table 6, which repeats DeiT-6/4/3 and gives
# other parameter counts for the -R models): (params, FLOPs).
PAPER_NON_DEEP = {
    "DeiT-Tiny (12 layers)": ("5.7M", "1.08G"),
    "NonDeepViT-6x2 (training)": ("5.7M", "1.08G"),
    "NonDeepViT-4x3 (training)": ("5.7M", "1.08G"),
    "NonDeepViT-3x4 (training)": ("5.7M", "1.08G"),
    "DeiT-6": ("3.1M", "556M"),
    "DeiT-4": ("2.2M", "381M"),
    "DeiT-3": ("1.7M", "293M"),
    "NonDeepViT-6x2-R": ("3.3M / 3.1M", "595M"),
    "NonDeepViT-4x3-R": ("2.4M / 2.2M", "415M"),
    "NonDeepViT-3x4-R": ("1.9M / 1.7M", "322M"),
}


def non_deep_models():
    import keras_jumbo as kj

    # NonDeepViT's defaults are the paper's setup: DeiT-Tiny geometry (width
    # 192, 12 heads, 224 px, patch 16, average pooling), 1000 classes.
    rows = {"DeiT-Tiny (12 layers)": kj.models.NonDeepViT(12, 1)}
    for depth, branches in ((6, 2), (4, 3), (3, 4)):
        branchy = kj.models.NonDeepViT(depth, branches)
        kj.convert.set_join_lambda(branchy, 1.0)
        rows[f"NonDeepViT-{depth}x{branches} (training)"] = branchy
        rows[f"NonDeepViT-{depth}x{branches}-R"] = kj.convert.reparameterize(
            branchy, pad_values=False
        )
    for depth in (6, 4, 3):
        rows[f"DeiT-{depth}"] = kj.models.NonDeepViT(depth, 1)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--non-deep", action="store_true", default=True)
    parser.parse_args(argv)
    from keras_jumbo.models import count_macs

    print(
        f"{'model':<28} {'params':>8} {'MACs':>9}   "
        f"{'paper params':>13} {'paper FLOPs':>11}"
    )
    for name, model in non_deep_models().items():
        params, flops = PAPER_NON_DEEP[name]
        print(
            f"{name:<28} {model.count_params() / 1e6:7.2f}M "
            f"{count_macs(model) / 1e6:8.1f}M   {params:>13} {flops:>11}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
