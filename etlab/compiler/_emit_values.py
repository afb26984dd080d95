"""The values table of one execution plan: tensors from TensorSpecs, arguments from Python values."""

from __future__ import annotations

import torch
from torch.fx import Node

from etlab.compiler._errors import CompileError
from etlab.compiler._tensor_spec import TensorSpec
from etlab.schema import dtype_to_scalar_type
from etlab.schema import program as P

_LAYOUTS = {torch.strided: 0, torch.sparse_coo: 1}
_MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1, torch.channels_last: 2,
                   torch.channels_last_3d: 3}


class ValueTable:
    """Appends EValues; remembers the value of each TensorSpec and each non-tensor node result."""

    def __init__(self, constants, mutable_buffer_names: bool = False):
        self.values: list[P.EValue] = []
        self.constants = constants  # _ConstantStore: tensor -> data_buffer_idx / external name
        self.mutable_buffer_names = mutable_buffer_names  # name each mutable buffer (its module path)
        self._spec_index: dict[int, int] = {}
        self.node_index: dict[Node, int] = {}

    def add(self, val) -> int:
        """Appends one value to the method's value list and returns its index."""
        self.values.append(P.EValue(val))
        return len(self.values) - 1

    # -- tensors --------------------------------------------------------------------------------------------
    def spec(self, spec: TensorSpec, node: Node | None = None) -> int:
        """The value index of a TensorSpec, adding its Tensor value the first time: every node sharing the spec
        refers to one value."""
        idx = self._spec_index.get(id(spec))
        if idx is None:
            idx = self._spec_index[id(spec)] = self.add(self._tensor(spec, node))
        return idx

    def _tensor(self, spec: TensorSpec, node: Node | None) -> P.Tensor:
        tensor = P.Tensor(
            scalar_type=P.ScalarType(int(dtype_to_scalar_type(spec.dtype))),
            sizes=list(spec.shape), dim_order=list(spec.dim_order), requires_grad=spec.requires_grad,
            shape_dynamism=P.TensorShapeDynamism.DYNAMIC_BOUND if spec.dynamic else P.TensorShapeDynamism.STATIC,
        )
        root = spec.root()
        if root.const:
            value = self.constants.lookup(root)
            tensor.data_buffer_idx = value.buffer_index
            if value.external_name is not None:
                tensor.extra_tensor_info = P.ExtraTensorInfo(
                    fully_qualified_name=value.external_name, location=P.TensorDataLocation.EXTERNAL)
        elif root.mem_id is not None and root.mem_offset is not None:
            off = root.mem_offset
            tensor.allocation_info = P.AllocationDetails(memory_id=root.mem_id, memory_offset_low=off & 0xFFFFFFFF,
                                                         memory_offset_high=off >> 32)
            fqn = node.meta.get("mutable_buffer") if node is not None and node.op == "placeholder" else None
            if fqn and self.mutable_buffer_names:
                tensor.extra_tensor_info = P.ExtraTensorInfo(fully_qualified_name=str(fqn),
                                                             location=P.TensorDataLocation.SEGMENT)
        return tensor

    def empty_tensor(self) -> int:
        """A 0-element byte tensor: what a kernel gets for a `Tensor` argument given as None."""
        return self.add(P.Tensor(scalar_type=P.ScalarType.BYTE, sizes=[0], dim_order=[0]))

    # -- other arguments ------------------------------------------------------------------------------------
    def argument(self, value, schema_type, user: Node) -> int:
        """Emits `value` as the EValue(s) a kernel expects for an argument of `schema_type`."""
        if isinstance(value, Node):
            return self.of_node(value, user)
        if isinstance(schema_type, torch.OptionalType) and value is not None:
            schema_type = schema_type.getElementType()
        if value is None:
            if isinstance(schema_type, torch.TensorType):
                return self.empty_tensor()
            return self.add(P.Null())
        if isinstance(value, bool):
            return self.add(P.Bool(value))
        if isinstance(value, int):
            if _kind(schema_type) == "float":
                return self.add(P.Double(float(value)))
            return self.add(P.Int(value))
        if isinstance(value, float):
            return self.add(P.Double(value))
        if isinstance(value, str):
            return self.add(P.String(value))
        if isinstance(value, torch.dtype):
            return self.add(P.Int(int(dtype_to_scalar_type(value))))
        if isinstance(value, torch.layout):
            return self.add(P.Int(_LAYOUTS.get(value, 0)))
        if isinstance(value, torch.memory_format):
            return self.add(P.Int(_MEMORY_FORMATS[value]))
        if isinstance(value, torch.device):
            return self.add(P.Int(0))
        if isinstance(value, (list, tuple)):
            return self._list(list(value), schema_type, user)
        raise CompileError.at(user, f"cannot store argument {value!r} of type {type(value).__name__} in a .pte")

    def _list(self, items: list, schema_type, user: Node) -> int:
        elem_type = getattr(schema_type, "getElementType", lambda: None)()
        kind = _kind(elem_type) if elem_type is not None else None
        if kind == "tensor" or (kind is None and items and all(isinstance(i, Node) and _is_tensor(i) for i in items)):
            optional = isinstance(elem_type, torch.OptionalType)
            idx = [self.of_node(i, user) if i is not None else -1 for i in items]
            return self.add(P.OptionalTensorList(idx) if optional else P.TensorList(idx))
        if kind == "float" or (kind is None and any(isinstance(i, float) for i in items)):
            return self.add(P.DoubleList([float(i) for i in items]))
        if kind == "bool" or (kind is None and items and all(isinstance(i, bool) for i in items)):
            return self.add(P.BoolList([bool(i) for i in items]))
        refs = [self.of_node(i, user) if isinstance(i, Node) else self.add(P.Int(int(i))) for i in items]
        return self.add(P.IntList(refs))

    def of_node(self, node: Node, user: Node) -> int:
        """The value holding a node's result: its tensor spec, or the scalar it produced."""
        if node in self.node_index:
            return self.node_index[node]
        spec = node.meta.get("spec")
        if isinstance(spec, TensorSpec):
            return self.spec(spec, node)
        val = node.meta.get("val")
        if isinstance(val, (int, torch.SymInt)) or isinstance(val, (bool, torch.SymBool)):
            raise CompileError.at(user, f"uses symbolic value {node.name} before it is computed")
        raise CompileError.at(user, f"argument {node.name} has no value in the program (value {val!r})")


def _is_tensor(node: Node) -> bool:
    return isinstance(node.meta.get("spec"), TensorSpec)


def _kind(schema_type) -> str | None:
    if schema_type is None:
        return None
    if isinstance(schema_type, torch.OptionalType):
        return _kind(schema_type.getElementType())
    if isinstance(schema_type, torch.TensorType):
        return "tensor"
    if isinstance(schema_type, torch.FloatType):
        return "float"
    if isinstance(schema_type, torch.BoolType):
        return "bool"
    if isinstance(schema_type, (torch.IntType, torch.SymIntType)):
        return "int"
    return None
