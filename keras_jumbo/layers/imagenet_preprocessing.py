import keras
from keras import ops

from keras_jumbo.layers._utils import check_choice
from keras_jumbo.layers._utils import check_positive_int
from keras_jumbo.layers._utils import standardize_data_format

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@keras.saving.register_keras_serializable(package="keras_jumbo")
class ImageNetPreprocessing(keras.layers.Layer):
    """The official Jumbo evaluation preprocessing, as a Keras layer.

    As the official `data_loading.py` (`ToTensor`, `ResizeSmall`,
    `CenterCrop`, `Normalize`): scale pixel values by `scale` (1/255 for
    0-255 images), resize so that the shorter side is `image_size` (new
    sides `int(side * image_size / short_side)`, bilinear, antialiased),
    crop the centre `image_size x image_size` (offsets
    `round((side - image_size) / 2)`), subtract the ImageNet mean and divide
    by the ImageNet standard deviation per channel.

    Args:
        image_size: int, the side of the output (224 for the presets).
        scale: float, multiplies the input first (1/255 for uint8 images;
            1.0 for images already in [0, 1]).
        mean, std: per-channel statistics (ImageNet's by default).
        interpolation: `"bilinear"` (official) or `"bicubic"`.
        data_format: layout of the output (`"channels_last"` or
            `"channels_first"`); None takes
            `keras.config.image_data_format()`. Inputs are always
            `(height, width, channels)` images, as image files decode.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(batch, height, width, channels)` or one image
            `(height, width, channels)`; static height and width.

    Returns:
        `(batch, image_size, image_size, channels)` (or channels first),
        float.

    Example:
    >>> preprocess = ImageNetPreprocessing(224)
    >>> preprocess(np.zeros((300, 400, 3), "uint8")).shape
    (1, 224, 224, 3)

    Reference: github.com/antofuller/jumbo, `data_loading.py`.
    """

    def __init__(
        self,
        image_size=224,
        scale=1.0 / 255.0,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        interpolation="bilinear",
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.image_size = check_positive_int("image_size", image_size)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise TypeError(f"`scale` must be a number. Received: {scale!r}")
        self.scale = float(scale)
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        if len(self.mean) != len(self.std):
            raise ValueError(
                "`mean` and `std` must have one value per channel. "
                f"Received: mean={self.mean}, std={self.std}"
            )
        if any(v <= 0 for v in self.std):
            raise ValueError(f"`std` must be > 0. Received: std={self.std}")
        self.interpolation = check_choice(
            "interpolation", interpolation, {"bilinear", "bicubic"}
        )
        self.data_format = standardize_data_format(data_format)

    def _geometry(self, height, width):
        ratio = self.image_size / min(height, width)
        new_h, new_w = int(height * ratio), int(width * ratio)
        top = int(round((new_h - self.image_size) / 2.0))
        left = int(round((new_w - self.image_size) / 2.0))
        return new_h, new_w, top, left

    def call(self, inputs):
        x = ops.convert_to_tensor(inputs)
        if len(x.shape) == 3:
            x = x[None]
        if len(x.shape) != 4 or x.shape[-1] != len(self.mean):
            raise ValueError(
                f"Layer '{self.name}' expects images (batch, height, width, "
                f"{len(self.mean)}). Received: shape={tuple(x.shape)}"
            )
        height, width = x.shape[1], x.shape[2]
        if height is None or width is None:
            raise ValueError(
                "ImageNetPreprocessing needs static image sizes. "
                f"Received: shape={tuple(x.shape)}"
            )
        x = ops.cast(x, "float32") * self.scale
        new_h, new_w, top, left = self._geometry(height, width)
        if (new_h, new_w) != (height, width):
            x = ops.image.resize(
                x,
                (new_h, new_w),
                interpolation=self.interpolation,
                antialias=True,
                data_format="channels_last",
            )
        size = self.image_size
        x = x[:, top : top + size, left : left + size]
        mean = ops.convert_to_tensor(self.mean, "float32")
        std = ops.convert_to_tensor(self.std, "float32")
        x = (x - mean) / std
        if self.data_format == "channels_first":
            x = ops.transpose(x, (0, 3, 1, 2))
        return ops.cast(x, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        batch = input_shape[0] if len(input_shape) == 4 else 1
        size, channels = self.image_size, input_shape[-1]
        if self.data_format == "channels_first":
            return (batch, channels, size, size)
        return (batch, size, size, channels)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "image_size": self.image_size,
                "scale": self.scale,
                "mean": self.mean,
                "std": self.std,
                "interpolation": self.interpolation,
                "data_format": self.data_format,
            }
        )
        return config
