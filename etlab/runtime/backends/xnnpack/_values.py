"""The values of an XNNPACK graph: shapes, datatypes, quantization and constant data, all checked.

Every value becomes a `ValueSpec`. Quantized values are carried at run time as float32 tensors
holding exactly the dequantized levels (`q - zero_point) * scale`), so every kernel computes in
float and only the values' own quantization is emulated; constants are dequantized once here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from etlab.errors import FormatError
from etlab.schema.xnnpack import (
    FLAG_EXTERNAL_INPUT,
    FLAG_EXTERNAL_OUTPUT,
    INVALID_VALUE_ID,
    MODELS,
    UINT64_MAX,
    XNNDatatype,
)

MAX_RANK = 6                 # XNN_MAX_TENSOR_DIMS
MAX_ELEMENTS = 1 << 28       # per value; far above any model XNNPACK runs on a phone, far below a crash
D = XNNDatatype

# datatype -> (storage dtype of constant bytes, quantization kind: None | "tensor" | "channel" | "dynamic")
DATATYPES: dict[XNNDatatype, tuple[torch.dtype | None, str | None]] = {
    D.xnn_datatype_fp32: (torch.float32, None),
    D.xnn_datatype_fp16: (torch.float16, None),
    D.xnn_datatype_bf16: (torch.bfloat16, None),
    D.xnn_datatype_int32: (torch.int32, None),
    D.xnn_datatype_qint8: (torch.int8, "tensor"),
    D.xnn_datatype_quint8: (torch.uint8, "tensor"),
    D.xnn_datatype_qint32: (torch.int32, "tensor"),
    D.xnn_datatype_qcint8: (torch.int8, "channel"),
    D.xnn_datatype_qcint32: (torch.int32, "channel"),
    D.xnn_datatype_qdint8: (None, "dynamic"),
}
QUANT_RANGE = {torch.int8: (-128, 127), torch.uint8: (0, 255), torch.int32: (-(1 << 31), (1 << 31) - 1)}


@dataclass(frozen=True)
class Quant:
    """How a value is quantized: per tensor (scale, zero_point), per channel (scales along axis) or dynamic."""

    kind: str                          # "tensor" | "channel" | "dynamic"
    qmin: int = -128
    qmax: int = 127
    scale: float = 1.0
    zero_point: int = 0
    scales: torch.Tensor | None = None  # per channel
    axis: int = 0                      # per channel: the channel dim; dynamic: trailing dims per row


@dataclass
class ValueSpec:
    """One value of an XNNPACK graph: id, datatype, shape, quantization and constant data (dequantized to float32)."""

    id: int
    datatype: XNNDatatype
    shape: tuple[int, ...]
    quant: Quant | None
    constant: torch.Tensor | None      # float32 (dequantized) constant data, else None
    external_id: int | None            # position among the delegate call's arguments
    is_input: bool
    is_output: bool


def _bad(what: str, message: str) -> FormatError:
    return FormatError(f"{what}: {message}")


class ConstantSource:
    """Resolves a constant index to its bytes: the blob's constant region, inline buffers, or named data."""

    def __init__(self, graph, constant_region: memoryview, named_data: Mapping[str, object], what: str):
        self.offsets = list(graph.constant_data or [])
        self.buffers = list(graph.constant_buffer or [])
        self.region = constant_region
        self.named = named_data
        self.what = what

    def bytes_of(self, index: int, nbytes: int, ctx: str) -> memoryview:
        """The bytes of constant `index`; a FormatError naming the node when the index or range is outside the
        payload."""
        if self.offsets:
            if index >= len(self.offsets):
                raise _bad(self.what, f"{ctx} uses constant {index}, but the graph lists {len(self.offsets)}")
            entry = self.offsets[index]
            size = entry.size or 0
            if size < nbytes:
                raise _bad(self.what, f"{ctx} needs {nbytes} bytes but constant {index} holds {size}")
            key = entry.named_key or ""
            if key:
                if entry.offset not in (None, UINT64_MAX):
                    raise _bad(self.what, f"constant {index} has both a named key and an offset ({entry.offset})")
                if key not in self.named:
                    raise _bad(self.what, f"{ctx}: constant {index} names data {key[:24]!r}, which the program "
                                          f"does not hold ({len(self.named)} named entries)")
                data = memoryview(self.named[key]).cast("B")
                if len(data) < nbytes:
                    raise _bad(self.what, f"{ctx}: named data {key[:24]!r} has {len(data)} bytes, needs {nbytes}")
                return data[:nbytes]
            start = entry.offset or 0
            if start + nbytes > len(self.region):
                raise _bad(self.what, f"{ctx}: constant {index} at [{start}, {start + nbytes}) lies outside the "
                                      f"{len(self.region)}-byte constant data")
            return self.region[start:start + nbytes]
        if index >= len(self.buffers):
            raise _bad(self.what, f"{ctx} uses constant buffer {index}, but the graph has {len(self.buffers)}")
        storage = memoryview(self.buffers[index].storage or b"").cast("B")
        if len(storage) < nbytes:
            raise _bad(self.what, f"{ctx} needs {nbytes} bytes but constant buffer {index} holds {len(storage)}")
        return storage[:nbytes]


