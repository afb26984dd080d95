"""The format loaders on crafted hostile input, part two: objects aliased to blow up the decode
(quadratic table and string aliasing), nesting depth, and a union tag read without its value.
Built with the same small valid files and the same tracemalloc-bounded `failing_parse` as
tests/test_schema_loaders.py."""

from __future__ import annotations

import struct

import flatbuffers
import pytest

from etlab import FormatError
from etlab.schema import _codec
from etlab.schema import etdump as ed
from etlab.schema import program as pte
from etlab.schema._generated.etdump import DebugEvent as GenDebugEvent
from etlab.schema._generated.etdump import ETDump as GenETDumpModule
from etlab.schema._generated.etdump import Event as GenEvent
from etlab.schema._generated.etdump import RunData as GenRunData
from etlab.schema._generated.etdump import Value as GenValue
from etlab.schema._generated.layouts import LAYOUTS
from etlab.schema._generated.program import ExecutionPlan as GenPlanModule
from etlab.schema._generated.program import Operator as GenOperatorModule
from etlab.schema._generated.program import Program as GenProgramModule
from tests.test_schema_loaders import WHAT, _plan, failing_parse, make_pte

# -- aliasing and nesting -------------------------------------------------------------------------


def _etdump_with_aliases(n_runs: int, n_events: int, bad_enum: bool = False) -> bytes:
    """`n_runs` entries of run_data all naming one RunData whose `n_events` events all name one Event."""
    b = flatbuffers.Builder(1024)
    GenValue.Start(b)
    GenValue.AddVal(b, 99 if bad_enum else 0)
    value = GenValue.End(b)
    GenDebugEvent.Start(b)
    GenDebugEvent.AddDebugEntry(b, value)
    debug = GenDebugEvent.End(b)
    GenEvent.Start(b)
    GenEvent.AddDebugEvent(b, debug)
    last = GenEvent.End(b)
    GenEvent.Start(b)
    event = GenEvent.End(b)
    b.StartVector(4, n_events + 1, 4)
    b.PrependUOffsetTRelative(last)  # the one event that carries the (possibly bad) enum comes last
    for _ in range(n_events):
        b.PrependUOffsetTRelative(event)
    events = b.EndVector()
    GenRunData.Start(b)
    GenRunData.AddEvents(b, events)
    run = GenRunData.End(b)
    b.StartVector(4, n_runs, 4)
    for _ in range(n_runs):
        b.PrependUOffsetTRelative(run)
    runs = b.EndVector()
    GenETDumpModule.Start(b)
    GenETDumpModule.AddRunData(b, runs)
    b.FinishSizePrefixed(GenETDumpModule.End(b), b"ED00")
    return bytes(b.Output())


def test_quadratic_table_aliasing_is_refused(monkeypatch):
    """Refused after visiting about one table per 4 bytes of file (the verifier's budget), not 4 million."""
    data = _etdump_with_aliases(2000, 2000)  # ~16 KB naming 4 million events
    visits = 0
    table = _codec._Verifier.table

    def counted(self, *args, **kwargs):
        nonlocal visits
        visits += 1
        return table(self, *args, **kwargs)

    monkeypatch.setattr(_codec._Verifier, "table", counted)
    err, peak = failing_parse(ed.deserialize_etdump, data)
    assert 0 < visits <= len(data) // 4 + 65, visits
    assert str(err).startswith(f"{WHAT}: Event table: offsets alias one another far more than any writer does")
    assert peak < 10 * len(data) + (1 << 20)


def test_string_aliasing_is_refused():
    """One long operator name named by every entry: the bytes to decode grow, not the objects."""
    b = flatbuffers.Builder(1024)
    name = b.CreateString("x" * 4000)
    GenOperatorModule.Start(b)
    GenOperatorModule.AddName(b, name)
    op = GenOperatorModule.End(b)
    b.StartVector(4, 1000, 4)
    for _ in range(1000):
        b.PrependUOffsetTRelative(op)
    ops = b.EndVector()
    GenPlanModule.Start(b)
    GenPlanModule.AddOperators(b, ops)
    plan = GenPlanModule.End(b)
    b.StartVector(4, 1, 4)
    b.PrependUOffsetTRelative(plan)
    plans = b.EndVector()
    GenProgramModule.Start(b)
    GenProgramModule.AddExecutionPlan(b, plans)
    b.Finish(GenProgramModule.End(b), b"ET12")
    data = bytes(b.Output())
    err, peak = failing_parse(pte.deserialize_pte, data)
    assert str(err).startswith(f"{WHAT}: Operator.name: offsets alias one another far more than any writer does")
    assert peak < 10 * len(data) + (1 << 20)


def test_linear_aliasing_within_budget_parses():
    """Aliasing as dense as an honest file's objects is allowed (writers may share tables)."""
    parsed = ed.deserialize_etdump(_etdump_with_aliases(1, 2000))
    assert len(parsed.run_data[0].events) == 2001


def test_late_defect_fails_before_models_are_built():
    """Regression: enum values used to be checked while building models, after thousands of
    objects had been allocated. The verifier now checks them, so the failure is cheap."""
    data = _etdump_with_aliases(1, 20000, bad_enum=True)
    err, peak = failing_parse(ed.deserialize_etdump, data)
    assert str(err) == f"{WHAT}: Value.val has value 99, which is not a etdump.ValueType"
    assert peak < len(data) + (1 << 16)


def _schema_depth(ns: str, table: str, seen: tuple[str, ...] = ()) -> int:
    """Longest chain of nested tables below `table`, as the verifier counts depth."""
    assert table not in seen, f"{ns} schema is recursive through {(*seen, table)}"
    children = []
    for _name, _slot, kind, typ, _align, _default in LAYOUTS["tables"][ns][table]:
        if kind == "table":
            children.append(typ)
        elif kind == "union":
            children.extend(LAYOUTS["unions"][typ])
        elif kind == "vector" and typ[0] == "table":
            children.append(typ[1])
    return max((1 + _schema_depth(ns, c, (*seen, table)) for c in children), default=0)


def test_schemas_bound_nesting():
    """No schema is recursive, so nesting is bounded by the schema itself, well inside MAX_DEPTH."""
    for ns, (root, _ident) in LAYOUTS["roots"].items():
        assert _schema_depth(ns, root) < _codec.MAX_DEPTH


def test_nesting_deeper_than_the_limit_is_refused(monkeypatch):
    monkeypatch.setattr(_codec, "MAX_DEPTH", 2)
    with pytest.raises(FormatError) as info:
        pte.deserialize_pte(make_pte(), what=WHAT)
    assert str(info.value) == f"{WHAT}: Tensor table nested deeper than 2"


def test_union_tag_is_checked_even_without_a_value():
    """Regression: the reader fetches a union's type tag even when the value is absent; a tag
    slot pointing past its table made the reader run off the buffer."""
    d = bytearray(make_pte())
    ev = _plan(bytes(d)).Values(1)
    vt = ev._tab.Pos - struct.unpack_from("<i", d, ev._tab.Pos)[0]
    t_size = struct.unpack_from("<H", d, vt + 2)[0]
    struct.pack_into("<HH", d, vt + 4, t_size + 4000, 0)  # tag slot far out, value slot absent
    with pytest.raises(FormatError) as info:
        pte.deserialize_pte(bytes(d), what=WHAT)
    assert str(info.value) == f"{WHAT}: EValue.val type tag at offset {ev._tab.Pos + t_size + 4000} overruns its table"
    assert info.value.__cause__ is None
