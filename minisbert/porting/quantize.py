"""Embeddings stored in fewer bits: `encode(..., precision=...)` and sentence-transformers'
`quantize_embeddings`, written out.

- int8 / uint8 (scalar quantisation): each dimension d is cut into 255 equal steps between its
  smallest and largest value over a calibration set, start_d = min_d, step_d = (max_d - min_d) / 255
  (a step of 0, a constant dimension, counts as 1); a value x becomes clip(floor((x - start_d) /
  step_d), 0, 255), minus 128 for int8. The calibration set is `calibration_embeddings` when given,
  else the embeddings themselves (so at least two of them, or none: no rows give no rows). As in
  sentence-transformers, start and step are float32 while float64 embeddings stay float64, so a
  value on a bucket's edge falls on the side it falls there.
- binary / ubinary: one bit per dimension, x > 0, packed eight to a byte (np.packbits, first
  dimension in the highest bit); ubinary keeps the bytes as uint8, binary subtracts 128 into int8.
- float32: the embeddings as they are.

Checked against sentence-transformers' encode(precision=...) on all-MiniLM-L6-v2 in
tests/porting/test_st_calls.py.
"""

import numpy as np
import torch

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")


def quantize_embeddings(embeddings, precision: str, calibration_embeddings=None) -> np.ndarray:
    """(n, D) float embeddings (numpy array or tensor) -> (n, D) int8/uint8, or (n, ceil(D / 8)) bytes
    for binary/ubinary, or float32 as they are."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    embeddings = as_float_array(embeddings, "embeddings")
    if precision == "float32":
        return embeddings.astype(np.float32, copy=False)
    if precision in ("binary", "ubinary"):
        packed = np.packbits(embeddings > 0, axis=-1)  # (n, ceil(D / 8)) uint8
        return packed if precision == "ubinary" else (packed - 128).astype(np.int8)
    if embeddings.ndim == 2 and embeddings.shape[0] == 0 and calibration_embeddings is None:
        return np.zeros(embeddings.shape, np.uint8 if precision == "uint8" else np.int8)
    if calibration_embeddings is None:
        if embeddings.ndim == 1 or embeddings.shape[0] < 2:
            raise ValueError(f"{precision} quantisation takes each dimension's range from the embeddings, and one "
                             "embedding has no range: encode at least two texts together, or pass "
                             "calibration_embeddings from a representative set")
        calibration_embeddings = embeddings
    calibration = as_float_array(calibration_embeddings, "calibration_embeddings")
    starts = calibration.min(axis=0).astype(np.float32)  # (D,)
    steps = (calibration.max(axis=0).astype(np.float32) - starts) / 255  # (D,), float32
    steps = np.where(steps == 0, 1, steps)
    buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)  # (n, D), 0..255
    return buckets.astype(np.uint8) if precision == "uint8" else (buckets - 128).astype(np.int8)


def as_float_array(embeddings, name: str) -> np.ndarray:
    """float64 stays float64; other floats (float16, a bfloat16 tensor) become float32."""
    if hasattr(embeddings, "detach"):  # a torch tensor, wherever it lives
        embeddings = embeddings.detach().cpu()
        embeddings = (embeddings if embeddings.dtype == torch.float64 else embeddings.float()).numpy()
    embeddings = np.asarray(embeddings)
    if not np.issubdtype(embeddings.dtype, np.floating):
        raise ValueError(f"{name} to quantise must be floats, got {embeddings.dtype}: quantise the float embeddings")
    return embeddings if embeddings.dtype == np.float64 else embeddings.astype(np.float32, copy=False)
