"""The Inspector's frames written to files that have no cell type for a tensor (Parquet).

`to_dataframe()` keeps upstream's columns, `debug_data` holding torch tensors, which pyarrow cannot
convert. The frame is a `TensorFrame`: a DataFrame whose `to_parquet` first turns every tensor into
a struct {dtype, shape, data} (`data`: the tensor's bytes, C order, native little-endian), lossless
and readable without torch (`numpy.frombuffer(data, dtype).reshape(shape)` for numpy dtypes).
"""

from __future__ import annotations

import sys

import pandas as pd


def tensor_record(t) -> dict:
    """A tensor as {dtype, shape, data} (dtype without "torch.", data its raw bytes)."""
    torch = sys.modules["torch"]
    flat = t.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() and flat.dtype != torch.uint8 else flat
    return {"dtype": str(t.dtype).replace("torch.", ""), "shape": [int(s) for s in t.shape],
            "data": raw.numpy().tobytes()}


def _cell(v):
    torch = sys.modules.get("torch")  # no tensor exists unless torch was imported
    if torch is not None and isinstance(v, torch.Tensor):
        return tensor_record(v)
    if isinstance(v, (list, tuple)):
        return [_cell(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _cell(x) for k, x in v.items()}
    return v


def parquet_ready(df: pd.DataFrame) -> pd.DataFrame:
    """A plain DataFrame with each object column's tensors as {dtype, shape, data} records."""
    out = pd.DataFrame(df).copy(deep=False)  # new columns here leave df as it was
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = pd.Series([_cell(v) for v in out[col].tolist()], index=out.index, dtype=object)
    return out


class TensorFrame(pd.DataFrame):
    """A DataFrame whose tensor cells survive `to_parquet` (see the module docstring); anything
    else is pandas' own behavior."""

    @property
    def _constructor(self):
        return TensorFrame

    def to_parquet(self, path=None, *args, **kwargs):
        """Writes the frame to Parquet with tensor cells converted to a storable form (see the module docstring);
        other arguments as pandas'."""
        return pd.DataFrame.to_parquet(parquet_ready(pd.DataFrame(self)), path, *args, **kwargs)
