"""Collapse a trained branchy NonDeepViT into a plain shallow ViT, exactly."""

import keras
import numpy as np

from keras_jumbo._keras_internals import sync_state
from keras_jumbo.layers import ClassToken
from keras_jumbo.layers import MultiHeadSelfAttention
from keras_jumbo.layers import PatchEmbedding
from keras_jumbo.layers import PositionEmbedding
from keras_jumbo.layers import TokenPooling
from keras_jumbo.layers._utils import check_bool
from keras_jumbo.layers._utils import get_activation
from keras_jumbo.models.base import check_not_quantized
from keras_jumbo.models.base import dtype_policy_scope
from keras_jumbo.models.non_deep_vit import NonDeepViT


def _np(variable):
    return keras.ops.convert_to_numpy(variable).astype("float64")


def merged_block_weights(block):
    """Single-branch weights of a `ParallelBranchBlock` at λ=1 (numpy).

    Attention: per head, the n branches' query and key kernels are
    concatenated (key width n·d_k: Σ_b Q_b K_bᵀ = [Q_1..Q_n][K_1..K_n]ᵀ);
    value and output kernels and all biases of V/O are summed. FFN: first
    and second layers summed (§3.3, eq. 6-9).
    """
    att = block.attention
    n = block.num_branches

    def concat(kernel):  # (n, D, H, k) -> (D, H, n*k)
        return np.concatenate([kernel[b] for b in range(n)], axis=-1)

    weights = {
        "query_kernel": concat(_np(att.query_kernel)),
        "key_kernel": concat(_np(att.key_kernel)),
        "value_kernel": _np(att.value_kernel).sum(0),
        "output_kernel": _np(att.output_kernel).sum(0),
        "fc1_kernel": _np(block.fc1_kernel).sum(0),
        "fc1_bias": _np(block.fc1_bias).sum(0),
        "fc2_kernel": _np(block.fc2_kernel).sum(0),
        "fc2_bias": _np(block.fc2_bias).sum(0),
        "norm1": (_np(block.norm1.gamma), _np(block.norm1.beta)),
        "norm2": (_np(block.norm2.gamma), _np(block.norm2.beta)),
    }
    if att.use_bias:
        weights["query_bias"] = np.concatenate(
            [_np(att.query_bias)[b] for b in range(n)], axis=-1
        )
        weights["key_bias"] = np.concatenate(
            [_np(att.key_bias)[b] for b in range(n)], axis=-1
        )
        weights["value_bias"] = _np(att.value_bias).sum(0)
        weights["output_bias"] = _np(att.output_bias).sum(0)
    return weights


def _absorb(gamma, beta, kernel, bias):
    """LN affine folded into the next linear map (Non-Deep ViT eq. 1).

    `(n̂·γ + β) W + b = n̂ (diag(γ) W) + (β W + b)`, for kernels whose first
    axis is the input width (any trailing shape).
    """
    shape = (-1,) + (1,) * (kernel.ndim - 1)
    new_kernel = kernel * gamma.reshape(shape)
    new_bias = np.tensordot(beta, kernel, axes=(0, 0)) + bias
    return new_kernel, new_bias


def _pad_values(weights, width):
    """Zero-pad the value width of merged attention weights to `width`."""
    extra = width - weights["value_kernel"].shape[-1]
    if extra <= 0:
        return weights
    weights = dict(weights)
    weights["value_kernel"] = np.pad(
        weights["value_kernel"], [(0, 0), (0, 0), (0, extra)]
    )
    weights["output_kernel"] = np.pad(
        weights["output_kernel"], [(0, 0), (0, extra), (0, 0)]
    )
    if "value_bias" in weights:
        weights["value_bias"] = np.pad(
            weights["value_bias"], [(0, 0), (0, extra)]
        )
    return weights


