"""Tensors on the wire (proto/tensor.proto) to and from NumPy arrays.

A wire tensor holds raw little-endian bytes, a dtype and a row-major shape.
`to_numpy` wraps those bytes with `np.frombuffer`: no copy, and the array is
read-only (it shares the message's bytes). bfloat16, which NumPy lacks, is
widened to float32 (exact), which is a copy.
"""

from typing import Optional, Sequence

import numpy as np

from ._proto import tensor_pb2

Tensor = tensor_pb2.Tensor

# Wire dtype -> little-endian NumPy dtype (bfloat16 handled apart).
_NUMPY_DTYPES = {
        Tensor.INT64: np.dtype("<i8"),
        Tensor.FLOAT32: np.dtype("<f4"),
        Tensor.FLOAT16: np.dtype("<f2"),
        Tensor.FLOAT64: np.dtype("<f8"),
}
_WIRE_DTYPES = {np.dtype(v).newbyteorder("="): k
               for k, v in _NUMPY_DTYPES.items()}

# The most elements a wire tensor may have, in all and in each dimension,
# and the most dimensions (proto/tensor_codec.h: kMaxTensorElements).
MAX_ELEMENTS = 1 << 40
MAX_DIMS = 8


def element_count(shape: Sequence[int]) -> int:
    """The elements of a tensor of `shape`, checked as the C++ CheckLayout
    (proto/tensor_codec.cc) checks a wire shape.

    Raises ValueError, with the numbers, for more than 8 dimensions, a
    negative size, or a size or product over 2^40 (each size too: with a 0
    among them the product stays 0).
    """
    if len(shape) > MAX_DIMS:
        raise ValueError(f"tensor of {len(shape)} dims: at most {MAX_DIMS}")
    count = 1
    for size in shape:
        size = int(size)
        if size < 0 or size > MAX_ELEMENTS or count * size > MAX_ELEMENTS:
            raise ValueError(f"bad tensor shape: dimension {size}")
        count *= size
    return count


def numpy_dtype(wire_dtype: int) -> np.dtype:
    """The NumPy dtype arrays of `wire_dtype` decode to (float32 for bfloat16).

    Raises ValueError for an unknown or unspecified dtype.
    """
    if wire_dtype == Tensor.BFLOAT16:
        return np.dtype(np.float32)
    try:
        return _NUMPY_DTYPES[wire_dtype]
    except KeyError:
        raise ValueError(f"unsupported tensor dtype {wire_dtype}") from None


def to_numpy(tensor: Tensor) -> np.ndarray:
    """The array a wire tensor holds, sharing its bytes (read-only).

    Raises ValueError for a shape element_count refuses, or when the byte
    count does not match dtype and shape.
    """
    shape = tuple(tensor.shape)
    count = element_count(shape)
    data = tensor.data
    if tensor.dtype == Tensor.BFLOAT16:
        if len(data) != 2 * count:
            raise ValueError(f"bfloat16 tensor of shape {list(shape)} needs "
                f"{2 * count} bytes, has {len(data)}")
        raw = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return raw.view(np.float32).reshape(shape)
    dtype = numpy_dtype(tensor.dtype)
    if len(data) != dtype.itemsize * count:
        raise ValueError(f"tensor of shape {list(shape)} and dtype {dtype} needs "
                f"{dtype.itemsize * count} bytes, has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def from_numpy(array, out: Optional[Tensor] = None) -> Tensor:
    """A wire tensor holding `array` (NumPy array, or anything np.asarray
    takes, such as a CPU torch.Tensor) as little-endian bytes.

    int32 and other integer arrays become INT64; float32/16/64 keep their
    dtype. Fills `out` when given. Raises ValueError for other dtypes.
    """
    array = np.asarray(array)
    if array.dtype.kind in "iu":
        array = array.astype("<i8", copy=False)
    wire = _WIRE_DTYPES.get(array.dtype.newbyteorder("="))
    if wire is None:
        raise ValueError(f"unsupported array dtype {array.dtype}")
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    out = out if out is not None else Tensor()
    out.dtype = wire
    del out.shape[:]
    out.shape.extend(int(s) for s in array.shape)
    out.data = np.ascontiguousarray(little).tobytes()
    return out


def ids_tensor(ids: Sequence[int]) -> Tensor:
    """An INT64 [n] wire tensor of `ids`."""
    return from_numpy(np.asarray(ids, dtype=np.int64).reshape(-1))
