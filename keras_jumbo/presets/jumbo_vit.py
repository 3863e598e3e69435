"""`JumboViT` presets: the official ImageNet-1K weights of the Jumbo paper.

Weights: the official release (github.com/antofuller/jumbo, MIT; its
README's download links on the Hugging Face model page `antofuller/jumbo`).
Every checkpoint is the official architecture, which is
`JumboViT(size, head="official", share_jumbo_mlp=True,
layer_norm_epsilon=1e-5)` here (see `keras_jumbo.convert.official_jumbo`),
at 224 px with 1000 classes, evaluated with `ImageNetPreprocessing`
(resize the short side to 224, centre crop, ImageNet mean/std; the
official `data_loading.py`). ImageNet-1K top-1 accuracies are the official
README's (`eval_i1k.py`).

SHA-256: the release publishes none, so `sha256` is None and the download
is checked by a strict load instead (every tensor of the checkpoint used,
every shape checked, the size read back from the shapes).
"""

_URL = "https://huggingface.co/antofuller/jumbo/resolve/main/jumbo_{}.pth"
_TOP1 = {
    "pico": 69.156,
    "nano": 74.528,
    "tiny": 78.366,
    "small": 82.558,
    "base": 84.954,
}

JUMBO_VIT_PRESETS = {
    f"jumbo_{size}_imagenet1k": {
        "class_name": "JumboViT",
        "config": {
            "size": size,
            "num_classes": 1000,
            "image_size": 224,
            "head": "official",
            "share_jumbo_mlp": True,
            "layer_norm_epsilon": 1e-5,
        },
        "url": _URL.format(size),
        "sha256": None,
        "imagenet1k_top1": top1,
        "description": (
            f"Jumbo-{size}, official ImageNet-1K weights (224 px, 1000 "
            f"classes), top-1 {top1}%"
        ),
    }
    for size, top1 in _TOP1.items()
}
