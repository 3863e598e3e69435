"""Attention-map distillation (Non-Deep ViT §4: "the distillation loss is
computed as the mean squared error between the teacher's attention maps and
the averaged maps across branches")."""

import math

import keras
from keras import ops

from keras_jumbo._keras_internals import BuildsStateBeforeTracing
from keras_jumbo._keras_internals import ReleasesAddedLosses
from keras_jumbo._keras_internals import WaitsForBatches
from keras_jumbo.losses.distillation import student_teacher_arguments
from keras_jumbo.losses.distillation import student_teacher_config


def attention_map_loss(teacher_maps, student_maps):
    """Squared error of attention maps, summed over keys, averaged over the
    rest (batch, heads, query tokens) and over the map pairs.

    The paper says "mean squared error"; the sum over the key axis keeps
    the loss from shrinking with the number of tokens (a 196-token map's
    entries are about 1/196, so the plain element mean is ~1e-5 and would
    vanish next to the cross-entropy). It is the element mean times the
    token count.

    Args:
        teacher_maps: list of `(batch, heads, tokens, tokens)` tensors.
        student_maps: list of the same shapes (pairs in order).

    Returns:
        A scalar tensor.

    Example:
    >>> a = np.full((1, 1, 2, 2), 0.5)
    >>> b = np.array([[[[1.0, 0.0], [0.0, 1.0]]]])
    >>> float(attention_map_loss([a], [b]))  # 0.25 + 0.25 per row
    0.5
    """
    if len(teacher_maps) != len(student_maps) or not teacher_maps:
        raise ValueError(
            "Give one teacher map per student map (at least one pair). "
            f"Received: {len(teacher_maps)} teacher and "
            f"{len(student_maps)} student maps"
        )
    total = 0.0
    for teacher, student in zip(teacher_maps, student_maps, strict=True):
        if tuple(teacher.shape[1:]) != tuple(student.shape[1:]):
            raise ValueError(
                "Teacher and student attention maps must have the same "
                "(heads, tokens, tokens). Received: teacher "
                f"{tuple(teacher.shape)}, student {tuple(student.shape)}"
            )
        student = ops.cast(student, "float32")
        teacher = ops.cast(teacher, "float32")
        total = total + ops.mean(
            ops.sum(ops.square(student - teacher), axis=-1)
        )
    return total / len(teacher_maps)


def _num_patches(model):
    image_size, patch_size = model.image_size, model.patch_size
    return math.prod(
        i // p for i, p in zip(image_size, patch_size, strict=True)
    )


@keras.saving.register_keras_serializable(package="keras_jumbo")
class AttentionMapDistiller(
    BuildsStateBeforeTracing, ReleasesAddedLosses, WaitsForBatches, keras.Model
):
    """Train a student ViT whose attention maps follow a frozen teacher's.

    Behaves as the student at inference. In training, `call` runs the
    student once with `forward_with_attention_maps`, the teacher (frozen,
    `training=False`) on the same batch, and adds
    `weight * attention_map_loss(teacher maps, student maps)` as a model
    loss (`model.losses`), to the loss `compile` was given (cross-entropy
    on the labels in the Non-Deep ViT recipe). A Non-Deep ViT student's
    maps are its branches' average (the paper's rule); block `i` of
    `student_blocks` is compared with block `i` of `teacher_blocks`
    (default: the last block of each).

    Teacher and student need the same number of heads and of patch tokens.
    Their prefix tokens may differ (a class-token teacher, a
    global-average-pooled student without one): prefix tokens come first in
    every keras_jumbo ViT, so then the trailing patch-to-patch part of both
    maps is compared.

    Args:
        student: a keras_jumbo ViT-family model (`ViT`, `RegistersViT`,
            `JumboViT`, `NonDeepViT`), images -> logits.
        teacher: any model with `forward_with_attention_maps` (e.g. a
            trained keras_jumbo ViT), frozen here.
        student_blocks, teacher_blocks: block indices, paired in order.
        weight: float > 0, the distillation loss weight.

    Example:
    ```python
    teacher = keras.saving.load_model("vit_base.keras")
    distiller = AttentionMapDistiller(NonDeepViT(6, 2), teacher)
    distiller.compile("adamw", keras.losses.CategoricalCrossentropy(
        from_logits=True))
    distiller.fit(ds, epochs=300)
    distiller.student.save("branchy_pretrained.keras")
    ```
    """

    def __init__(
        self,
        student,
        teacher,
        student_blocks=(-1,),
        teacher_blocks=(-1,),
        weight=1.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("student", student), ("teacher", teacher)):
            if not callable(
                getattr(value, "forward_with_attention_maps", None)
            ):
                raise TypeError(
                    f"`{name}` must be a model whose attention maps can be "
                    "read (`forward_with_attention_maps`, e.g. a keras_jumbo "
                    f"ViT). Received: {name}={value!r:.80}"
                )
        student_blocks, teacher_blocks = (
            list(student_blocks),
            list(teacher_blocks),
        )
        if not student_blocks or len(student_blocks) != len(teacher_blocks):
            raise ValueError(
                "`student_blocks` and `teacher_blocks` pair blocks: give "
                "equally many (at least one). Received: "
                f"student_blocks={student_blocks}, "
                f"teacher_blocks={teacher_blocks}"
            )
        if (
            isinstance(weight, bool)
            or not isinstance(weight, (int, float))
            or not weight > 0
        ):
            raise ValueError(
                f"`weight` must be a number > 0. Received: weight={weight!r}"
            )
        if student.num_heads != teacher.num_heads:
            raise ValueError(
                "Teacher and student must have the same number of heads to "
                "compare attention maps. Received: student "
                f"num_heads={student.num_heads}, teacher "
                f"num_heads={teacher.num_heads}"
            )
        patches = _num_patches(student), _num_patches(teacher)
        if patches[0] != patches[1]:
            raise ValueError(
                "Teacher and student must see the same patch grid. "
                f"Received: {patches[0]} student and {patches[1]} teacher "
                "patch tokens"
            )
        self.num_patches = patches[0]
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.student_blocks = student_blocks
        self.teacher_blocks = teacher_blocks
        self.weight = float(weight)

    def distillation_loss(self, images, training=None):
        """`(student outputs, weight * attention_map_loss)` for `images`."""
        outputs, student_maps = self.student.forward_with_attention_maps(
            images, self.student_blocks, training=training
        )
        _, teacher_maps = self.teacher.forward_with_attention_maps(
            images, self.teacher_blocks, training=False
        )
        pairs = []
        for teacher, student in zip(teacher_maps, student_maps, strict=True):
            if teacher.shape[-1] != student.shape[-1]:
                p = self.num_patches
                teacher, student = (
                    teacher[..., -p:, -p:],
                    student[..., -p:, -p:],
                )
            pairs.append((ops.stop_gradient(teacher), student))
        loss = attention_map_loss([t for t, _ in pairs], [s for _, s in pairs])
        return outputs, self.weight * loss

    def call(self, inputs, training=None):
        if not training:
            return self.student(inputs, training=training)
        outputs, loss = self.distillation_loss(inputs, training=training)
        self.add_loss(loss)
        return outputs

    def compute_output_shape(self, input_shape):
        return self.student.compute_output_shape(input_shape)

    def get_config(self):
        return student_teacher_config(
            self,
            super().get_config(),
            student_blocks=self.student_blocks,
            teacher_blocks=self.teacher_blocks,
            weight=self.weight,
        )

    @classmethod
    def from_config(cls, config):
        return cls(**student_teacher_arguments(config))
