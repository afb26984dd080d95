"""One set of formatters for every view: static/format.js is the only fmtBytes / fmtNum (the notebook
widgets and offline pages link it in, the JupyterLab extension bundles it), and its rule, run by node."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "etlab" / "visualizer" / "static"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (`make setup` installs it to build the JupyterLab extension)")
    return node


def _formatted(calls: list[str], names: str = "fmtBytes, fmtNum") -> list[str]:
    """Each JavaScript expression over format.js's exports (`names`), evaluated by node."""
    script = (f"import {{ {names} }} from {json.dumps((STATIC / 'format.js').as_uri())};\n"
              f"console.log(JSON.stringify([{', '.join(calls)}]));")
    p = subprocess.run([_node(), "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_bytes_in_binary_units_with_one_decimal():
    cases = {"fmtBytes(null)": "–", "fmtBytes(undefined)": "–", "fmtBytes(0)": "0 B", "fmtBytes(1023)": "1023 B",
             "fmtBytes(1024)": "1.0 KiB", "fmtBytes(1536)": "1.5 KiB", "fmtBytes(5 * 2 ** 20)": "5.0 MiB",
             "fmtBytes(3 * 2 ** 30)": "3.0 GiB",  # was "3072.00 MiB" in the graph, "3.0 GiB" in Lab
             "fmtBytes(2 ** 40)": "1.0 TiB"}
    assert dict(zip(cases, _formatted(list(cases)))) == cases


def test_numbers_significant_digits_and_exponents_outside_the_readable_range():
    cases = {"fmtNum(null)": "–", "fmtNum(NaN)": "–", "fmtNum(0)": "0", "fmtNum(42)": "42", "fmtNum(99999)": "99999",
             "fmtNum(3.14159)": "3.142", "fmtNum(3.14159, 5)": "3.1416", "fmtNum(123456)": "1.235e+5",
             "fmtNum(0.0001234)": "1.234e-4", "fmtNum(-0.5)": "-0.5000", "fmtNum(0.001)": "0.001000",
             "fmtNum(Infinity)": "∞"}
    assert dict(zip(cases, _formatted(list(cases)))) == cases


def test_one_implementation():
    """No view module or extension source defines its own byte or number formatter (or element builder)."""
    own = re.compile(r"(function\s+(fmtBytes|fmtNum|h|s)\s*\(|(const|let)\s+(fmtBytes|fmtNum)\s*=)")
    found = {}
    for path in [*STATIC.glob("*.js"), *(REPO / "labextension" / "src").glob("*.ts")]:
        if path.name in ("format.js", "elements.js"):
            continue
        hits = [m.group(0) for m in own.finditer(path.read_text(encoding="utf-8"))]
        if hits:
            found[path.relative_to(REPO).as_posix()] = hits
    assert not found, f"formatters or element builders defined again: {found}"
    render = (REPO / "labextension" / "src" / "render.ts").read_text(encoding="utf-8")
    assert "from '../../etlab/visualizer/static/format.js'" in render


def test_the_declarations_name_what_the_modules_export():
    """format.d.ts and elements.d.ts (what the extension's TypeScript compiles against) declare exactly the
    functions format.js and elements.js export, with as many required parameters."""
    for name in ("format", "elements"):
        url = (STATIC / f"{name}.js").as_uri()
        script = (f"import * as m from {json.dumps(url)};\n"
                  "console.log(JSON.stringify(Object.fromEntries(Object.entries(m).map(([k, f]) => [k, f.length]))));")
        p = subprocess.run([_node(), "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        exported = json.loads(p.stdout)  # name -> parameters before the first default (Function.length)
        declared = {m.group(1): sum(1 for rest, _, optional in re.findall(r"(\.\.\.)?\b(\w+)(\?)?:", m.group(2))
                                    if not rest and not optional)  # required parameters
                    for m in re.finditer(r"export function (\w+)\((.*)\):", (STATIC / f"{name}.d.ts").read_text())}
        assert declared == exported, name


def test_a_live_table_cell_reads_as_the_terminal_and_static_copy():
    """format.js's cellText (the live TableView's cells) writes each value as etlab.inspector.cell_text does (the
    terminal's tables and the view's saved static copy): one rule on both sides of the notebook."""
    from etlab.inspector import cell_text

    values = [None, 0, 42, -7, 123456, 99999.0, 3.14159, -0.5, 0.001, 0.0001234, 12345.6, 1e-5, 2.5e17, 123456789012,
              1.0e-300, 0.1 + 0.2, 1.5, 1e4 + 0.5, [1, 2.5, 0.333333], [[1, 2], [3]], "relu", True, False]
    calls = [f"cellText({json.dumps(v)})" for v in values]
    assert dict(zip(calls, _formatted(calls, "cellText"))) == {c: cell_text(v) for c, v in zip(calls, values)}
    assert _formatted(["cellText(NaN)"], "cellText") == [cell_text(float("nan"))]
