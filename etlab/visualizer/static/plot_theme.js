// Plotly charts in the page's theme. The figures are built in Python with a light template; their colors
// (paper, plot area, text, grid) are taken here from the chart's theme variables (theme.css) instead, and
// taken again when the theme changes live: the system's light/dark preference, JupyterLab's theme
// (attributes of <body>) or VS Code's (classes of <body>).

// The layout changes that put the chart `gd` (a drawn plotly div inside an .etlab-theme element) in the theme.
export function plotThemeUpdate(gd) {
  const css = getComputedStyle(gd);
  const v = (name, fallback) => css.getPropertyValue(name).trim() || fallback;
  const bg = v("--etlab-bg", "#ffffff");
  const fg = v("--etlab-fg", "#1f2328");
  const grid = v("--etlab-border", "#dfe3e8");
  const update = { paper_bgcolor: bg, plot_bgcolor: bg, "font.color": fg, "legend.font.color": fg };
  const full = gd._fullLayout || gd.layout || {};
  for (const key of Object.keys(full)) {
    if (!/^[xy]axis\d*$/.test(key)) continue;
    Object.assign(update, { [`${key}.gridcolor`]: grid, [`${key}.linecolor`]: grid, [`${key}.zerolinecolor`]: grid,
      [`${key}.color`]: fg });
  }
  return update;
}

// Dark or light text for a "#rgb", "#rrggbb" or "rgb(...)" fill (null for a color it cannot read).
export function textOn(fill) {
  let c = String(fill || "").trim();
  if (/^#[0-9a-f]{3}$/i.test(c)) c = "#" + [...c.slice(1)].map((x) => x + x).join("");
  const rgb = /^#[0-9a-f]{6}$/i.test(c) ? [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16))
    : (c.match(/^rgba?\(([^)]*)\)$/) || [null, ""])[1].split(",").slice(0, 3).map(Number);
  if (rgb.length !== 3 || rgb.some((x) => !Number.isFinite(x))) return null;
  const lin = (x) => { x /= 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; };
  const lum = 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2]);
  return lum > 0.18 ? "#1f2328" : "#f2f2f2";
}

// The trace changes a theme needs: a treemap's (sunburst's, icicle's) root label is drawn in the layout's text
// color (its "outside" text) on the root's own fill, so on a dark page a light root would carry light text.
export function traceThemeUpdates(gd) {
  const out = [];
  (gd.data || []).forEach((trace, i) => {
    if (!["treemap", "sunburst", "icicle"].includes(trace.type) || !Array.isArray(trace.parents)) return;
    const colors = (trace.marker && trace.marker.colors) || [];
    const color = textOn(colors[trace.parents.findIndex((p) => p === "" || p == null)]);
    if (color) out.push([i, { "outsidetextfont.color": color }]);
  });
  return out;
}

const valueAt = (obj, path) => path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), obj);

// Relayouts `gd` into the theme unless it is there already (a relayout redraws the chart).
export function applyPlotTheme(Plotly, gd) {
  if (!gd || !gd.layout) return;
  for (const [i, update] of traceThemeUpdates(gd)) {
    if (Object.entries(update).some(([path, value]) => valueAt(gd.data[i], path) !== value)) Plotly.restyle(gd, update, [i]);
  }
  const update = plotThemeUpdate(gd);
  if (Object.entries(update).some(([path, value]) => valueAt(gd.layout, path) !== value)) Plotly.relayout(gd, update);
}

// Calls `fn` whenever the theme may have changed; returns the function that stops listening.
export function onThemeChange(fn) {
  const media = globalThis.matchMedia ? globalThis.matchMedia("(prefers-color-scheme: dark)") : null;
  if (media) media.addEventListener("change", fn);
  const observer = new MutationObserver(fn);
  observer.observe(document.body, { attributes: true, attributeFilter: ["class", "style", "data-jp-theme-light", "data-jp-theme-name"] });
  return () => { if (media) media.removeEventListener("change", fn); observer.disconnect(); };
}

// An offline page: every plotly chart in it, now and on each theme change.
export function themePagePlots() {
  const all = () => {
    if (!globalThis.Plotly) return;
    document.querySelectorAll(".js-plotly-plot").forEach((gd) => applyPlotTheme(globalThis.Plotly, gd));
  };
  all();
  onThemeChange(all);
}
