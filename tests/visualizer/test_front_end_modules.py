"""The views are ES module files (etlab/visualizer/static/*.js) importing each other. JupyterLab imports them
by URL from the server extension (no blob: URL or eval a strict Content-Security-Policy blocks); a notebook
widget's `_esm` and an offline page get them linked into one module (`_html.module_bundle`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from etlab.visualizer import _html

REPO = Path(__file__).resolve().parents[2]
STATIC = REPO / "etlab" / "visualizer" / "static"
ENTRIES = ("graph_view.js", "plot_view.js", "table_view.js")


@pytest.mark.parametrize("entry", ENTRIES)
def test_each_view_links_into_one_module_that_parses(entry, tmp_path):
    """Linked, the files share one scope: a name declared in two of them would be a SyntaxError here."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (`make setup` installs it to build the JupyterLab extension)")
    bundle = _html.module_bundle(entry)
    assert not re.search(r"^import\b", bundle, re.M)
    assert bundle.count("export default") == 1
    out = tmp_path / f"{entry}.mjs"
    out.write_text(bundle, encoding="utf-8")
    p = subprocess.run([node, "--check", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_every_module_file_imports_what_exists():
    """Every import names a static file and names it exports; every module is some view's part."""
    used = set()
    for entry in ENTRIES:
        _html.module_bundle(entry)  # raises on a missing file or export
        used |= set(re.findall(r"^// --- static/(\S+)", _html.module_bundle(entry), re.M))
    assert used == {p.name for p in STATIC.glob("*.js")}


def _linked(files: dict[str, str], entry: str) -> str:
    original = _html.static_text
    try:
        _html.static_text = files.__getitem__
        return _html.module_bundle.__wrapped__(entry)
    finally:
        _html.static_text = original


def test_the_linker_refuses_what_it_does_not_read():
    ok = {"a.js": 'import { f } from "./b.js";\nexport default { render: f };\n', "b.js": "export function f() {}\n"}
    assert _linked(ok, "a.js").endswith("export default { render: f };\n")
    with pytest.raises(ValueError, match=r"imports \['g'\] that static/b.js does not export"):
        _linked({**ok, "a.js": 'import { f, g } from "./b.js";\n'}, "a.js")
    with pytest.raises(ValueError, match=re.escape("import cycle a.js -> b.js -> a.js")):
        _linked({**ok, "b.js": 'import { x } from "./a.js";\nexport function f() {}\n'}, "a.js")
    with pytest.raises(ValueError, match=re.escape("static/b.js: an import or export the linker does not read")):
        _linked({**ok, "b.js": 'import * as m from "./c.js";\nexport function f() {}\n'}, "a.js")
    with pytest.raises(ValueError, match=re.escape("static/b.js: an import or export")):
        _linked({**ok, "b.js": "export function f() {}\nexport default {};\n"}, "a.js")


def test_the_server_serves_the_module_files_as_they_are():
    pytest.importorskip("jupyter_server")
    from etlab.jupyter._handlers import view_module

    for path in [*STATIC.glob("*.js"), STATIC / "theme.css"]:
        assert view_module(path.name) == path.read_text(encoding="utf-8")
    for bad in ("../_html.py", "nope.js", "graph_view.py", "format.d.ts", "GRAPH_VIEW.JS"):
        with pytest.raises(KeyError):
            view_module(bad)


def test_the_lab_extension_imports_modules_by_url_not_blob_or_eval():
    src = "\n".join(p.read_text(encoding="utf-8") for p in (REPO / "labextension" / "src").glob("*.ts"))
    for banned in ("createObjectURL", "new Blob", "new Function", "eval("):
        assert banned not in src
    assert "import(/* webpackIgnore: true */ url)" in src
