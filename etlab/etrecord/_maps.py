"""An ETRecord's maps and op tables as the Inspector uses them; pure Python, no torch.

The debug-handle, delegate and output-count maps (checked as they are read from an etlab manifest),
the op tables (`ops_from_json` / `ops_to_json`) and `method_info` (maps + ops -> `MethodInfo`) live
here, apart from the graph code, so that reading what the Inspector joins a run with
(`_quick.read_program_info`) never imports torch.
"""

from __future__ import annotations

from etlab.errors import FormatError
from etlab.facts.program_info import DebugHandle, DelegateInfo, MethodInfo, OpInfo

MAIN_CHAIN = 0  # etlab's emitter puts a whole method (cond branches inlined) in one chain


def main_method(names: list[str]) -> str | None:
    """The method representative inputs are for: "forward", else the only one."""
    if "forward" in names:
        return "forward"
    return names[0] if len(names) == 1 else None


def unique_handles(handles) -> DebugHandle:
    """Handles in first-seen order without repeats (a decomposed op's nodes share one handle)."""
    if isinstance(handles, int):
        return (handles,)
    return tuple(dict.fromkeys(int(h) for h in handles))


def handle_list(handle) -> list[int]:
    """A recorded handle (an int, or a list of them) as a list."""
    return [handle] if isinstance(handle, int) else [int(h) for h in handle]


def ops_to_json(ops: dict[int, list[OpInfo]]) -> list:
    """The per-handle op records (name, op type, stack trace, module hierarchy) as plain JSON lists."""
    return [[h, [[o.name, o.op_type, o.stack_trace,
                  [[k, p, t] for k, (p, t) in o.module_hierarchy.items()] if o.module_hierarchy is not None else None]
                 for o in infos]] for h, infos in ops.items()]


def ops_from_json(data, where: str) -> dict[int, list[OpInfo]]:
    """The per-handle op records read back from JSON; a FormatError naming `where` for anything malformed."""
    ops: dict[int, list[OpInfo]] = {}
    try:
        for handle, infos in data:
            if type(handle) is not int:
                raise TypeError("handle")
            for name, kind, trace, hierarchy in infos:
                if not isinstance(name, str) or not isinstance(kind, str) or not isinstance(trace, (str, type(None))):
                    raise TypeError("op")
                mh = None if hierarchy is None else {str(k): (str(p), str(t)) for k, p, t in hierarchy}
                ops.setdefault(handle, []).append(OpInfo(name, kind, trace, mh))
    except (TypeError, ValueError):
        raise FormatError(f"{where}: the ops table is malformed") from None
    return ops


def method_info(debug_handle_map: dict | None, delegate_map: dict | None, num_outs: dict | None,
                ops: dict[int, list[OpInfo]], reference_outputs=None, aot=None) -> MethodInfo:
    """One method's facts for the Inspector from the record's maps: handles per instruction, outputs per instruction,
    delegate entries, ops per handle and reference outputs."""
    handles = {(MAIN_CHAIN, int(i)): unique_handles(h) for i, h in (debug_handle_map or {}).items()}
    occurrences = {(MAIN_CHAIN, int(i)): tuple(handle_list(h)) for i, h in (debug_handle_map or {}).items()}
    num_outs = {int(i): int(n) for i, n in (num_outs or {}).items()}
    outputs = {key: num_outs.get(key[1], 1) for key in handles}
    outputs.update({(MAIN_CHAIN, i): n for i, n in num_outs.items()})
    delegates = {}
    for i, entry in (delegate_map or {}).items():
        dmap = entry.get("delegate_map") or {}
        delegates[(MAIN_CHAIN, int(i))] = DelegateInfo(str(entry.get("name")),
                                                       {k: unique_handles(v) for k, v in dmap.items()})
    return MethodInfo(instruction_debug_handles=handles, instruction_handle_occurrences=occurrences,
                      instruction_num_outputs=outputs, delegates=delegates,
                      ops=ops, reference_outputs=reference_outputs, aot_intermediate_outputs=aot)


# -- an etlab manifest's maps, checked -------------------------------------------------------------------


def _pairs(data, where: str, what: str) -> list:
    if not isinstance(data, list) or not all(isinstance(p, list) for p in data):
        raise FormatError(f"{where}: {what} must be a list of entries")
    return data


def _int_key(value, where: str, what: str) -> int:
    if type(value) is not int or value < 0:
        raise FormatError(f"{where}: {what}: instruction id {value!r} is not a non-negative integer")
    return value


def _handles(value, where: str, what: str) -> list[int]:
    if not isinstance(value, list) or not all(type(h) is int for h in value):
        raise FormatError(f"{where}: {what}: debug handles must be a list of integers, got {str(value)[:60]}")
    return value


def per_method(manifest: dict, key: str, where: str) -> dict | None:
    """manifest[key], which must be an object keyed by method (None when absent)."""
    value = manifest.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise FormatError(f"{where}: {key!r} must be an object keyed by method")
    return value


def debug_handle_map(manifest: dict, where: str) -> dict | None:
    """The manifest's per-method debug handle maps (instruction -> handles), checked; None when the record has none."""
    maps = per_method(manifest, "debug_handle_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"debug_handle_map[{method!r}]"
        out[method] = {}
        for pair in _pairs(entries, where, what):
            if len(pair) != 2:
                raise FormatError(f"{where}: {what} has a malformed entry")
            out[method][_int_key(pair[0], where, what)] = list(_handles(pair[1], where, what))
    return out


def delegate_map(manifest: dict, where: str) -> dict | None:
    """The manifest's per-method delegate maps (delegate instruction -> backend and its own handle map), checked;
    None when absent."""
    maps = per_method(manifest, "delegate_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"delegate_map[{method!r}]"
        out[method] = {}
        for entry in _pairs(entries, where, what):
            if len(entry) != 3 or not isinstance(entry[1], str):
                raise FormatError(f"{where}: {what} has a malformed entry")
            dmap = {}
            for pair in _pairs(entry[2], where, what):
                if len(pair) != 2 or not isinstance(pair[0], (int, str)) or isinstance(pair[0], bool):
                    raise FormatError(f"{where}: {what} has a malformed delegate debug identifier")
                dmap[pair[0]] = tuple(_handles(pair[1], where, what))
            out[method][_int_key(entry[0], where, what)] = {"name": entry[1], "delegate_map": dmap}
    return out


def num_outs_map(manifest: dict, where: str) -> dict | None:
    """The manifest's per-method outputs-per-instruction maps, checked; None when absent."""
    maps = per_method(manifest, "instruction_id_to_num_outs_map", where)
    if maps is None:
        return None
    out = {}
    for method, entries in maps.items():
        what = f"instruction_id_to_num_outs_map[{method!r}]"
        out[method] = {}
        for pair in _pairs(entries, where, what):
            if len(pair) != 2 or type(pair[1]) is not int:
                raise FormatError(f"{where}: {what} has a malformed entry")
            out[method][_int_key(pair[0], where, what)] = pair[1]
    return out


def program_ids(manifest: dict, key: str, count: int, where: str) -> dict[str, int]:
    """manifest[key] ({name: program number}) checked against the `count` programs the file holds."""
    ids = manifest.get(key) or {}
    if not isinstance(ids, dict):
        raise FormatError(f"{where}: {key!r} must map names to program numbers")
    out = {}
    for name, index in ids.items():
        if type(index) is not int or not 0 <= index < count:
            raise FormatError(f"{where}: {key}[{name!r}] refers to program {index!r}, which the file does not hold")
        out[str(name)] = index
    return out
