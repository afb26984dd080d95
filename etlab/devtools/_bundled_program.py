"""Bundled programs ahead of time: a .pte plus test cases per method, checked against the
program's method signatures and written as a .bpte.

Checks mirror upstream's (method names exist, arity, value kinds, dtypes) and add shapes:
a static input or output must have exactly the planned shape, a bounded dynamic one at most
its upper bound per dimension.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from etlab.compiler import ExecutorchProgramManager, dim_order_of, tensor_bytes
from etlab.devtools._bundled_config import ConfigValue, MethodTestCase, MethodTestSuite
from etlab.errors import FormatError
from etlab.schema import bundled_program as B
from etlab.schema import (
    deserialize_bundled_program,
    deserialize_pte,
    dtype_to_scalar_type,
    scalar_type_to_dtype,
    serialize_bundled_program,
)
from etlab.schema import program as P

_PRIM_OF_VALUE = {P.Int: int, P.Double: float, P.Bool: bool}  # program value kind -> python type


class BundledProgram:
    """A program and the test suites to verify its methods with (see `serialize_from_bundled_program_to_flatbuffer`).

    executorch_program: an ExecutorchProgramManager (the result of `to_executorch()`); or give
    pte_file instead (a path to a .pte, or its bytes). pte_file_path is upstream's name for it.
    Every suite is checked against the program; a mismatch raises ValueError naming the suite,
    test case and value.
    """

    def __init__(self, executorch_program=None, method_test_suites: Sequence[MethodTestSuite] = (),
                 pte_file: str | os.PathLike | bytes | None = None, *,
                 pte_file_path: str | os.PathLike | None = None):
        if pte_file is not None and pte_file_path is not None:
            raise ValueError("give pte_file or pte_file_path (the same thing), not both")
        pte_file = pte_file if pte_file is not None else pte_file_path
        if (executorch_program is None) == (pte_file is None):
            raise ValueError("BundledProgram needs exactly one of executorch_program and pte_file")
        if executorch_program is not None:
            if not isinstance(executorch_program, ExecutorchProgramManager):
                raise TypeError("executorch_program must be an ExecutorchProgramManager (the result of "
                                f"to_executorch()), got {type(executorch_program).__name__}")
            program = executorch_program.executorch_program
        else:
            self._pte_bytes = _read_pte(pte_file)
            program = deserialize_pte(self._pte_bytes, what="pte_file").program
        if isinstance(method_test_suites, MethodTestSuite) or not isinstance(method_test_suites, Sequence):
            raise ValueError(f"method_test_suites must be a list of MethodTestSuite, "
                             f"got {type(method_test_suites).__name__}")
        for i, suite in enumerate(method_test_suites):
            if not isinstance(suite, MethodTestSuite):
                raise ValueError(f"method_test_suites[{i}] is {_a(type(suite).__name__)}, not a MethodTestSuite")
        # Sorted by method name, as upstream stores them.
        self.method_test_suites: list[MethodTestSuite] = sorted(method_test_suites, key=lambda s: s.method_name)
        self.executorch_program = executorch_program
        self._pte_file = pte_file
        check_bundle(program, self.method_test_suites)

    @property
    def program_bytes(self) -> bytes:
        """The .pte this bundle carries."""
        if self.executorch_program is not None:
            return bytes(self.executorch_program.buffer)
        return self._pte_bytes

    def serialize_to_schema(self) -> B.BundledProgram:
        """The bundle as the .bpte schema model (tensors dense, laid out in their own dim order)."""
        suites = []
        for suite in self.method_test_suites:
            cases = [
                B.BundledMethodTestCase(
                    inputs=[bundled_value(v) for v in case.inputs],
                    expected_outputs=[bundled_value(v) for v in case.expected_outputs],
                )
                for case in suite.test_cases
            ]
            suites.append(B.BundledMethodTestSuite(method_name=suite.method_name, test_cases=cases))
        return B.BundledProgram(version=B.BUNDLED_PROGRAM_VERSION, method_test_suites=suites,
                                program=self.program_bytes)

    def __repr__(self) -> str:
        cases = sum(len(s.test_cases) for s in self.method_test_suites)
        return f"BundledProgram({len(self.method_test_suites)} suites, {cases} test cases)"


def _read_pte(pte_file) -> bytes:
    if isinstance(pte_file, (bytes, bytearray, memoryview)):
        return bytes(pte_file)
    if isinstance(pte_file, (str, os.PathLike)):
        try:
            with open(pte_file, "rb") as f:
                return f.read()
        except OSError as e:
            raise ValueError(f"pte_file {os.fspath(pte_file)!r} cannot be read: {e.strerror}") from None
    raise TypeError(f"pte_file must be a path or bytes, got {type(pte_file).__name__}")


# --- checks --------------------------------------------------------------------------------------


def _kind(val) -> str:
    return type(val).__name__ if val is not None else "None"


def _a(type_name: str) -> str:
    return ("an " if type_name[:1].lower() in "aeiou" else "a ") + type_name


def _shape_error(value: torch.Tensor, spec: P.Tensor) -> str | None:
    want = list(spec.sizes or [])
    got = list(value.shape)
    dyn = spec.shape_dynamism
    if dyn == P.TensorShapeDynamism.STATIC and got != want:
        return f"shape {got}, but the method's is {want}"
    if len(got) != len(want):
        return f"{len(got)} dimensions (shape {got}), but the method's has {len(want)} (shape {want})"
    if dyn == P.TensorShapeDynamism.DYNAMIC_BOUND and any(g > w for g, w in zip(got, want)):
        return f"shape {got}, beyond the method's upper bound {want}"
    return None


def _check_tensor(value: torch.Tensor, spec: P.Tensor, where: str, role: str) -> None:
    want = scalar_type_to_dtype(spec.scalar_type)
    if value.dtype != want:
        raise ValueError(f"{where}: dtype {value.dtype}, but the method's {role} is {want}")
    err = _shape_error(value, spec)
    if err:
        raise ValueError(f"{where}: {err}")


def _check_case(case: MethodTestCase, plan: P.ExecutionPlan, where: str) -> None:
    values = plan.values or []
    ins, outs = list(plan.inputs or []), list(plan.outputs or [])
    if len(case.inputs) != len(ins):
        raise ValueError(f"{where}: {len(case.inputs)} inputs given, but method {plan.name!r} takes {len(ins)}")
    for j, (given, idx) in enumerate(zip(case.inputs, ins)):
        spec = values[idx].val
        at = f"{where}, input {j}"
        if isinstance(spec, P.Tensor):
            if not isinstance(given, torch.Tensor):
                raise ValueError(f"{at}: {_a(type(given).__name__)}, but the method's input {j} is a Tensor")
            _check_tensor(given, spec, at, f"input {j}")
        else:
            want = _PRIM_OF_VALUE[type(spec)]
            if type(given) is not want:  # bool is an int to isinstance; the kinds must match exactly
                raise ValueError(f"{at}: {_a(type(given).__name__)}, but the method's input {j} is {_a(want.__name__)}")
    if case.expected_outputs and len(case.expected_outputs) != len(outs):
        raise ValueError(f"{where}: {len(case.expected_outputs)} expected outputs given, but method {plan.name!r} "
                         f"returns {len(outs)}")
    for j, (given, idx) in enumerate(zip(case.expected_outputs, outs)):
        spec = values[idx].val
        at = f"{where}, expected output {j}"
        if not isinstance(given, torch.Tensor):
            raise ValueError(f"{at}: {_a(type(given).__name__)}; expected outputs must be tensors")
        if not isinstance(spec, P.Tensor):
            raise ValueError(f"{at}: the method's output {j} is {_a(_kind(spec))}; only Tensor outputs can be verified")
        _check_tensor(given, spec, at, f"output {j}")


def check_bundle(program: P.Program, method_test_suites: Sequence[MethodTestSuite]) -> None:
    """Raises ValueError at the first test suite / case / value the program cannot run or verify."""
    plans = {p.name: p for p in program.execution_plan or []}
    seen: set[str] = set()
    for suite in method_test_suites:
        name = suite.method_name
        if name in seen:
            raise ValueError(f"method_test_suites: two suites for method {name!r}; merge their test cases")
        seen.add(name)
        plan = plans.get(name)
        if plan is None:
            raise ValueError(f"MethodTestSuite {name!r}: the program has no method {name!r}; "
                             f"its methods are {sorted(plans)}")
        for j, idx in enumerate(plan.inputs or []):
            spec = (plan.values or [])[idx].val
            if not isinstance(spec, P.Tensor) and type(spec) not in _PRIM_OF_VALUE:
                raise ValueError(f"MethodTestSuite {name!r}: the method's input {j} is {_a(_kind(spec))}; bundled "
                                 "programs support Tensor, Int, Double and Bool inputs only")
        for i, case in enumerate(suite.test_cases):
            _check_case(case, plan, f"MethodTestSuite {name!r}, test case {i}")


# --- values <-> schema -----------------------------------------------------------------------------


def bundled_value(value: ConfigValue) -> B.Value:
    """A test-case value as the schema's Value (a tensor dense in its own dim order)."""
    if isinstance(value, torch.Tensor):
        order = dim_order_of(value)
        return B.Value(B.Tensor(scalar_type=dtype_to_scalar_type(value.dtype), sizes=list(value.shape),
                                data=bytes(tensor_bytes(value, order)), dim_order=list(order)))
    if type(value) is bool:
        return B.Value(B.Bool(value))
    if type(value) is int:
        return B.Value(B.Int(value))
    if type(value) is float:
        return B.Value(B.Double(value))
    raise ValueError(f"cannot bundle a {type(value).__name__}")


