// PlotView: a plotly figure. Traits read: figure ({data, layout}); written: clicked (the clicked point).
// plotly.js is loaded once per page (shared_lib.js) instead of travelling with every chart's state.

import { sharedLibrary } from "./shared_lib.js";
import { applyPlotTheme, onThemeChange } from "./plot_theme.js";

let plotlyModule = null;

function loadPlotly(model, onWait) {
  if (!plotlyModule) {
    plotlyModule = sharedLibrary(model, "plotly", onWait).then((source) => {
      if (globalThis.Plotly) return globalThis.Plotly; // an offline page defines it once for all charts
      const module = { exports: {} };
      // its UMD wrapper fills module.exports (define and a global Plotly are left alone)
      new Function("module", "exports", "define", source)(module, module.exports, undefined);
      return module.exports;
    });
    plotlyModule.catch(() => { plotlyModule = null; });
  }
  return plotlyModule;
}

async function render({ model, el }) {
  const div = document.createElement("div");
  div.className = "etlab-plot etlab-theme";
  div.setAttribute("data-etlab-view", "plot");
  div.style.width = "100%";
  div.textContent = "loading plotly.js…";
  div.setAttribute("data-state", "loading");
  el.appendChild(div);
  let Plotly;
  try {
    Plotly = await loadPlotly(model, (text) => {
      // every chart of the page waiting for the same library says so
      document.querySelectorAll(".etlab-plot[data-state=loading]").forEach((d) => { d.textContent = text; });
    });
  } catch (err) {
    div.textContent = String(err.message || err);
    div.setAttribute("data-state", "error");
    return;
  }
  div.textContent = "";
  const draw = () => {
    const fig = model.get("figure") || {};
    // the figure takes the output's width: no fixed width, resized with its container
    const layout = Object.assign({}, fig.layout || {}, { autosize: true, width: undefined });
    Plotly.react(div, fig.data || [], layout, { responsive: true, displaylogo: false });
    applyPlotTheme(Plotly, div); // the figure's light template gives way to the page's theme
    div.setAttribute("data-state", "ready");
  };
  draw();
  const stopTheme = onThemeChange(() => applyPlotTheme(Plotly, div));
  div.on("plotly_click", (e) => {
    const p = e && e.points && e.points[0];
    if (!p) return;
    model.set("clicked", { curve: p.curveNumber, index: p.pointIndex ?? p.pointNumber ?? null,
                           customdata: p.customdata ?? null, label: p.label ?? null, id: p.id ?? null });
    model.save_changes();
  });
  model.on("change:figure", draw);
  const resize = new ResizeObserver(() => { if (div.offsetWidth) Plotly.Plots.resize(div); });
  resize.observe(div);
  return () => { model.off("change:figure", draw); stopTheme(); resize.disconnect(); Plotly.purge(div); };
}

export default { render };