def _tensor_from(data: memoryview, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A private copy (the file's bytes stay read-only and unaliased) of `data` as a tensor."""
    if not data.nbytes:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def _quant(value, tensor_value, storage: torch.dtype | None, qkind: str, shape, constants: ConstantSource,
           ctx: str) -> Quant:
    """Checks a quantized value's parameters against its datatype and shape."""
    params = value.quant_params
    what = constants.what
    qmin, qmax = QUANT_RANGE.get(storage, (-128, 127))
    if qkind == "dynamic":
        if type(params).__name__ != "PerTokenDynamicQuant":
            raise _bad(what, f"{ctx} is dynamically quantized but has {type(params).__name__} parameters")
        nonbatch = int(params.num_nonbatch_dims or 0)
        if not 1 <= nonbatch <= max(len(shape), 1):
            raise _bad(what, f"{ctx} quantizes rows of {nonbatch} trailing dims of a rank-{len(shape)} value")
        return Quant("dynamic", axis=nonbatch)
    if qkind == "tensor":
        if type(params).__name__ != "PerTensorQuant":
            raise _bad(what, f"{ctx} is per-tensor quantized but has {type(params).__name__} parameters")
        scale, zp = float(params.scale or 0.0), int(params.zero_point or 0)
        if not (math.isfinite(scale) and scale > 0):
            raise _bad(what, f"{ctx} has quantization scale {scale}; it must be finite and positive")
        if not qmin <= zp <= qmax:
            raise _bad(what, f"{ctx} has zero point {zp}, outside [{qmin}, {qmax}]")
        return Quant("tensor", qmin, qmax, scale, zp)
    if type(params).__name__ != "PerChannelQuant":
        raise _bad(what, f"{ctx} is per-channel quantized but has {type(params).__name__} parameters")
    axis = int(params.channel_dim or 0)
    if not 0 <= axis < len(shape):
        raise _bad(what, f"{ctx} quantizes along dim {axis} of a rank-{len(shape)} value")
    count = shape[axis]
    if params.scale:
        scales = torch.tensor(list(params.scale), dtype=torch.float32)
    else:
        if (params.num_scales or 0) != count:
            raise _bad(what, f"{ctx} has {params.num_scales} scales for {count} channels")
        raw = constants.bytes_of(int(params.scale_buffer_idx or 0), 4 * count, f"{ctx} scales")
        scales = _tensor_from(raw, torch.float32, (count,))
    if scales.numel() != count or not bool(torch.isfinite(scales).all() and (scales > 0).all()):
        raise _bad(what, f"{ctx} needs {count} finite positive scales along dim {axis}")
    return Quant("channel", qmin, qmax, scales=scales, axis=axis)


def dequantize_constant(raw: torch.Tensor, quant: Quant | None) -> torch.Tensor:
    """Constant bytes as the float values XNNPACK computes with."""
    if quant is None:
        return raw.to(torch.float32)
    if quant.kind == "tensor":
        return (raw.to(torch.float64) - quant.zero_point).mul(quant.scale).to(torch.float32)
    view = [1] * raw.dim()
    view[quant.axis] = -1
    return (raw.to(torch.float64) * quant.scales.to(torch.float64).reshape(view)).to(torch.float32)


def decode_values(graph, constants: ConstantSource) -> dict[int, ValueSpec]:
    """Every value of the graph, checked: ids unique, shapes bounded, constants in range and of the right size."""
    what = constants.what
    specs: dict[int, ValueSpec] = {}
    for index, xvalue in enumerate(graph.xvalues or []):
        value = xvalue.xvalue_union
        ctx = f"value {index}"
        if value is None:
            raise _bad(what, f"{ctx} is empty (no tensor in its union)")
        quantized = isinstance(value, MODELS["XNNQuantizedTensorValue"])
        tensor_value = value.tensor_value if quantized else value
        if tensor_value is None:
            raise _bad(what, f"{ctx} is a quantized value without its tensor")
        vid = int(tensor_value.id_out or 0)
        ctx = f"value {vid}"
        if vid in specs or vid == INVALID_VALUE_ID:
            raise _bad(what, f"{ctx} is defined twice (or has the invalid id)")
        datatype = tensor_value.datatype if tensor_value.datatype is not None else D.xnn_datatype_invalid
        dq_datatype = tensor_value.dq_datatype
        if dq_datatype not in (None, D.xnn_datatype_invalid):
            raise _bad(what, f"{ctx} asks for run-time quantization to {dq_datatype.name}, which this backend "
                             f"does not emulate")
        if datatype not in DATATYPES:
            raise _bad(what, f"{ctx} has datatype {datatype.name}, which this backend does not support")
        storage, qkind = DATATYPES[datatype]
        if quantized != (qkind is not None):
            raise _bad(what, f"{ctx} has datatype {datatype.name} but {'' if quantized else 'no '}quantization "
                             f"parameters")
        dims = list(tensor_value.dims or [])
        if (tensor_value.num_dims or 0) != len(dims) or len(dims) > MAX_RANK:
            raise _bad(what, f"{ctx} has num_dims {tensor_value.num_dims} and {len(dims)} dims (at most {MAX_RANK})")
        shape = tuple(int(d) for d in dims)
        if math.prod(shape) > MAX_ELEMENTS:
            raise _bad(what, f"{ctx} has shape {list(shape)}: more than {MAX_ELEMENTS} elements")
        quant = _quant(value, tensor_value, storage, qkind, shape, constants, ctx) if quantized else None
        flags = int(tensor_value.flags or 0)
        if flags & ~(FLAG_EXTERNAL_INPUT | FLAG_EXTERNAL_OUTPUT):
            raise _bad(what, f"{ctx} has unknown value flags {flags:#x}")
        ext = int(tensor_value.external_id if tensor_value.external_id is not None else INVALID_VALUE_ID)
        constant = None
        buffer_index = int(tensor_value.constant_buffer_idx or 0)
        if buffer_index:
            if flags or storage is None:
                raise _bad(what, f"{ctx} is a constant but is also marked external or dynamically quantized")
            nbytes = math.prod(shape) * storage.itemsize
            raw = _tensor_from(constants.bytes_of(buffer_index, nbytes, ctx), storage, shape)
            constant = dequantize_constant(raw, quant)
        specs[vid] = ValueSpec(vid, datatype, shape, quant, constant, None if ext == INVALID_VALUE_ID else ext,
                               bool(flags & FLAG_EXTERNAL_INPUT), bool(flags & FLAG_EXTERNAL_OUTPUT))
    return specs


def external_order(graph, specs: dict[int, ValueSpec], what: str) -> tuple[list[int], list[int]]:
    """(input value ids, output value ids) in the order of the delegate call's arguments."""
    def listed(ids, flag_name: str, role: str) -> list[int]:
        out = []
        for vid in ids or []:
            spec = specs.get(vid)
            if spec is None:
                raise _bad(what, f"graph {role} {vid} is not a value of the graph")
            if spec.external_id is None or not getattr(spec, flag_name) or spec.constant is not None:
                raise _bad(what, f"graph {role} {vid} is not marked as an external {role} with an external id")
            out.append(vid)
        return out

    inputs = listed(graph.input_ids, "is_input", "input")
    outputs = listed(graph.output_ids, "is_output", "output")
    ordered = sorted(inputs + outputs, key=lambda v: specs[v].external_id)
    ext_ids = [specs[v].external_id for v in ordered]
    if len(set(inputs + outputs)) != len(ordered) or ext_ids != list(range(len(ordered))):
        raise _bad(what, f"external ids of the graph inputs and outputs are {ext_ids}; they must be "
                         f"0..{len(ordered) - 1}, once each")
    if (graph.num_externs or 0) < len(ordered):
        raise _bad(what, f"num_externs is {graph.num_externs}, but {len(ordered)} values are external")
    return sorted(inputs, key=lambda v: specs[v].external_id), sorted(outputs, key=lambda v: specs[v].external_id)
