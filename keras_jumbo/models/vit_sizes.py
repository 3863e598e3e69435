"""ViT sizes used by the Jumbo paper.

Jumbo paper (arXiv 2502.15021) §2.1: "The models we train all have 12
layers, while the widths vary {96, 128, 192, 384, 768}, corresponding to
names {pico, nano, tiny, small, base}". Heads and J per size follow the
official release's `configs.py` (github antofuller/jumbo): heads
3/4/3/6/12; J = 6, except J = 3 for base (§4.2: J = 6 did not fit in
memory). Patch 16 and FFN ratio 4 everywhere.
"""

VIT_SIZES = {
    "pico": {"hidden_dim": 96, "num_heads": 3, "depth": 12, "jumbo": 6},
    "nano": {"hidden_dim": 128, "num_heads": 4, "depth": 12, "jumbo": 6},
    "tiny": {"hidden_dim": 192, "num_heads": 3, "depth": 12, "jumbo": 6},
    "small": {"hidden_dim": 384, "num_heads": 6, "depth": 12, "jumbo": 6},
    "base": {"hidden_dim": 768, "num_heads": 12, "depth": 12, "jumbo": 3},
}


def get_size(size):
    if not isinstance(size, str) or size not in VIT_SIZES:
        raise ValueError(
            f"Unknown `size`. Expected one of {list(VIT_SIZES)}. "
            f"Received: size={size!r}"
        )
    return VIT_SIZES[size]