# Quantized and bit dtypes: torch.frombuffer crashes the process on them.
_NOT_PLAIN = {getattr(torch, n) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4", "bits16", "bits8",
                                          "bits4x2", "bits2x4", "bits1x8") if hasattr(torch, n)}


def check_bundled_tensor(t: B.Tensor, what: str) -> tuple[torch.dtype, list[int], list[int]]:
    """(dtype, sizes, dim order) of a .bpte's tensor, or FormatError naming `what`: a dtype test-case
    values cannot have, a negative size, a dim order that is not a permutation, a byte count that
    does not match. Reads no tensor data."""
    try:
        dtype = scalar_type_to_dtype(t.scalar_type)
    except ValueError as e:
        raise FormatError(f"{what}: {e}") from None
    if dtype in _NOT_PLAIN:
        raise FormatError(f"{what}: scalar type {dtype} is not supported for test-case values")
    sizes = [int(s) for s in t.sizes or []]
    if any(s < 0 for s in sizes):
        raise FormatError(f"{what}: negative size in {sizes}")
    order = [int(d) for d in t.dim_order or []] or list(range(len(sizes)))
    if sorted(order) != list(range(len(sizes))):
        raise FormatError(f"{what}: dim_order {order} is not a permutation of its {len(sizes)} dimensions")
    n = math.prod(sizes)
    if len(t.data or b"") != n * dtype.itemsize:
        raise FormatError(f"{what}: {len(t.data or b'')} data bytes for shape {sizes} of {dtype} "
                          f"(needs {n * dtype.itemsize})")
    return dtype, sizes, order


