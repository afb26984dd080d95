"""Standalone, offline HTML: every view's assets inlined (no network), written atomically.

A custom-JS view (anywidget) runs in the page through the same ES module as in the notebook,
given a small in-page stand-in for the widget model. Plotly views inline plotly.js once.
"""

from __future__ import annotations

import html
import itertools
import json
import os
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Protocol, overload, runtime_checkable

from etlab.facts.display import json_ready
from etlab.schema import write_atomic

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A DOM element id unique within the process (`etlab-<prefix>-<n>`), so several views on one page never collide."""
    return f"etlab-{prefix}-{next(_ids)}"


@cache
def static_text(name: str) -> str:
    """A file of etlab/visualizer/static as text."""
    return resources.files("etlab.visualizer").joinpath("static", name).read_text(encoding="utf-8")


# "<", ">" and "&" as JSON's \u escapes (JavaScript reads them back as the same characters): with no "<"
# in it, no string ("</script>", "<!--" then "<script>", which makes the HTML parser run past the
# element's end tag) changes where an inline script ends.
_SCRIPT_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def json_for_script(data) -> str:
    """JSON safe inside a <script> element, whatever strings it holds (see _SCRIPT_ESCAPES); a
    non-finite float (a hostile file's NaN) is null, as in the JSON the Lab server sends."""
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:  # NaN or inf somewhere: the rare case pays for the walk
        text = json.dumps(json_ready(data), separators=(",", ":"), allow_nan=False, default=str)
    return text.translate(_SCRIPT_ESCAPES)


def script_safe(code: str, what: str) -> str:
    """Code that can be inlined in a <script> element as it is: no end tag and no comment opener
    (after "<!--", a "<script" would make the parser skip the element's real end)."""
    lowered = code.lower()
    for bad in ("</script", "<!--"):
        if bad in lowered:
            raise ValueError(f"{what}: script text contains {bad!r} and cannot be inlined")
    return code


# The views are ES module files (static/*.js) importing each other by relative path. JupyterLab imports
# them by URL from the server extension; an anywidget `_esm` and an offline page's inline script cannot
# resolve a relative import, so there they are linked into one module: each file's imports dropped and
# its `export` keywords with them (the files share one scope; a name declared twice is a SyntaxError,
# tests/visualizer/test_front_end_modules.py parses every bundle).
_IMPORT = re.compile(r'^import \{([^}]*)\} from "\./([\w.-]+\.js)";[ \t]*\n', re.M)
_EXPORT = re.compile(r"^export (?=(?:async )?function |const |let |class )", re.M)
_EXPORTED = re.compile(r"^export (?:async )?(?:function|const|let|class) (\w+)", re.M)


def module_imports(name: str) -> list[tuple[str, list[str]]]:
    """The static modules a view module imports, with the names it takes from each."""
    return [(dep, [n.strip() for n in names.split(",") if n.strip()])
            for names, dep in _IMPORT.findall(static_text(name))]


@cache
def module_bundle(entry: str) -> str:
    """A view module of static/ and everything it imports, as one self-contained ES module (its
    dependencies first); only `import { a, b } from "./x.js";` lines are read, anything else is refused."""
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in chain:
            raise ValueError(f"static/{name}: import cycle {' -> '.join((*chain, name))}")
        if name in order:
            return
        for dep, names in module_imports(name):
            visit(dep, (*chain, name))
            missing = set(names) - set(_EXPORTED.findall(static_text(dep)))
            if missing:
                raise ValueError(f"static/{name}: imports {sorted(missing)} that static/{dep} does not export")
        order.append(name)

    visit(entry, ())
    parts = []
    for name in order:
        text = _EXPORT.sub("", _IMPORT.sub("", static_text(name)))
        if re.search(r"^import\b", text, re.M) or (name != entry and re.search(r"^export\b", text, re.M)):
            raise ValueError(f"static/{name}: an import or export the linker does not read "
                             '(only `import { a } from "./x.js";` and `export function|const|let|class`)')
        parts.append(f"// --- static/{name}\n{text}")
    return "\n".join(parts)


def graph_module_source() -> str:
    """The GraphView ES module. No layout engine: each graph's JSON carries its layout (_layout.py)."""
    return module_bundle("graph_view.js")


def plot_module_source() -> str:
    """The PlotView ES module; plotly.js is loaded once per page (shared_lib.js)."""
    return module_bundle("plot_view.js")


def table_module_source() -> str:
    """The TableView ES module."""
    return module_bundle("table_view.js")


def library_source(name: str) -> str:
    """The source of a library the views load once per page (shared_lib.js)."""
    sources = {"plotly": plotly_js}
    if name not in sources:
        raise KeyError(f"no library {name!r}; known: {sorted(sources)}")
    return sources[name]()


def serve_libraries(widget) -> None:
    """Answers the widget front end's requests for a shared library (sent once per page)."""

    def on_msg(_widget, content, _buffers) -> None:
        if isinstance(content, dict) and content.get("type") == "etlab:need-library":
            name = str(content.get("name"))
            try:
                widget.send({"type": "etlab:library", "name": name, "source": library_source(name)})
            except KeyError:
                pass

    widget.on_msg(on_msg)


def libraries_script(names) -> str:
    """A page's shared libraries, defined before its views run."""
    libs = ",".join(f"{json.dumps(n)}:{json_for_script(library_source(n))}" for n in sorted(set(names)))
    return f"<script>globalThis.etlabLibs = Object.assign(globalThis.etlabLibs || {{}}, {{{libs}}});</script>"


# A stand-in for the anywidget model inside a standalone page: get/set/on/off/save_changes.
MODEL_SHIM = """
function etlabModel(state) {
  const handlers = {};
  return {
    get: (k) => state[k],
    set: (k, v) => { state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); },
    on: (ev, f) => { (handlers[ev] = handlers[ev] || []).push(f); },
    emit: (ev, ...args) => (handlers[ev] || []).forEach((f) => f(...args)),
    off: (ev, f) => { handlers[ev] = (handlers[ev] || []).filter((g) => g !== f); },
    save_changes: () => {},
  };
}
"""


@dataclass
class Fragment:
    """A piece of a page: body HTML and the scripts it needs (`needs_plotly`: plotly.js in <head>)."""

    body: str
    scripts: list[str] = field(default_factory=list)
    needs_plotly: bool = False
    libraries: tuple[str, ...] = ()  # shared libraries its module loads (defined once in the page's head)


@runtime_checkable
class HasFragments(Protocol):
    """A view that exports as several page pieces (e.g. a table, a chart and the graph it links to)."""

    def html_fragments(self) -> list[Fragment]:
        """The view's page pieces, in order."""
        ...


@runtime_checkable
class HasFragment(Protocol):
    """A view that exports as one page piece."""

    def html_fragment(self) -> Fragment:
        """The view's one page piece."""
        ...


def view_fragments(view: object) -> list[Fragment]:
    """The page pieces of any view (a dashboard tab, a saved view): its `html_fragments()`, else its one
    `html_fragment()`; a TypeError names a view that can do neither."""
    if isinstance(view, HasFragments):
        return view.html_fragments()
    if isinstance(view, HasFragment):
        return [view.html_fragment()]
    raise TypeError(f"{type(view).__name__} has no HTML export (html_fragments or html_fragment)")


def anywidget_fragment(module_source: str, state: dict, *, what: str, element_id: str | None = None,
                       expose: str | None = None, libraries: tuple[str, ...] = ()) -> Fragment:
    """Renders an anywidget ES module into a div with `state` as its model's traits.

    expose: a window property under which the page keeps {model, el} (dashboard glue uses it).
    """
    eid = element_id or new_id("view")
    expose_js = f"window[{json.dumps(expose)}] = {{ model, el }};" if expose else ""
    code = (f"{script_safe(module_source, what)}\n{MODEL_SHIM}\n"
            f"const model = etlabModel({json_for_script(state)});\n"
            f"const el = document.getElementById({json.dumps(eid)});\n"
            f"render({{ model, el }});\n{expose_js}\n")
    return Fragment(body=f'<div id="{eid}" class="etlab-view"></div>',
                    scripts=[f'<script type="module">\n{code}</script>'], libraries=libraries)


def plotly_fragment(fig, *, element_id: str | None = None, height: int | None = None) -> Fragment:
    """A plotly figure as a page piece (plotly.js itself is loaded once in the page's head, hence `needs_plotly`),
    responsive, at `height` pixels when given."""
    import plotly.io as pio

    eid = element_id or new_id("plot")
    div = pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=eid,
                      default_height=f"{height}px" if height else "100%",
                      config={"displaylogo": False, "responsive": True})
    return Fragment(body=div, needs_plotly=True)


