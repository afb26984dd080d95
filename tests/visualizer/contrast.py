"""The WCAG contrast check the browser tests run in a page (tests/visualizer, tests/jupyter)."""

# The lowest text/background contrast ratio (WCAG) over visible text in the given selectors.
MIN_CONTRAST = """(selectors) => {
  const rgb = (c) => (c.match(/[\\d.]+/g) || []).map(Number);
  const lin = (x) => { x /= 255; return x <= .03928 ? x / 12.92 : ((x + .055) / 1.055) ** 2.4; };
  const lum = ([r, g, b]) => .2126 * lin(r) + .7152 * lin(g) + .0722 * lin(b);
  const blend = (top, under) => { const a = top.length > 3 ? top[3] : 1;
                                  return [0, 1, 2].map((i) => top[i] * a + under[i] * (1 - a)); };
  function background(el) {  // the first opaque background up the tree, blending translucent ones over it
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c.length && !(c.length > 3 && c[3] === 0)) { layers.push(c); if (c.length === 3 || c[3] === 1) break; }
    }
    let base = [255, 255, 255];
    for (const l of layers.reverse()) base = blend(l, base);
    return base;
  }
  let worst = {ratio: 99, text: '', selector: ''};
  for (const sel of selectors) for (const el of document.querySelectorAll(sel)) {
    if (!el.offsetParent || !el.textContent.trim()) continue;
    const fg = blend(rgb(getComputedStyle(el).color), background(el)), bg = background(el);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + .05) / (lo + .05);
    if (ratio < worst.ratio) worst = {ratio, text: el.textContent.trim().slice(0, 40), selector: sel};
  }
  return worst;
}"""
