"""The Dashboard outside a notebook (issue 26 item 9): a plain Python REPL prints `repr(show(inspector))`, which
was the widgets' repr, kilobytes of HTML; IPython's terminal shows the bundle's text/plain, which ipywidgets
cuts at 110 characters. Both are now a short text form within the terminal's width."""

from __future__ import annotations

import os
import subprocess
import sys


def _lines_fit(text: str, width: int) -> None:
    assert max(len(line) for line in text.splitlines()) <= width, max(text.splitlines(), key=len)


def test_show_in_a_plain_python_repl_prints_a_short_text_form(mlp_run, tmp_path):
    """The user's path: `python -i`, `show(Inspector(...))` at the prompt, stdout a pipe (120 columns)."""
    record = mlp_run.manager.get_etrecord()
    record.save(tmp_path / "model.etrecord")
    script = ("from etlab.inspector import Inspector\nfrom etlab.visualizer import show\n"
              f"show(Inspector(etdump_path={str(mlp_run.etdump)!r}, etrecord={str(tmp_path / 'model.etrecord')!r}))\n")
    env = dict(os.environ)  # etlab as installed in the venv (make setup), no path override
    env.pop("COLUMNS", None)
    p = subprocess.run([sys.executable, "-q", "-i"], input=script, capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert out.startswith("Dashboard of Inspector("), out[:300]
    assert "<" not in out and "widget" not in out.lower().replace("notebook widgets", ""), out[:500]
    assert len(out) < 3000, len(out)
    _lines_fit(out, 120)
    assert "tabs: Summary, Graph" in out and "not shown: Memory" in out  # no program manager: said why
    assert "DELEGATE_CALL" in out and "DemoBackend" in out  # the events' table
    assert "numeric gap:" in out and ".save_html(" in out


def test_dashboard_text_form_fits_the_width_and_is_ipythons_text_plain(mlp_inspector, mlp_run):
    from etlab.visualizer import show

    dash = show(mlp_inspector, mlp_run.manager)
    assert "memory" in dash.views and "not shown" not in dash.text()  # every tab there: none listed missing
    for width in (80, 120):
        _lines_fit(dash.text(width=width), width)
    bundle = dash._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["text/plain"] == repr(dash) == dash.text()
    assert "text/html" in data  # the static copy for notebooks without the widget manager is still there
