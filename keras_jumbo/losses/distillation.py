"""Function-matching distillation (Beyer et al., 2022), as the Jumbo paper's
ImageNet-1K recipe uses it (Jumbo paper A.2.1)."""

import keras
from keras import ops

from keras_jumbo._keras_internals import BuildsStateBeforeTracing
from keras_jumbo._keras_internals import WaitsForBatches
from keras_jumbo.layers._utils import check_positive_int


def _check_temperature(temperature):
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or temperature <= 0
    ):
        raise ValueError(
            "`temperature` must be a positive number. "
            f"Received: temperature={temperature!r}"
        )
    return float(temperature)


def kl_divergence_from_logits(teacher_logits, student_logits, temperature=1.0):
    """Per-example KL(p_teacher || p_student) of temperature-scaled softmaxes.

    `sum_k p_t[k] * (log p_t[k] - log p_s[k])` with `p = softmax(logits / T)`,
    multiplied by `T**2` so that gradients keep their scale across
    temperatures (Hinton et al., 2015); T=1, the function-matching setting,
    leaves it unchanged. Computed in float32 from log-softmaxes.

    Returns:
        Tensor `(batch,)`.
    """
    temperature = _check_temperature(temperature)
    teacher = ops.cast(teacher_logits, "float32") / temperature
    student = ops.cast(student_logits, "float32") / temperature
    log_p_teacher = ops.log_softmax(teacher, axis=-1)
    log_p_student = ops.log_softmax(student, axis=-1)
    kl = ops.sum(
        ops.exp(log_p_teacher) * (log_p_teacher - log_p_student), axis=-1
    )
    return kl * (temperature**2)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class FunctionMatchingKL(keras.losses.Loss):
    """KL divergence between teacher and student logits.

    The loss of function matching (Beyer et al., 2022, "Knowledge
    distillation: A good teacher is patient and consistent"): the teacher
    and the student see the same (augmented, mixed) image and the student
    is trained to match the teacher's predictive distribution,
    `KL(softmax(teacher) || softmax(student))`. Used as a Keras loss,
    `y_true` holds the teacher's logits and `y_pred` the student's.

    Args:
        temperature: float > 0; 1.0 (the paper's) by default.
        reduction, name, dtype: as `keras.losses.Loss`.

    Example:
    >>> loss = FunctionMatchingKL()
    >>> float(loss([[2.0, 0.0]], [[2.0, 0.0]]))
    0.0
    """

    def __init__(
        self,
        temperature=1.0,
        reduction="sum_over_batch_size",
        name="function_matching_kl",
        dtype=None,
    ):
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.temperature = _check_temperature(temperature)

    def call(self, y_true, y_pred):
        return kl_divergence_from_logits(y_true, y_pred, self.temperature)

    def get_config(self):
        return {**super().get_config(), "temperature": self.temperature}


