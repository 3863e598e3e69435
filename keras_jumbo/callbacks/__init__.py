"""Training callbacks (schedules driven by the training step)."""

from keras_jumbo.callbacks.epoch_seed import EpochSeed
from keras_jumbo.callbacks.join_schedule import JoinSchedule
from keras_jumbo.callbacks.join_schedule import join_lambda_at
from keras_jumbo.callbacks.token_drop_schedule import TokenDropSchedule
from keras_jumbo.callbacks.token_drop_schedule import set_token_drop_rate
from keras_jumbo.callbacks.token_drop_schedule import token_dropping_layers

__all__ = [
    "EpochSeed",
    "JoinSchedule",
    "TokenDropSchedule",
    "join_lambda_at",
    "set_token_drop_rate",
    "token_dropping_layers",
]