def tensor_from_bundled(t: B.Tensor, what: str = "bundled tensor") -> torch.Tensor:
    """A schema tensor as a torch tensor (a copy; strides follow its dim order); FormatError naming
    `what` when the tensor is malformed (see check_bundled_tensor)."""
    dtype, sizes, order = check_bundled_tensor(t, what)
    physical = [sizes[d] for d in order]
    raw = bytes(t.data or b"")
    storage_dtype = torch.uint8 if dtype == torch.bool else dtype
    flat = torch.frombuffer(bytearray(raw), dtype=storage_dtype) if raw else torch.empty(0, dtype=storage_dtype)
    dense = flat.to(dtype) if dtype == torch.bool else flat
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    return dense.reshape(physical).permute(*inverse) if sizes else dense.reshape(())


def value_from_bundled(v: B.Value, what: str = "bundled value") -> ConfigValue:
    """The schema's Value back as a tensor, int, bool or float; FormatError naming `what` otherwise."""
    val = v.val
    if isinstance(val, B.Tensor):
        return tensor_from_bundled(val, what)
    if isinstance(val, B.Int):
        return int(val.int_val)
    if isinstance(val, B.Bool):
        return bool(val.bool_val)
    if isinstance(val, B.Double):
        return float(val.double_val)
    raise FormatError(f"{what}: a value of kind {_kind(val)} is not supported")


