// GraphView: one or more graphs side by side (compare mode), laid out in Python (_layout.py: each
// graph's JSON carries its layout) and placed here for the groups expanded (graph_layout.js), drawn in SVG.
// ES modules: graph_common.js (styles, helpers), graph_layout.js (placement), graph_pane.js (one drawn
// graph), this file (toolbar, panes, details). JupyterLab imports them by URL from the server extension;
// a notebook widget and an offline page get them linked into one module (_html.module_bundle).
//
// Model traits read: graphs (list of graph JSON), overlay, focus, options. Written: selected.
// options.shown: the kinds of graph whose panes start visible (all by default); a toolbar checkbox
// per graph shows or hides its pane, hidden panes keep their layout and selection.
// Big graphs start with every module group collapsed; boxes are placed per set of expanded groups
// (one linear pass over the precomputed layout), so only what is visible is drawn. Pan/zoom changes one transform, and a big
// drawing keeps only what is near the viewport in the DOM.

import { h } from "./elements.js";
import { fmtBytes, fmtNum } from "./format.js";
import { OVERLAYS, divergingColor, injectStyle, rampColor, shortOp } from "./graph_common.js";
import { Pane } from "./graph_pane.js";

// --- the view --------------------------------------------------------------------------------------

let uidCounter = 0;

class View {
  constructor(model, el) {
    this.model = model;
    this.el = el;
    this.uid = ++uidCounter;
    this.options = model.get("options") || {};
    const kinds = (model.get("graphs") || []).map((g) => g.kind);
    const wanted = (this.options.shown || kinds).filter((k) => kinds.includes(k));
    this.shownKinds = new Set(wanted.length ? wanted : kinds);
    this.overlay = model.get("overlay") || "none";
    this.readyCount = 0;
    injectStyle(el);
    this.build();
  }

