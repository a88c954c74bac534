"""From request rows to the model's float32 batch, (N, C, H, W) or (N, F), with errors that name the row: numeric
rows (``row_shapes``) or base64 PNG/JPEG images preprocessed as the manifest says (refused without preprocessing)."""

from __future__ import annotations

import base64
import binascii
import io
import math

import numpy as np
from PIL import Image, UnidentifiedImageError

from calibkit.manifest import Preprocessing
from service.errors import InvalidInput

IMAGE_FORMATS = {"PNG", "JPEG"}
_RESAMPLE = {
    "bilinear": Image.Resampling.BILINEAR,
    "nearest": Image.Resampling.NEAREST,
    "bicubic": Image.Resampling.BICUBIC,
}


def to_batch(
    rows: list,
    shape: tuple[int, ...],
    pre: Preprocessing | None,
    *,
    max_rows: int,
    max_pixels: int,
    field: str = "inputs",
) -> np.ndarray:
    """Validate and convert request rows into one float32 batch."""
    if not rows:
        raise InvalidInput("must hold at least one row", field=field)
    if len(rows) > max_rows:
        raise InvalidInput(f"holds {len(rows)} rows; at most {max_rows} are allowed per request", field=field)
    if not any(isinstance(r, str) for r in rows):
        fast = _numeric_batch(rows, shape)
        if fast is not None:
            return fast
    return np.stack(
        [
            decode_image(r, pre, shape, max_pixels, f"{field}[{i}]")
            if isinstance(r, str)
            else numeric_row(r, shape, f"{field}[{i}]")
            for i, r in enumerate(rows)
        ]
    )


def _numeric_batch(rows: list, shape: tuple[int, ...]) -> np.ndarray | None:
    """The whole batch in one conversion when it is well-formed; None to fall back to per-row errors."""
    try:
        arr = np.asarray(rows)
    except (ValueError, TypeError):
        return None
    if arr.dtype.kind not in "iuf":
        return None
    return numeric_batch(arr, shape)


def numeric_batch(rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """Rows in one numeric array as the float32 batch; None for the per-row checks to name what is wrong."""
    arr = rows.astype(np.float32, copy=False)
    if arr.shape[1:] in row_shapes(shape) and np.isfinite(arr).all():
        return arr.reshape(len(arr), *shape)
    return None


def row_shapes(shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The shapes a numeric row may have: (F,) for a feature vector; (C, H, W), a flat C*H*W vector and, for one
    channel, (H, W) for an image."""
    if len(shape) == 1:
        return (shape,)
    return (shape, (math.prod(shape),)) + ((shape[1:],) if shape[0] == 1 else ())


def numeric_row(row, shape: tuple[int, ...], field: str) -> np.ndarray:
    """One numeric row as float32 of the model's row shape."""
    try:
        arr = np.asarray(row)
    except ValueError:
        raise InvalidInput("must be a rectangular nested array of numbers", field=field) from None
    if arr.dtype == bool or arr.dtype.kind not in "iuf":
        raise InvalidInput(f"must hold only numbers (got {arr.dtype.kind!r} values)", field=field)
    if arr.shape not in row_shapes(shape):
        accepted = (
            f"{list(shape)} (a feature vector of {shape[0]} numbers)"
            if len(shape) == 1
            else f"{list(shape)}"
            + (f" or {list(shape[1:])}" if shape[0] == 1 else "")
            + f" or a flat vector of {math.prod(shape)} values"
        )
        raise InvalidInput(f"has shape {list(arr.shape)}; expected {accepted}", field=field)
    arr = arr.astype(np.float32)
    if not np.isfinite(arr).all():
        raise InvalidInput(f"contains {int((~np.isfinite(arr)).sum())} NaN or infinite values", field=field)
    return arr.reshape(shape)


def decode_image(
    text: str, pre: Preprocessing | None, shape: tuple[int, ...], max_pixels: int, field: str
) -> np.ndarray:
    """A base64 PNG/JPEG (or data URL) decoded, resized, scaled (and inverted) as the manifest says."""
    if pre is None:
        raise InvalidInput(
            f"is a string, but this model takes numbers only: an array of shape {list(shape)} per row "
            "(its manifest has no image preprocessing)",
            field=field,
        )
    payload = text.split(",", 1)[1] if text.startswith("data:") and "," in text else text
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidInput(
            "is not valid base64 (a numeric row must be an array, an image a base64 string)", field=field
        ) from None
    try:
        with Image.open(io.BytesIO(raw)) as image:
            if image.format not in IMAGE_FORMATS:
                raise InvalidInput(f"is a {image.format} image; send PNG or JPEG", field=field)
            if image.width * image.height > max_pixels:
                raise InvalidInput(
                    f"is {image.width}x{image.height} pixels; at most {max_pixels} are allowed", field=field
                )
            converted = image.convert(pre.color_mode).resize((pre.image_size, pre.image_size), _RESAMPLE[pre.resample])
            pixels = np.asarray(converted, dtype=np.float32)
    except InvalidInput:
        raise
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise InvalidInput(f"could not be decoded as an image: {exc}", field=field) from None
    values = pixels * pre.scale
    if pre.invert:
        values = pre.value_range[1] - values
    return (values[None] if values.ndim == 2 else values.transpose(2, 0, 1)).astype(np.float32)