def reparameterize(
    model, force=False, absorb_layer_norm=True, pad_values=False
):
    """Return a plain shallow ViT computing what the branchy model does at λ=1.

    The result is a plain pre-norm ViT: Keras' `LayerNormalization` and
    `Dense` layers, keras_jumbo's `MultiHeadSelfAttention(num_heads,
    head_dim=d_v, key_dim=n·d_k)` (the joined queries and keys are n times
    wider than the values; the same function as Keras'
    `MultiHeadAttention(key_dim=n·d_k, value_dim=d_v)`, tested) and the
    model's own stem and pooling layers; no branch code remains. Outputs
    match the branchy model at λ=1 to float32 rounding (tested: <= 1e-5).
    Choice: releases up to 2026-11-24 built Keras' `MultiHeadAttention`,
    whose unequal key and value widths take its einsum path, which XLA
    ran 2-3x slower on CPU than this layer's layout (JAX inference of the
    reparameterised 6x2 model was half the branchy model's speed).

    Args:
        model: a `NonDeepViT` (any functional model of `ParallelBranchBlock`s
            on the ViT stem).
        force: the branches are joined exactly only at λ=1. With λ < 1 a
            `ValueError` is raised unless `force=True`, in which case the
            result is the model's λ=1 function, not its current one.
        absorb_layer_norm: fold every LayerNorm's γ and β into the next
            linear layer (q/k/v projections, first FFN layer, head; §3.2
            eq. 1), leaving parameter-free LayerNorms. Exact.
        pad_values: bool. False (default): the lean model, value width d_v
            (the branches' value kernels summed). True zero-pads the value
            projection from d_v to the key width n·d_k: still exact, but
            the value and A·V products cost n times more (kept for
            comparison with earlier releases).

    Returns:
        A new functional `keras.Model`.
    """
    if not isinstance(model, NonDeepViT):
        raise TypeError(
            "`model` must be a NonDeepViT model (load a saved one with "
            "`keras.saving.load_model` first). Received: model="
            f"{model!r:.80} of type {type(model).__name__}"
        )
    check_bool("force", force)
    check_bool("absorb_layer_norm", absorb_layer_norm)
    check_bool("pad_values", pad_values)
    check_not_quantized(model, "reparameterize")
    blocks = model.blocks
    sync_state(model)
    # λ matters only where there is more than one branch to join.
    lambdas = [
        float(keras.ops.convert_to_numpy(join.join_lambda))
        for block in blocks
        if block.num_branches > 1
        for join in (block.attention.join, block.mlp_join)
    ]
    if not force and any(abs(lam - 1.0) > 1e-6 for lam in lambdas):
        raise ValueError(
            "The branches are joined exactly only at λ=1 (finish the "
            "JoinSchedule, or pass force=True to get the λ=1 function). "
            f"Received: λ values {sorted(set(lambdas))}"
        )
    patch = model.patch_embedding
    position = model.position_embedding
    class_token = model.class_token
    pooling = model.pooling
    final_norm = model.final_norm
    head = model.classifier

    # === Functional Model (plain ViT layers) ===
    # Built under the branchy model's dtype policy (e.g. mixed_bfloat16):
    # new Keras layers would otherwise take Keras' global policy.
    with dtype_policy_scope(model.dtype_policy):
        inputs = keras.Input(shape=model.inputs[0].shape[1:], name="images")
        new_patch = PatchEmbedding.from_config(patch.get_config())
        new_position = PositionEmbedding.from_config(position.get_config())
        x = new_position(new_patch(inputs))
        dim = patch.hidden_dim
        x = keras.layers.Reshape((-1, dim), name="flatten")(x)
        new_class_token = None
        if class_token is not None:
            new_class_token = ClassToken.from_config(class_token.get_config())
            x = new_class_token(x)
        assignments = []
        for index, block in enumerate(blocks):
            w = merged_block_weights(block)
            if pad_values:
                w = _pad_values(w, w["query_kernel"].shape[-1])
            eps = block.layer_norm_epsilon
            affine = not absorb_layer_norm
            norm1 = keras.layers.LayerNormalization(
                epsilon=eps,
                center=affine,
                scale=affine,
                name=f"block_{index}_ln1",
            )
            heads = block.attention.num_heads
            attention = MultiHeadSelfAttention(
                num_heads=heads,
                head_dim=w["value_kernel"].shape[-1],
                key_dim=w["query_kernel"].shape[-1],
                name=f"block_{index}_attention",
            )
            h = attention(norm1(x))
            x = keras.layers.Add(name=f"block_{index}_add1")([x, h])
            norm2 = keras.layers.LayerNormalization(
                epsilon=eps,
                center=affine,
                scale=affine,
                name=f"block_{index}_ln2",
            )
            fc1 = keras.layers.Dense(
                w["fc1_kernel"].shape[-1],
                # Our erf GELU (registered, serialisable): exported graphs then
                # need no Erfc kernel (onnxruntime has none).
                activation=get_activation(block.activation),
                name=f"block_{index}_fc1",
            )
            fc2 = keras.layers.Dense(dim, name=f"block_{index}_fc2")
            x = keras.layers.Add(name=f"block_{index}_add2")(
                [x, fc2(fc1(norm2(x)))]
            )
            assignments.append((w, norm1, attention, norm2, fc1, fc2))
        token_head = pooling.mode in ("token", "avg")
        fold_final = absorb_layer_norm and head is not None and token_head
        new_final = keras.layers.LayerNormalization(
            epsilon=final_norm.epsilon,
            center=not fold_final,
            scale=not fold_final,
            name="final_norm",
        )
        x = new_final(x)
        x = TokenPooling.from_config(pooling.get_config())(x)
        new_head = None
        if head is not None:
            new_head = keras.layers.Dense(
                head.units, activation=head.activation, name="head"
            )
            x = new_head(x)
        result = keras.Model(inputs, x, name=f"{model.name}_reparameterized")

    # === Weights ===
    new_patch.set_weights(patch.get_weights())
    new_position.set_weights(position.get_weights())
    if new_class_token is not None:
        new_class_token.set_weights(class_token.get_weights())
    for w, norm1, attention, norm2, fc1, fc2 in assignments:
        names = ("query", "key", "value")
        kernels = {name: w[f"{name}_kernel"] for name in names}
        biases = {
            name: w.get(f"{name}_bias", np.zeros(kernels[name].shape[1:]))
            for name in names
        }
        fc1_kernel, fc1_bias = w["fc1_kernel"], w["fc1_bias"]
        if absorb_layer_norm:
            for name in names:
                kernels[name], biases[name] = _absorb(
                    *w["norm1"], kernels[name], biases[name]
                )
            fc1_kernel, fc1_bias = _absorb(*w["norm2"], fc1_kernel, fc1_bias)
        else:
            norm1.set_weights(list(w["norm1"]))
            norm2.set_weights(list(w["norm2"]))
        # The fused q/k/v kernel's columns are [q | k | v], each
        # (heads, width) flattened; the output kernel is (heads, d_v, D).
        qkv_kernel = np.concatenate(
            [kernels[name].reshape(dim, -1) for name in names], axis=-1
        )
        qkv_bias = np.concatenate([biases[name].reshape(-1) for name in names])
        output_kernel = w["output_kernel"].reshape(-1, dim)
        output_bias = w.get("output_bias", np.zeros(dim))
        attention.set_weights(
            [qkv_kernel, qkv_bias, output_kernel, output_bias]
        )
        fc1.set_weights([fc1_kernel, fc1_bias])
        fc2.set_weights([w["fc2_kernel"], w["fc2_bias"]])
    gamma, beta = _np(final_norm.gamma), _np(final_norm.beta)
    if fold_final:
        kernel, bias = _absorb(gamma, beta, _np(head.kernel), _np(head.bias))
        new_head.set_weights([kernel, bias])
    else:
        new_final.set_weights([gamma, beta])
        if new_head is not None:
            new_head.set_weights(head.get_weights())
    return result