@cache
def plotly_js() -> str:
    """The bundled plotly.js source, checked safe to inline in a <script> element: a saved page needs no network."""
    from plotly.offline import get_plotlyjs

    return script_safe(get_plotlyjs(), "plotly.js")


@cache
def plot_theme_script() -> str:
    """A page's script that puts its plotly charts in the page's theme (static/plot_theme.js), then and on each
    theme change: the figures carry a light template, the page may be dark."""
    code = _EXPORT.sub("", static_text("plot_theme.js"))
    return f"<script>\n{script_safe(code, 'static/plot_theme.js')}\nthemePagePlots();\n</script>"


@cache
def theme_css() -> str:
    """The color variables every view uses (static/theme.css): Lab, VS Code, light and dark."""
    return static_text("theme.css")


PAGE_CSS = """
body.etlab-theme { font: 13px system-ui, -apple-system, "Segoe UI", sans-serif; margin: 16px;
  color: var(--etlab-fg); background: var(--etlab-bg); }
h1 { font-size: 18px; margin: 0 0 10px 0; }
.etlab-note { color: var(--etlab-fg-muted); margin: 4px 0 10px 0; }
.etlab-warn { color: var(--etlab-fg); border-left: 4px solid #e8a400; background: var(--etlab-bg-alt); padding: 4px 8px;
  margin: 4px 0 10px 0; }
table.etlab-table { border-collapse: collapse; font-size: 12px; }
table.etlab-table th, table.etlab-table td { border-bottom: 1px solid var(--etlab-border); padding: 3px 8px;
  text-align: left; }
table.etlab-table th { background: var(--etlab-bg-alt); cursor: pointer; position: sticky; top: 0; }
table.etlab-table tr.clickable { cursor: pointer; }
table.etlab-table tr.clickable:hover { background: var(--etlab-hover); }
.etlab-scroll { max-height: 420px; overflow: auto; border: 1px solid var(--etlab-border); }
"""


