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
  const update = { paper_bgcolor: bg, plot_bgcolor: bg, "font.color": fg, "legend.font.color": fg,
    "hoverlabel.bordercolor": grid };
  const full = gd._fullLayout || gd.layout || {};
  for (const key of Object.keys(full)) {
    if (!/^[xy]axis\d*$/.test(key)) continue;
    Object.assign(update, { [`${key}.gridcolor`]: grid, [`${key}.linecolor`]: grid, [`${key}.zerolinecolor`]: grid,
      [`${key}.color`]: fg });
  }
  return update;
}

// Relayouts `gd` into the theme unless it is there already (a relayout redraws the chart).
export function applyPlotTheme(Plotly, gd) {
  if (!gd || !gd.layout) return;
  const update = plotThemeUpdate(gd);
  const stale = Object.entries(update).some(([path, value]) =>
    path.split(".").reduce((o, k) => (o == null ? undefined : o[k]), gd.layout) !== value);
  if (stale) Plotly.relayout(gd, update);
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