def _case_values(case: B.BundledMethodTestCase, at: str):
    """(where, value) of a test case's inputs, then its expected outputs; `at` names the case."""
    for role, vals in (("input", case.inputs), ("expected output", case.expected_outputs)):
        for k, v in enumerate(vals or []):
            yield f"{at}: {role} {k}", v


def _cases(suites, what: str):
    """(where, test case) of the suites' cases; `where` names the file (`what`), method and case."""
    for s in suites:
        for i, case in enumerate(s.test_cases or []):
            yield f"{what}: method {s.method_name or ''!r}: test case {i}", case


def check_test_cases(bundled: B.BundledProgram, what: str) -> None:
    """FormatError naming the file and the value at the first test-case value that cannot be decoded
    (reads no tensor data: a load-time check)."""
    for at, case in _cases(bundled.method_test_suites or [], what):
        for where, v in _case_values(case, at):
            if isinstance(v.val, B.Tensor):
                check_bundled_tensor(v.val, where)
            elif not isinstance(v.val, (B.Int, B.Bool, B.Double)):
                raise FormatError(f"{where}: a value of kind {_kind(v.val)} is not supported")


def method_test_suites_from_schema(bundled: B.BundledProgram, what: str = "bundled program") -> list[MethodTestSuite]:
    """The test suites of a deserialized .bpte as MethodTestSuite / MethodTestCase with torch tensors.

    A value that cannot be decoded raises FormatError naming `what` (give the file's name: the
    schema model does not know it) and where the value is (method, test case, input or expected
    output)."""
    suites = []
    for s in bundled.method_test_suites or []:
        cases = []
        for at, case in _cases([s], what):
            values = [value_from_bundled(v, where) for where, v in _case_values(case, at)]
            n = len(case.inputs or [])
            try:
                cases.append(MethodTestCase(values[:n], values[n:]))
            except ValueError as e:
                raise FormatError(f"{at}: {e}") from None
        try:
            suites.append(MethodTestSuite(method_name=s.method_name or "", test_cases=cases))
        except ValueError as e:
            raise FormatError(f"{what}: {e}") from None
    return suites


def serialize_from_bundled_program_to_flatbuffer(bundled_program: BundledProgram) -> bytes:
    """The .bpte bytes of a BundledProgram."""
    if not isinstance(bundled_program, BundledProgram):
        raise TypeError(f"bundled_program must be a BundledProgram, got {type(bundled_program).__name__}")
    return bytes(serialize_bundled_program(bundled_program.serialize_to_schema()))


def deserialize_from_flatbuffer_to_bundled_program(flatbuffer) -> B.BundledProgram:
    """Parses .bpte bytes into the schema model (upstream returns its schema dataclass too).

    Use `method_test_suites_from_schema` for the test cases as tensors. Malformed input raises FormatError.
    """
    if not isinstance(flatbuffer, (bytes, bytearray, memoryview)):
        raise TypeError(f"flatbuffer must be bytes, got {type(flatbuffer).__name__}")
    return deserialize_bundled_program(flatbuffer, what="flatbuffer")