# A table row / chart point sends "etlab:focus"; the page's graph (and its tab) shows that node.
FOCUS_GLUE = """<script>
document.addEventListener('etlab:focus', function (e) {
  var g = window.etlabGraphView;
  if (!g || !e.detail) return;
  if (window.etlabShowTab && document.querySelector('.etlab-tab[data-tab="graph"]')) window.etlabShowTab('graph');
  g.model.set('focus_target', Object.assign({}, e.detail));
});
</script>"""


def page(title: str, fragments: list[Fragment], *, extra_head: str = "") -> str:
    """A complete HTML document holding the fragments, with every asset inline."""
    head_scripts = f"<script>{plotly_js()}</script>" if any(f.needs_plotly for f in fragments) else ""
    libraries = [name for f in fragments for name in f.libraries]
    if libraries:
        head_scripts += libraries_script(libraries)
    body = "\n".join(f.body for f in fragments)
    scripts = "\n".join(s for f in fragments for s in f.scripts)
    if any(f.needs_plotly for f in fragments):  # after the charts' own scripts: they are drawn by then
        scripts += "\n" + plot_theme_script()
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(title)}</title><style>{theme_css()}{PAGE_CSS}</style>{extra_head}{head_scripts}"
            f"</head>\n<body class=\"etlab-theme\">\n<h1>{html.escape(title)}</h1>\n{body}\n{FOCUS_GLUE}\n"
            f"{scripts}\n</body></html>\n")


def write_page(path: str | os.PathLike, text: str) -> os.PathLike:
    """Writes an HTML page atomically (a reader never sees half a report) and returns the path; a TypeError when `path`
    is not a path, since every view's `save_html` ends here."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"save_html: path must be a str or os.PathLike, got {type(path).__name__}")
    return write_atomic(path, text.encode("utf-8"))


# --- what a notebook shows where the widget cannot be drawn -------------------------------------------

FRONTEND_MISSING = (
    "<p class='etlab-note' data-role='widget-fallback'>This is a static copy of an etlab view. The interactive "
    "view needs the Jupyter widget front end where the notebook is opened: <code>pip install anywidget "
    "ipywidgets</code> in the environment that runs Jupyter (not only in the kernel's), then reload; a saved "
    "notebook shows this copy until it is run again. Offline: <code>view.save_html('view.html')</code>.</p>")


def static_html(widget, depth: int = 0) -> str:
    """A static HTML copy of a view (its tables and text; charts by title): what saved notebooks,
    nbconvert and front ends without the widget manager show instead of the interactive widget."""
    own = getattr(widget, "static_html", None)
    if callable(own):
        return str(own())
    if hasattr(widget, "value") and type(widget).__name__ == "HTML":
        return str(widget.value)
    children = getattr(widget, "children", None) or ()
    titles = getattr(widget, "titles", None) or ()
    parts = []
    for i, child in enumerate(children):
        if i < len(titles) and titles[i]:
            parts.append(f"<h{min(3 + depth, 6)}>{html.escape(str(titles[i]))}</h{min(3 + depth, 6)}>")
        parts.append(static_html(child, depth + 1))
    return "".join(parts)


@overload
def with_static_fallback(widget, bundle: None) -> None: ...
@overload
def with_static_fallback(widget, bundle: dict) -> dict: ...
@overload
def with_static_fallback(widget, bundle: tuple[dict, dict]) -> tuple[dict, dict]: ...


def with_static_fallback(widget, bundle):
    """The widget's mime bundle (a dict, or a (data, metadata) pair) plus a `text/html` copy, which
    every front end ranks below the widget view."""
    if isinstance(bundle, tuple):
        return (with_static_fallback(widget, bundle[0]), *bundle[1:])
    if bundle is None:
        return None
    body = static_html(widget)
    bundle = dict(bundle)
    bundle["text/html"] = (f"<style>{theme_css()}{PAGE_CSS.replace('body.etlab-theme', '.etlab-static')}</style>"
                           f"<div class='etlab-static etlab-theme'>{FRONTEND_MISSING}{body}</div>")
    return bundle
