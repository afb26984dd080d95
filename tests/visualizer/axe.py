"""axe-core (npm, a devDependency of labextension/: `make labextension` / `make setup` install it) run inside
a playwright page by the accessibility tests (tests/visualizer/test_a11y.py, tests/jupyter/test_a11y.py).

A missing axe-core fails the test that needs it (never a skip): the project's own set-up installs it."""

from __future__ import annotations

from pathlib import Path

import pytest

AXE_JS = Path(__file__).resolve().parents[2] / "labextension" / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING = ("serious", "critical")


def axe_source() -> str:
    if not AXE_JS.is_file():
        pytest.fail(f"{AXE_JS} is missing: axe-core is a devDependency of labextension/package.json, installed by "
                    "`make labextension` (and `make setup`)")
    return AXE_JS.read_text(encoding="utf-8")


def axe_violations(page, context: str = "document") -> list[dict]:
    """axe's serious and critical violations in `context` (a CSS selector, or the whole document): rule id,
    impact, help, and the first targets with axe's summary of what fails."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(content=axe_source())
    found = page.evaluate("""async (ctx) => {
      const target = ctx === 'document' ? document : document.querySelector(ctx);
      if (!target) throw new Error('axe: no element ' + ctx);
      const r = await axe.run(target, {resultTypes: ['violations']});
      return r.violations.map((v) => ({id: v.id, impact: v.impact, help: v.help,
        nodes: v.nodes.slice(0, 4).map((n) => n.target.join(' ') + ' :: ' + n.failureSummary)}));
    }""", context)
    return [v for v in found if v["impact"] in BLOCKING]


# The lowest WCAG contrast of SVG text (its fill) over the fill of the box it sits on, per graph node and
# closed group of GraphViews in the page ({ratio, text, fg, bg}); the HTML check (contrast.py) reads CSS
# color and background, which SVG text has not.
SVG_NODE_CONTRAST = """() => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).slice(0, 3).map(Number);
  const lin = (x) => { x /= 255; return x <= .03928 ? x / 12.92 : ((x + .055) / 1.055) ** 2.4; };
  const lum = ([r, g, b]) => .2126 * lin(r) + .7152 * lin(g) + .0722 * lin(b);
  let worst = {ratio: 99, text: '', fg: '', bg: '', count: 0};
  for (const box of document.querySelectorAll('.etlab-gv .node, .etlab-gv .group.collapsed')) {
    const rect = box.querySelector('rect');
    if (!rect) continue;  // culled (off-screen) boxes too: they are drawn as they are once panned to
    const bg = getComputedStyle(rect).fill;
    for (const t of box.querySelectorAll('text')) {
      if (!t.textContent.trim() || getComputedStyle(t).display === 'none') continue;
      const fg = getComputedStyle(t).fill;
      const [hi, lo] = [lum(rgb(fg)), lum(rgb(bg))].sort((a, b) => b - a);
      const ratio = (hi + .05) / (lo + .05);
      worst.count++;
      if (ratio < worst.ratio) worst = {...worst, ratio, text: t.textContent.trim().slice(0, 40), fg, bg};
    }
  }
  return worst;
}"""
