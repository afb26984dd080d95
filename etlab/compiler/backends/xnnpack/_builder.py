"""Assembling an XNNGraph (upstream's public schema, `etlab.schema.xnnpack`): values, constants, nodes.

Value ids are positions in `xvalues`, as upstream's serializer numbers them. Constant data (weights,
and the scales of per-channel quantized values) goes where upstream 1.5.1 puts it: in the program's
named data, keyed by the SHA-256 of its bytes (`scale_<sha256>` for scales), so equal weights are
stored once across partitions and methods; `constant_data` entries name their key (offset
UINT64_MAX), and a constant whose source weights carry an external tag goes to that .ptd. Entry 0
of `constant_data` is the empty sentinel, since `constant_buffer_idx == 0` means "not a constant".
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

import torch

from etlab.compiler._named_data import NamedDataStore
from etlab.schema.xnnpack import (
    FLAG_EXTERNAL_INPUT,
    FLAG_EXTERNAL_OUTPUT,
    INVALID_VALUE_ID,
    MODELS,
    NODE_KINDS,
    UINT64_MAX,
    XNNDatatype,
    serialize_xnnpack,
)

_BINARY = {"XNNAdd", "XNNSubtract", "XNNMultiply", "XNNDiv", "XNNMinimum", "XNNMaximum"}
_PER_TENSOR_INT8 = {XNNDatatype.xnn_datatype_qint8, XNNDatatype.xnn_datatype_quint8}
FLOAT16 = XNNDatatype.xnn_datatype_fp16
NO_DEBUG_HANDLE = 65535  # what upstream writes for nodes lowering added (layout transposes)
CONSTANT_ALIGNMENT = 16
FLOAT32 = XNNDatatype.xnn_datatype_fp32
_FLOATS = {FLOAT32, XNNDatatype.xnn_datatype_fp16}

# Tables shared by several node kinds (`XNNAdd: _XNNNode2x1`), in the order they are tried: a
# node's attributes pick the first whose fields hold them all.
_SHARED_TABLES = ("_XNNNode1x1", "_XNNNode2x1", "_XNNCat", "_XNNNodeConv", "_XNNPooling2D")


def _c_order_bytes(data: torch.Tensor) -> bytes:
    """The tensor's elements in row-major order as bytes, copied once: numpy gathers a strided view (a
    permuted weight: OHWI filters) straight into the bytes object, where `.contiguous()` first would copy
    a large weight twice."""
    return data.detach().numpy().tobytes()


def _table_of(kind: str, attrs: dict) -> str:
    if kind in MODELS:
        return kind
    for table in _SHARED_TABLES:
        names = {f.name for f in dataclasses.fields(MODELS[table])}
        if names >= attrs.keys():
            return table
    raise KeyError(f"no XNNPACK node table takes the attributes {sorted(attrs)} of {kind}")


@dataclass(frozen=True)
class QuantSpec:
    """How a value is quantized in the XNNGraph: per tensor, per channel (scales along `axis`) or
    dynamically per row (`nonbatch_dims` trailing dims form a row)."""

    datatype: XNNDatatype
    scale: float = 1.0
    zero_point: int = 0
    scales: tuple[float, ...] = ()
    axis: int = 0
    nonbatch_dims: int = 0


@dataclass
class GraphBuilder:
    """The XNNGraph being built, plus its constant data region."""

    xvalues: list = field(default_factory=list)
    xnodes: list = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[tuple[int, int]] = field(default_factory=list)  # (external id, value id)
    constant_offsets: list = field(default_factory=lambda: [MODELS["ConstantDataOffset"](offset=0, size=0)])
    named: NamedDataStore = field(default_factory=NamedDataStore)
    num_externs: int = 0
    datatypes: list = field(default_factory=list)  # value id -> datatype
    _constant_index: dict[str, int] = field(default_factory=dict)  # named key -> constant_data index
    float_datatype: XNNDatatype = FLOAT32  # the float type of values defined without one (the node being lowered's)

    def value(self, shape, *, datatype: XNNDatatype | None = None, external_id: int | None = None,
              flags: int = 0, data: torch.Tensor | None = None, quant: QuantSpec | None = None,
              external_tag: str | None = None) -> int:
        """Defines a tensor value; returns its id. `data` (already in the value's layout and
        storage dtype) makes it a constant, stored in the .ptd named `external_tag` if given."""
        if not all(isinstance(d, int) for d in shape):  # int() of a SymInt would specialize the export
            raise TypeError(f"XNNPACK value dims must be ints (upper bounds), got {list(shape)}")
        dims = [int(d) for d in shape] or [1]  # XNNPACK has no rank-0 tensors
        datatype = datatype if datatype is not None else quant.datatype if quant is not None else self.float_datatype
        vid = len(self.xvalues)
        self.datatypes.append(datatype)
        buffer_index = self._constant(_c_order_bytes(data), "", external_tag) \
            if data is not None else 0
        tensor = MODELS["XNNTensorValue"](
            datatype=datatype, num_dims=len(dims), dims=dims, constant_buffer_idx=buffer_index,
            external_id=INVALID_VALUE_ID if external_id is None else external_id, flags=flags, id_out=vid)
        if quant is None:
            self.xvalues.append(MODELS["XValue"](xvalue_union=tensor))
        else:
            self.xvalues.append(MODELS["XValue"](xvalue_union=MODELS["XNNQuantizedTensorValue"](
                tensor_value=tensor, quant_params=self._quant_params(quant, external_tag))))
        if flags & FLAG_EXTERNAL_INPUT:
            self.input_ids.append(vid)
        if flags & FLAG_EXTERNAL_OUTPUT:
            self.output_ids.append((external_id, vid))
        return vid

    def _constant(self, raw: bytes, prefix: str, external_tag: str | None) -> int:
        """The constant_data index of `raw`, added to the named data under `<prefix><sha256>` once."""
        key = prefix + hashlib.sha256(raw).hexdigest()
        index = self._constant_index.get(key)
        if index is None:
            self.named.add_named_data(key, raw, CONSTANT_ALIGNMENT, external_tag)
            self.constant_offsets.append(MODELS["ConstantDataOffset"](offset=UINT64_MAX, size=len(raw),
                                                                       named_key=key))
            index = self._constant_index[key] = len(self.constant_offsets) - 1
        return index

    def _quant_params(self, quant: QuantSpec, external_tag: str | None):
        if quant.datatype == XNNDatatype.xnn_datatype_qdint8:
            return MODELS["PerTokenDynamicQuant"](num_nonbatch_dims=quant.nonbatch_dims)
        if quant.scales:
            raw = torch.tensor(quant.scales, dtype=torch.float32).numpy().tobytes()
            return MODELS["PerChannelQuant"](scale=[], channel_dim=quant.axis, num_scales=len(quant.scales),
                                             scale_buffer_idx=self._constant(raw, "scale_", external_tag))
        return MODELS["PerTensorQuant"](scale=float(quant.scale), zero_point=int(quant.zero_point))

    def node(self, kind: str, debug_handle: int | None, clamp: tuple[float, float] | None = None, **attrs) -> None:
        """Appends a node of `kind` (`XNNConv2d`, ...); attrs are its table's fields (flags default 0)."""
        attrs.setdefault("flags", 0)
        self._check_types(kind, attrs)
        table = _table_of(kind, attrs)
        union = MODELS[table](**attrs)
        minmax = None if clamp is None else MODELS["OutputMinMax"](output_min=float(clamp[0]),
                                                                  output_max=float(clamp[1]))
        self.xnodes.append(MODELS["XNode"](
            xnode_union=union, xnode_union_type=NODE_KINDS.index(kind) + 1,
            debug_handle=NO_DEBUG_HANDLE if debug_handle is None else int(debug_handle), output_min_max=minmax))

    def _check_types(self, kind: str, attrs: dict) -> None:
        """XNNPACK refuses, when the delegate is built on the device, nodes whose operands mix float
        and int8; catch that here, while the compiler can still say which node it is."""
        def types(*names):
            return [self.datatypes[attrs[n]] for n in names]

        if kind in _BINARY:
            found = types("input1_id", "input2_id", "output_id")
            if len({t in _PER_TENSOR_INT8 for t in found}) != 1 or (found[0] in _FLOATS) != (found[2] in _FLOATS) \
                    or len({t for t in found if t in _FLOATS}) > 1:
                raise ValueError(f"{kind} would mix datatypes {[t.name for t in found]}")
        elif kind in ("XNNConv2d", "XNNDepthwiseConv2d", "XNNConvTranspose2d", "XNNFullyConnected"):
            x, w, y = types("input1_id", "filter_id", "output_id")
            dynamic = x == XNNDatatype.xnn_datatype_qdint8
            if (x in _FLOATS) != (w in _FLOATS) or (not dynamic and (x in _FLOATS) != (y in _FLOATS)):
                raise ValueError(f"{kind} would mix datatypes (input {x.name}, filter {w.name}, output {y.name})")

    def serialize(self) -> bytes:
        """The XNNPACK payload bytes: the graph (values, nodes, inputs, outputs in order) with its constant data
        region."""
        graph = MODELS["XNNGraph"](
            version="0", xnodes=self.xnodes, xvalues=self.xvalues, num_externs=self.num_externs,
            input_ids=list(self.input_ids), output_ids=[vid for _, vid in sorted(self.output_ids)],
            constant_data=self.constant_offsets)
        return serialize_xnnpack(graph)