@keras.saving.register_keras_serializable(package="keras_jumbo")
class Distiller(BuildsStateBeforeTracing, WaitsForBatches, keras.Model):
    """Train a student to match a frozen teacher (function matching).

    `Distiller(student, teacher)` behaves as the student at inference
    (`call` returns the student's logits); its training loss is the KL
    divergence between the teacher's and the student's predictions on the
    *same* batch — after augmentation and Mixup/CutMix, as the data
    pipeline produced it. The teacher sees that batch resized (bilinear,
    `keras.ops.image.resize`) to its own input resolution, as in the Jumbo
    recipe: student at 128 px, teacher at 224 px (A.2.1). Any Keras model
    mapping images to logits can be the teacher; it is frozen
    (`teacher.trainable = False`) and called with `training=False`.

    With `label_loss_weight=w > 0` the loss becomes
    `(1 - w) * KL + w * CE(labels, student)`; the paper uses w=0 (pure
    function matching), so the labels only feed the metrics.

    Args:
        student: Keras model, images -> logits.
        teacher: Keras model, images -> logits with the same classes.
        teacher_image_size: int, (height, width) or None (None: read the
            teacher's input shape; when it is unknown, no resizing).
        temperature: float > 0.
        label_loss_weight: float in [0, 1].

    Example (`teacher` any Keras classifier, `ds` a dataset):
    ```python
    distiller = Distiller(JumboViT("nano", image_size=128), teacher)
    distiller.compile(optimizer="adamw", metrics=["categorical_accuracy"])
    distiller.fit(ds, epochs=400)
    distiller.student.save("student.keras")
    ```
    """

    def __init__(
        self,
        student,
        teacher,
        teacher_image_size=None,
        temperature=1.0,
        label_loss_weight=0.0,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("student", student), ("teacher", teacher)):
            if not isinstance(value, keras.Model):
                raise TypeError(
                    f"`{name}` must be a keras.Model. "
                    f"Received: {name}={value!r}"
                )
        self.student = student
        self.teacher = teacher
        self.teacher.trainable = False
        self.temperature = _check_temperature(temperature)
        if (
            isinstance(label_loss_weight, bool)
            or not isinstance(label_loss_weight, (int, float))
            or not 0.0 <= label_loss_weight <= 1.0
        ):
            raise ValueError(
                "`label_loss_weight` must be a float in [0, 1]. "
                f"Received: label_loss_weight={label_loss_weight!r}"
            )
        self.label_loss_weight = float(label_loss_weight)
        if teacher_image_size is None:
            shape = getattr(teacher, "input_shape", None)
            if isinstance(shape, tuple) and len(shape) == 4:
                if all(isinstance(d, int) for d in shape[1:3]):
                    teacher_image_size = tuple(shape[1:3])
        elif isinstance(teacher_image_size, int):
            teacher_image_size = (teacher_image_size, teacher_image_size)
        if teacher_image_size is not None:
            teacher_image_size = tuple(teacher_image_size)
            for size in teacher_image_size:
                check_positive_int("teacher_image_size", size)
            if len(teacher_image_size) != 2:
                raise ValueError(
                    "`teacher_image_size` must be an int or (height, width). "
                    f"Received: teacher_image_size={teacher_image_size!r}"
                )
        self.teacher_image_size = teacher_image_size
        self.kl = FunctionMatchingKL(temperature=self.temperature)

    def call(self, inputs, training=None):
        return self.student(inputs, training=training)

    def teacher_logits(self, images):
        """The frozen teacher's logits on `images` at its own resolution."""
        if self.teacher_image_size is not None and tuple(
            images.shape[1:3]
        ) != tuple(self.teacher_image_size):
            images = ops.image.resize(
                images, self.teacher_image_size, interpolation="bilinear"
            )
        return ops.stop_gradient(self.teacher(images, training=False))

    def compute_loss(
        self, x=None, y=None, y_pred=None, sample_weight=None, training=True
    ):
        if y_pred is None:
            y_pred = self(x, training=training)
        loss = self.kl(self.teacher_logits(x), y_pred, sample_weight)
        if self.label_loss_weight > 0.0 and y is not None:
            labels = keras.losses.categorical_crossentropy(
                ops.cast(y, "float32"),
                ops.cast(y_pred, "float32"),
                from_logits=True,
            )
            if sample_weight is not None:
                labels = labels * ops.cast(sample_weight, labels.dtype)
            loss = (
                1.0 - self.label_loss_weight
            ) * loss + self.label_loss_weight * ops.mean(labels)
        return loss

    def compute_output_shape(self, input_shape):
        return self.student.compute_output_shape(input_shape)

    def get_config(self):
        return student_teacher_config(
            self,
            super().get_config(),
            teacher_image_size=self.teacher_image_size,
            temperature=self.temperature,
            label_loss_weight=self.label_loss_weight,
        )

    @classmethod
    def from_config(cls, config):
        return cls(**student_teacher_arguments(config))


def student_teacher_config(model, base_config, **arguments):
    """A distiller's config: its base config, the serialised student and
    teacher, and its own `arguments`."""
    return {
        **base_config,
        "student": keras.saving.serialize_keras_object(model.student),
        "teacher": keras.saving.serialize_keras_object(model.teacher),
        **arguments,
    }


def student_teacher_arguments(config):
    """Constructor arguments from `student_teacher_config`'s output."""
    config = dict(config)
    for key in ("student", "teacher"):
        config[key] = keras.saving.deserialize_keras_object(config[key])
    return config
