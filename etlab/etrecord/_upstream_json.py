"""The JSON half of upstream ExecuTorch's ETRecord layout (see `_upstream`), read without torch.

The entry names, the debug-handle / delegate / output-count maps, which programs the file holds,
and each edge program's op table (debug handle -> nodes, with op type, stack trace and module
hierarchy) are all JSON: `etlab inspect run.etdp --etrecord upstream.etrecord` reads them here
without importing torch. The torch.save members and the rebuilt graphs are `_upstream`'s.
"""

from __future__ import annotations

import base64
import binascii
import re

from etlab.errors import FormatError
from etlab.etrecord._archive import UPSTREAM_IDENTIFIER, _check_name, load_json
from etlab.etrecord._maps import main_method
from etlab.etrecord._program_json import GETITEM, Unsupported, op_type, upstream_program
from etlab.facts.program_info import OpInfo
from etlab.facts.source import module_hierarchy

EDGE = "edge_dialect_exported_program"
ATEN = "exported_program"
MAPS = ("debug_handle_map", "delegate_map", "instruction_id_to_num_outs_map", "export_graph_id")
VALUES = ("reference_outputs", "representative_inputs")
PARTS = ("_state_dict", "_constants", "_example_inputs")
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}"
_PROGRAM_NAME = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT}){{0,3}}")

def is_upstream_entry(name: str) -> bool:
    """Whether an upstream ETRecord may hold an entry of this name (see the module docstring)."""
    if name == UPSTREAM_IDENTIFIER or name in MAPS or name in VALUES:
        return True
    for part in PARTS:
        if name.endswith(part):
            name = name[:-len(part)]
            break
    return bool(_PROGRAM_NAME.fullmatch(name)) and ".." not in name


def _base64(text, where: str, what: str) -> bytes:
    if not isinstance(text, str):
        raise FormatError(f"{where}: {what} is not a base64 string")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise FormatError(f"{where}: {what} is not valid base64") from None


def _int_keys(mapping, where: str, what: str) -> dict:
    if not isinstance(mapping, dict):
        raise FormatError(f"{where}: {what} must be an object keyed by instruction id")
    out = {}
    for key, value in mapping.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) < 10):
            raise FormatError(f"{where}: {what}: key {str(key)[:40]!r} is not an instruction id")
        out[int(key)] = value
    return out


def _handles(value, where: str, what: str) -> list[int]:
    if type(value) is int:
        return [value]
    if isinstance(value, list) and all(type(h) is int for h in value):
        return list(value)
    raise FormatError(f"{where}: {what}: {str(value)[:60]} is not a debug handle or a list of them")


def _per_method(entries, name: str, where: str) -> dict | None:
    if name not in entries:
        return None
    data = load_json(entries, name, where)
    if not isinstance(data, dict) or not all(isinstance(m, str) for m in data):
        raise FormatError(f"{where}: {name!r} must be an object keyed by method name")
    return data


def debug_handle_map(entries, where: str) -> dict | None:
    """An upstream record's debug handle maps, per method, checked; None when absent."""
    maps = _per_method(entries, "debug_handle_map", where)
    if maps is None:
        return None
    return {m: {i: _handles(h, where, f"debug_handle_map[{m!r}]") for i, h in
                _int_keys(v, where, f"debug_handle_map[{m!r}]").items()} for m, v in maps.items()}


def delegate_map(entries, where: str) -> dict | None:
    """An upstream record's delegate maps, per method, checked; None when absent."""
    maps = _per_method(entries, "delegate_map", where)
    if maps is None:
        return None
    out = {}
    for method, per in maps.items():
        what = f"delegate_map[{method!r}]"
        out[method] = {}
        for instruction, entry in _int_keys(per, where, what).items():
            if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("delegate_map"), dict)):
                raise FormatError(f"{where}: {what}[{instruction}] lacks a backend name or a delegate map")
            dmap = {}
            for ident, handles in entry["delegate_map"].items():
                key = int(ident) if ident.isascii() and ident.isdigit() and len(ident) < 10 else ident
                dmap[key] = tuple(_handles(handles, where, what))
            out[method][instruction] = {"name": entry["name"], "delegate_map": dmap}
    return out


def num_outs_map(entries, where: str) -> dict | None:
    """An upstream record's outputs-per-instruction maps, per method, checked; None when absent."""
    maps = _per_method(entries, "instruction_id_to_num_outs_map", where)
    if maps is None:
        return None
    out = {}
    for method, per in maps.items():
        out[method] = {}
        for instruction, n in _int_keys(per, where, f"instruction_id_to_num_outs_map[{method!r}]").items():
            if type(n) is not int or n < 0:  # upstream may record a list for a multi-output op
                if not (isinstance(n, list) and all(type(x) is int for x in n)):
                    raise FormatError(f"{where}: instruction_id_to_num_outs_map[{method!r}][{instruction}] "
                                      "is not a count")
                n = len(n)
            out[method][instruction] = n
    return out


