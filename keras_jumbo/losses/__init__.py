"""Training losses: function-matching and attention-map distillation,
token labelling."""

from keras_jumbo.losses.attention_distillation import AttentionMapDistiller
from keras_jumbo.losses.attention_distillation import attention_map_loss
from keras_jumbo.losses.distillation import Distiller
from keras_jumbo.losses.distillation import FunctionMatchingKL
from keras_jumbo.losses.distillation import kl_divergence_from_logits
from keras_jumbo.nas.token_labeling import token_labeling_losses

__all__ = [
    "AttentionMapDistiller",
    "attention_map_loss",
    "Distiller",
    "FunctionMatchingKL",
    "kl_divergence_from_logits",
    "token_labeling_losses",
]