  build() {
    // a layout comes as JSON text (one string in the widget state) or as data (the Lab server's API)
    const parsed = (this.model.get("graphs") || []).map((g) =>
      (typeof g.layout === "string" ? { ...g, layout: JSON.parse(g.layout) } : g));
    const graphs = parsed.map((g) => (g.layout && g.layout.same_as != null ? { ...g, layout: parsed[g.layout.same_as].layout } : g));
    const height = this.options.height || 560;
    this.root = h("div", { class: "etlab-gv etlab-theme", "data-etlab-view": "graph" });
    const bar = h("div", { class: "bar" });
    this.overlaySel = h("select", { "data-role": "overlay", title: "color nodes by", "aria-label": "color nodes by" });
    for (const [k, o] of Object.entries(OVERLAYS)) {
      const available = k === "none" || graphs.some((g) => g.nodes.some((n) => o.value(n) != null));
      const opt = h("option", { value: k }, o.label + (available ? "" : " (no data)"));
      if (!available) opt.disabled = true;
      this.overlaySel.append(opt);
    }
    this.overlaySel.value = this.overlay;
    this.overlaySel.addEventListener("change", () => this.setOverlay(this.overlaySel.value, true));
    this.search = h("input", { type: "search", placeholder: "search ops and names (module: for paths)", "data-role": "search",
      "aria-label": "search nodes by op or name; prefix module: to search module paths" });
    this.search.addEventListener("input", () => this.runSearch(this.search.value));
    this.search.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && this.matchList.length) this.select(this.matchList[0].pane, this.matchList[0].id, true);
    });
    const btn = (label, fn, role) => h("button", { onclick: fn, "data-role": role }, label);
    this.legend = h("span", { class: "legend" });
    this.status = h("span", { class: "status", "data-role": "status", role: "status" }, "");
    bar.append(this.overlaySel, this.search, btn("expand all", () => this.expandAll(true), "expand-all"),
      btn("collapse all", () => this.expandAll(false), "collapse-all"), btn("fit", () => this.panes.forEach((p) => p.fit()), "fit"),
      this.legend);
    const backends = {};
    for (const g of graphs) Object.assign(backends, g.backend_colors || {});
    for (const [b, c] of Object.entries(backends)) {
      const key = h("span", { class: "backend-key" }, h("i"), b);
      key.firstChild.setAttribute("style", `border-color:${c}`);
      bar.append(key);
    }
    this.paneToggles = h("span", { class: "pane-toggles", "data-role": "pane-toggles" });
    if (graphs.length > 1) bar.append(this.paneToggles);
    bar.append(this.status);
    this.matchBox = h("div", { class: "matches", "data-role": "matches" });
    const main = h("div", { class: "main" });
    main.setAttribute("style", `height:${height}px`);
    const panesEl = h("div", { class: "panes" });
    this.details = h("div", { class: "details", "data-role": "details", role: "region", "aria-label": "node details", tabindex: "0" },
      h("div", {}, "Click a node (or Tab to it and press Enter) to see its details."));
    main.append(panesEl, this.details);
    this.root.append(bar, this.matchBox, main);
    this.el.append(this.root);
    this.panes = graphs.map((g, i) => new Pane(this, g, i));
    for (const p of this.panes) panesEl.append(p.el);
    if (graphs.length > 1) {
      this.paneToggles.append("graphs:");
      for (const p of this.panes) {
        p.toggle = h("input", { type: "checkbox", "data-role": "show-pane", "data-kind": p.g.kind });
        p.toggle.checked = p.shown;
        p.toggle.addEventListener("change", () => this.showPane(p, p.toggle.checked));
        this.paneToggles.append(h("label", { title: `show the ${p.g.title} graph` }, p.toggle, p.g.title));
      }
    }
    this.computeScale();
    this.renderLegend();
    if (!graphs.length) this.setStatus("no graph");
    // drawn at once when attached (sizes are known: a standalone page), else on the next frame; a pane
    // without a size yet fits once it gets one (its ResizeObserver)
    const first = () => this.panes.forEach((p) => p.refresh(true));
    if (this.el.isConnected) first(); else requestAnimationFrame(first);
  }

  paneReady() {
    this.readyCount++;
    if (this.readyCount === this.panes.length) {
      this.root.setAttribute("data-state", "ready");
      const focus = this.model.get("focus_target");
      if (focus && focus.name) this.focus(focus);
    }
  }

  setStatus(t) { this.status.textContent = t; }

  showPane(pane, on) {
    if (!on && this.panes.filter((p) => p.shown).length === 1) { pane.toggle.checked = true; return; } // keep one
    pane.shown = on;
    if (pane.toggle) pane.toggle.checked = on;
    pane.el.style.display = on ? "" : "none";
  }

  computeScale() {
    const o = OVERLAYS[this.overlay];
    this.overlayScale = null;
    this.ramp = rampColor;
    this.center = null;
    if (!o || !o.value) return;
    const vals = [];
    for (const p of this.panes || []) for (const n of p.nodes) { const v = o.value(n); if (v != null && v > 0) vals.push(v); }
    if (!vals.length) return;
    // a ratio overlay (latency_center): log scale symmetric about the center, two colors split there
    const center = this.overlay === "latency" ? (this.panes || []).map((p) => p.g.latency_center).find((c) => c > 0) : null;
    if (center) {
      const span = Math.max(1e-6, ...vals.map((v) => Math.abs(Math.log10(v / center))));
      this.center = center;
      this.scaleRange = [center / 10 ** span, center * 10 ** span];
      this.overlayScale = (v) => 0.5 + (0.5 * Math.log10(Math.max(v, 1e-300) / center)) / span;
      this.ramp = divergingColor;
      return;
    }
    const lo = Math.min(...vals), hi = Math.max(...vals);
    this.scaleRange = [lo, hi];
    const f = o.log ? (v) => Math.log10(Math.max(v, lo)) : (v) => v;
    const a = f(lo), b = f(hi);
    this.overlayScale = (v) => (b > a ? (f(v) - a) / (b - a) : 1);
  }

  renderLegend() {
    this.legend.textContent = "";
    if (!this.overlayScale) return;
    const ramp = h("span", { class: "ramp", "data-role": this.center ? "diverging" : "sequential" });
    ramp.setAttribute("style", `background:linear-gradient(to right, ${this.ramp(0)}, ${this.ramp(0.5)}, ${this.ramp(1)})`);
    const [lo, hi] = this.scaleRange;
    if (this.center) this.legend.append(`${fmtNum(lo)} faster `, ramp, ` slower ${fmtNum(hi)} (log, split at ${fmtNum(this.center)})`);
    else this.legend.append(fmtNum(lo) + " ", ramp, " " + fmtNum(hi) + (OVERLAYS[this.overlay].log ? " (log)" : ""));
  }

  setOverlay(name, fromUser) {
    this.overlay = name;
    this.overlaySel.value = name;
    this.computeScale();
    this.renderLegend();
    for (const p of this.panes) if (p.layoutCache.size) p.refresh(false);
    if (fromUser) { this.model.set("overlay", name); this.model.save_changes(); }
  }

  expandAll(open) {
    for (const p of this.panes) {
      p.expanded = new Set(open ? p.g.groups.map((g) => g.id) : []);
      p.refresh(true);
    }
  }

  // Search: ops (target or short name) and node names first; module paths only when nothing else
  // matches, or asked for with "module:" (every node under "layers.0.conv" would match "conv" otherwise).
  runSearch(q) {
    q = q.trim().toLowerCase();
    let scope = "names";
    if (q.startsWith("module:")) { scope = "module"; q = q.slice(7).trim(); }
    this.matchList = [];
    this.matchBox.textContent = "";
    const found = { op: [], name: [], module: [] };
    for (const p of this.panes) {
      p.matches = new Set();
      if (q) for (const n of p.nodes) {
        const inModule = (n.module || "").toLowerCase().includes(q);
        const field = scope === "module" ? (inModule ? "module" : null) : String(n.op).toLowerCase().includes(q) ? "op"
          : n.name.toLowerCase().includes(q) ? "name" : inModule ? "module" : null;
        if (field) found[field].push({ pane: p, id: n.id, field, exact: shortOp(n.op).toLowerCase() === q });
      }
    }
    const byName = [...found.op, ...found.name];
    const useModules = scope === "module" || !byName.length;
    const list = useModules ? found.module : byName;
    list.sort((a, b) => (b.exact - a.exact) || (a.field === b.field ? 0 : a.field === "op" ? -1 : 1));
    this.matchList = list;
    for (const m of list) m.pane.matches.add(m.id);
    for (const p of this.panes) p.applyClasses();
    for (const m of list.slice(0, 50)) {
      const n = m.pane.nodes[m.id];
      this.matchBox.append(h("button", { type: "button", onclick: () => this.select(m.pane, m.id, true), "data-node-name": n.name,
        "data-field": m.field }, `${n.name} · ${shortOp(n.op)}${n.module ? " · " + n.module : ""}` +
        `${this.panes.length > 1 ? " (" + m.pane.g.kind + ")" : ""}`, h("span", { class: "field" }, ` [${m.field}]`)));
    }
    if (!q) return;
    const count = (k) => list.filter((m) => m.field === k).length;
    const fields = ["op", "name", "module"].filter((k) => count(k)).map((k) => `${k} ${count(k)}`).join(", ");
    let text = `${list.length} match${list.length === 1 ? "" : "es"}${fields ? " (" + fields + ")" : ""}`;
    if (!useModules && found.module.length) text += ` · ${found.module.length} more in module paths only (search module:${q})`;
    this.setStatus(text);
  }

  // Escape from a graph: focus goes back to the toolbar's search box.
  leaveGraph() { this.search.focus(); }

  async select(pane, nodeId, fromUser) {
    const n = pane.nodes[nodeId];
    const handles = new Set(n.handles);
    const relayout = [];
    for (const p of this.panes) {
      p.selected = p === pane ? nodeId : null;
      p.linked = new Set();
      if (p !== pane) for (const hd of handles) for (const id of p.byHandle.get(hd) || []) p.linked.add(id);
      if (p === pane && this.options.expand_on_select !== false && p.expandTo(nodeId)) relayout.push(p);
      p.applyClasses();
    }
    for (const p of relayout) await p.refresh(false);
    if (pane.pos) pane.setRoving(pane.visibleOf(nodeId));
    pane.centerOn(nodeId);
    for (const p of this.panes) if (p !== pane && p.linked.size) p.centerOn([...p.linked][0]);
    this.showDetails(pane, n);
    if (fromUser) {
      this.model.set("selected", { kind: pane.g.kind, name: n.name, handles: n.handles, id: n.id });
      this.model.save_changes();
      this.el.dispatchEvent(new CustomEvent("etlab:select", { bubbles: true, detail: { kind: pane.g.kind, name: n.name, handles: n.handles } }));
    }
  }

  focus(f) {
    // select a node by name (or by debug handle) from outside: Python, another view of a dashboard;
    // visible panes first, and a hidden pane is shown when only it has the node
    const order = [...this.panes.filter((p) => p.shown), ...this.panes.filter((p) => !p.shown)];
    for (const p of order) {
      if (f.kind && p.g.kind !== f.kind) continue;
      let n = f.name ? p.nodes.find((x) => x.name === f.name) : null;
      if (!n && f.handles && f.handles.length) n = p.nodes.find((x) => x.handles.some((hd) => f.handles.includes(hd)));
      if (n) {
        if (!p.shown) this.showPane(p, true);
        this.select(p, n.id, false);
        return true;
      }
    }
    return false;
  }

  showDetails(pane, n) {
    const rows = [
      ["op", n.op], ["graph", pane.g.kind], ["kind", n.kind],
      ["shapes", (n.shapes || []).map((x) => "[" + x.join(", ") + "]").join(" ") || "–"],
      ["dtypes", (n.dtypes || []).join(", ") || "–"], ["output bytes", fmtBytes(n.bytes)],
      ["debug handle", n.handles.length ? n.handles.join(", ") : "–"],
      ["module", n.module ? `${n.module}${n.module_type ? " (" + n.module_type.split(".").pop() + ")" : ""}` : "–"],
      ["source", n.source || "–"],
    ];
    if (n.backend) rows.push(["backend", n.backend]);
    if (n.weights && n.weights.length) rows.push(["weights", n.weights.join(", ")]);
    const unit = pane.g.time_unit || "";
    if (n.latency) {
      const l = n.latency;
      rows.push(["p50", `${fmtNum(l.p50)} ${unit}`], ["p10 / p90", `${fmtNum(l.p10)} / ${fmtNum(l.p90)} ${unit}`],
        ["avg / min / max", `${fmtNum(l.avg)} / ${fmtNum(l.min)} / ${fmtNum(l.max)} ${unit}`], ["runs", l.runs]);
      if (l.events && l.events.length) rows.push(["events", l.events.join(", ")]);
      if (l.shared > 1) rows.push(["shared", `timed together with ${l.shared - 1} other node(s)`]);
      if (l.note) rows.push(["attribution", l.note]);
    } else rows.push(["timing", "–"]);
    rows.push([`gap${pane.g.gap_metric ? " (" + pane.g.gap_metric + ")" : ""}`, n.gap == null ? "–" : fmtNum(n.gap)]);
    const table = h("table");
    for (const [k, v] of rows) table.append(h("tr", {}, h("td", { class: "k" }, k), h("td", { "data-field": k }, v)));
    this.details.textContent = "";
    this.details.append(h("h4", { "data-role": "details-name" }, n.name), table);
    if (n.stack_trace) this.details.append(h("div", { class: "k" }, "stack trace"), h("pre", {}, n.stack_trace));
  }
}

function render({ model, el }) {
  const view = new View(model, el);
  const onFocus = () => { const f = model.get("focus_target"); if (f) view.focus(f); };
  const onOverlay = () => { const o = model.get("overlay"); if (o !== view.overlay) view.setOverlay(o, false); };
  model.on("change:focus_target", onFocus);
  model.on("change:overlay", onOverlay);
  el.__etlabGraphView = view;
  return () => {
    model.off("change:focus_target", onFocus);
    model.off("change:overlay", onOverlay);
  };
}

export default { render };