def export_graph_id(entries, where: str) -> int | None:
    """The id upstream records for the exported graph (to match graph-module ids), or None; a FormatError when not an
    integer."""
    if "export_graph_id" not in entries:
        return None
    value = load_json(entries, "export_graph_id", where)
    if type(value) is not int:
        raise FormatError(f"{where}: export_graph_id is not an integer")
    return value


def program_bases(entries: dict[str, bytes]) -> list[str]:
    """Base names of the programs an upstream ETRecord holds (entries that are not parts or maps)."""
    return [n for n in entries if n != UPSTREAM_IDENTIFIER and n not in MAPS and n not in VALUES
            and not n.endswith(PARTS)]


def split_program(base: str) -> tuple[str, str]:
    """An upstream program entry's base name -> (which programs it belongs to, key there)."""
    if base == ATEN:
        return "aten", "forward"
    if base == EDGE:
        return "edge", "forward"
    if base.startswith(EDGE + "/"):
        return "edge", base[len(EDGE) + 1:]
    return "graph_map", base if "/" in base else f"{base}/forward"


def upstream_ids(entries: dict[str, bytes], where: str) -> dict[str, dict[str, str]]:
    """Base names of an upstream ETRecord's programs by kind ("aten", "edge", "graph_map") and key,
    checked: every part present, nothing recorded twice, an edge program there."""
    ids: dict[str, dict[str, str]] = {"aten": {}, "edge": {}, "graph_map": {}}
    bases = sorted(program_bases(entries))
    for name in entries:
        if name.endswith(PARTS) and not any(name == base + part for base in bases for part in PARTS):
            raise FormatError(f"{where}: entry {name!r} belongs to no program in the file")
    for base in bases:
        missing = [base + p for p in PARTS if base + p not in entries]
        if missing:
            raise FormatError(f"{where}: program {base!r} lacks {missing}")
        kind, key = split_program(base)
        if key in ids[kind]:
            raise FormatError(f"{where}: program {base!r} is recorded twice")
        ids[kind][key] = base
    if not ids["edge"]:
        raise FormatError(f"{where}: an upstream ExecuTorch ETRecord without an edge dialect program")
    return ids


def program_ops(entries: dict[str, bytes], base: str, where: str) -> dict[int, list[OpInfo]]:
    """The op table of one program (and of its delegates' original programs after it), read from its
    JSON only: debug handle -> its nodes (getitems left out: they only unpack results). The op type is
    what upstream's Inspector shows for the node it deserializes (`_program_json.op_type`)."""
    ops: dict[int, list[OpInfo]] = {}
    hierarchies: dict[int, dict | None] = {}

    def walk(program) -> None:
        later = []
        for node in program.nodes:
            if node.op != "call_function" or node.target == GETITEM:
                continue
            if node.delegate is not None:
                later.append(node.delegate.original)
            if node.own_handle is None:
                continue
            if not op_type(node.written):
                raise FormatError(f"{program.where}: node {node.name[:80]!r}: unknown operator {node.written[:120]!r}")
            key = id(node.module_stack)
            if key not in hierarchies:
                hierarchies[key] = module_hierarchy(node.module_stack)
            hierarchy = hierarchies[key]
            ops.setdefault(node.own_handle, []).append(
                OpInfo(node.serialized, op_type(node.written), node.stack_trace or None,
                       dict(hierarchy) if hierarchy is not None else None))
        for child in later:
            walk(child)

    try:
        program = upstream_program(load_json(entries, base, where), f"{where}: program {base!r}", ops_only=True)
    except Unsupported as e:  # an Edge program's every node has a result; one without is not upstream's writing
        raise FormatError(f"{e}: not an Edge program the op table can be read from") from None
    walk(program)
    return ops


def upstream_program_facts(entries: dict[str, bytes], where: str) -> tuple:
    """What an upstream record's `program_info()` is made of, without reading the values (torch.save
    members) or rebuilding graphs: (method names, (debug-handle, delegate, output-count maps), op
    tables, methods with inputs to replay, methods with reference outputs); `_quick` builds the
    ProgramInfo, leaving values and graphs to the full record."""
    for name in entries:
        _check_name(name, where, is_upstream_entry)
    ids = upstream_ids(entries, where)
    maps = (debug_handle_map(entries, where) or {}, delegate_map(entries, where) or {},
            num_outs_map(entries, where) or {})
    export_graph_id(entries, where)  # checked now, as the full reader does
    names = list(dict.fromkeys([*ids["edge"], *maps[0]]))
    main = main_method(names)
    with_inputs = {m for m in names if ("representative_inputs" in entries and m == main) or (
        m in ids["edge"] and entries.get(ids["edge"][m] + "_example_inputs"))}
    ops = {m: program_ops(entries, base, where) for m, base in ids["edge"].items()}
    return names, maps, ops, with_inputs, set(names) if "reference_outputs" in entries else set()
