// GraphView, one graph pane: placement (graph_layout.js), SVG drawing, viewport culling, pan/zoom (see graph_view.js).

import { h, s } from "./elements.js";
import { fmtBytes, fmtNum } from "./format.js";
import { DETACH_ABOVE, Minimap, OP_FILL, OVERLAYS, fmtShape, lightInk, shortOp } from "./graph_common.js";
import { composeLayout } from "./graph_layout.js";

// Zoom: from 2% (a whole big graph) to 300% (a label 33 px high); a wheel event moves one notch at most
// (WHEEL_NOTCH_PX: a mouse's notch is 100 px in Chromium, 1.16x; trackpads send many small deltas).
const ZOOM_MIN = 0.02, ZOOM_MAX = 3, WHEEL_NOTCH_PX = 120, WHEEL_RATE = 0.0015;

// --- one graph pane ------------------------------------------------------------------------------

export class Pane {
  constructor(view, graph, index) {
    this.view = view;
    this.g = graph;
    this.index = index;
    this.nodes = graph.nodes;
    this.groups = new Map(graph.groups.map((gr) => [gr.id, gr]));
    this.childGroups = new Map();
    this.groupSize = new Map();
    for (const gr of graph.groups) {
      if (!this.childGroups.has(gr.parent)) this.childGroups.set(gr.parent, []);
      this.childGroups.get(gr.parent).push(gr.id);
    }
    for (const n of this.nodes) {
      for (let gid = n.group; gid != null; gid = this.groups.get(gid).parent) {
        this.groupSize.set(gid, (this.groupSize.get(gid) || 0) + 1);
      }
    }
    this.byHandle = new Map();
    for (const n of this.nodes) for (const hd of n.handles) {
      if (!this.byHandle.has(hd)) this.byHandle.set(hd, []);
      this.byHandle.get(hd).push(n.id);
    }
    const threshold = view.options.collapse_threshold ?? 400;
    this.expanded = new Set(this.nodes.length > threshold ? [] : graph.groups.map((gr) => gr.id));
    this.layoutCache = new Map();
    this.nodeEls = new Map(); // drawn nodes and groups: empty until the first layout is drawn
    this.groupEls = new Map();
    this.selected = null; // node id
    this.linked = new Set();
    this.matches = new Set();
    this.transform = { x: 20, y: 30, k: 1 };
    this.roving = null; // the drawn item ("n<id>" or "g:<group>") Tab lands on in this pane
    this.shown = view.shownKinds.has(graph.kind);
    this.build();
  }

  build() {
    this.el = h("div", { class: "pane", "data-pane": String(this.index), "data-kind": this.g.kind });
    if (!this.shown) this.el.style.display = "none";
    this.el.append(h("div", { class: "pane-title" }, `${this.g.title} · ${this.nodes.length} nodes`));
    const helpId = `etlab-gv-help-${this.view.uid}-${this.index}`;
    this.el.append(h("div", { class: "sr-only", id: helpId }, "Tab moves into the graph; the arrow keys follow its edges " +
      "(up and down) and go along a row (left and right); Enter selects a node or opens a group; c closes the group " +
      "of a node; + and - zoom; Escape leaves the graph."));
    this.svg = s("svg", { class: "canvas", role: "group", "aria-label": `${this.g.title} graph, ${this.nodes.length} nodes`,
      "aria-describedby": helpId });
    const defs = s("defs");
    const marker = s("marker", { id: `arrow-${this.view.uid}-${this.index}`, viewBox: "0 0 10 10", refX: "9", refY: "5",
      markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    marker.append(s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a96a6" }));
    defs.append(marker);
    this.svg.append(defs);
    this.root = s("g", { class: "root" });
    this.svg.append(this.root);
    this.el.append(this.svg);
    this.tip = h("div", { class: "tip", role: "tooltip", id: `etlab-gv-tip-${this.view.uid}-${this.index}`, "data-role": "tooltip" });
    this.tip.style.display = "none";
    this.minimap = new Minimap(this);
    this.el.append(this.tip, this.minimap.canvas);
    this.installPanZoom();
    this.installKeyboard();
    // laid out or selected while hidden (a closed tab, a hidden pane): fit / center once it gets a size
    this.needsFit = false;
    this.pendingCenter = null;
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver(() => {
        this.size = null;
        this.cull();
        this.minimap.update();
        if (!(this.svg.getBoundingClientRect().width > 0)) return;
        if (this.needsFit) { this.needsFit = false; this.fit(); }
        if (this.pendingCenter != null) { const id = this.pendingCenter; this.pendingCenter = null; this.centerOn(id); }
      }).observe(this.svg);
    }
  }

  // The id a node is drawn under: itself, or its outermost collapsed group.
  visibleOf(nodeId) {
    const n = this.nodes[nodeId];
    let vis = "n" + n.id;
    const chain = [];
    for (let gid = n.group; gid != null; gid = this.groups.get(gid).parent) chain.push(gid);
    for (let i = chain.length - 1; i >= 0; i--) {
      if (!this.expanded.has(chain[i])) { vis = "g:" + chain[i]; break; }
    }
    return vis;
  }

  groupChain(gid) {
    const chain = [];
    for (let g = gid; g != null; g = this.groups.get(g).parent) chain.push(g);
    return chain;
  }

  // The group ids from the outermost down to `gid` (cached: every edge of a layout asks).
  groupPath(gid) {
    if (!this.pathCache) this.pathCache = new Map();
    if (gid == null) return [""];
    let p = this.pathCache.get(gid);
    if (!p) { p = [...this.groupPath(this.groups.get(gid).parent), gid]; this.pathCache.set(gid, p); }
    return p;
  }

  // Boxes and edges for a set of expanded groups (graph_layout.js).
  compose(expanded) {
    if (!this.g.layout) throw new Error("this graph carries no layout (made by an older etlab?)");
    return composeLayout(this.g.layout, this.g, (gid) => this.groupPath(gid), expanded);
  }

  layout() {
    const key = [...this.expanded].sort().join("\n");
    if (!this.layoutCache.has(key)) {
      const t0 = performance.now();
      this.layoutCache.set(key, this.compose(this.expanded));
      this.lastLayoutMs = performance.now() - t0;
    }
    return this.layoutCache.get(key);
  }

  refresh(fit = false) {
    let laid;
    try {
      laid = this.layout();
    } catch (err) {
      this.view.setStatus("layout failed: " + err.message);
      console.error("etlab GraphView: layout failed", err);
      return;
    }
    this.draw(laid);
    if (fit) this.fit();
    this.el.setAttribute("data-state", "ready");
    const boxes = [...this.groupEls.values()].filter((g) => g.classList.contains("collapsed")).length;
    this.view.setStatus(`${this.drawnNodes} nodes${boxes ? ` + ${boxes} collapsed groups` : ""} drawn · ` +
      `placed in ${Math.round(this.lastLayoutMs || 0)} ms`);
    this.view.paneReady(this);
  }

  draw(laid) {
    const hadFocus = this.svg.contains(document.activeElement);
    this.hideTip();
    this.root.textContent = "";
    this.items = []; // [element, layer, x0, y0, x1, y1, shown] for viewport culling
    // A big drawing keeps only what is near the viewport in the DOM: hidden (display: none) SVG
    // still makes every zoom step cost in proportion to the whole graph (text re-layout).
    this.detach = Object.keys(laid.boxes).length > DETACH_ABOVE;
    const place = (el, layer, x0, y0, x1, y1) => {
      this.items.push([el, layer, x0, y0, x1, y1, !this.detach]);
      if (!this.detach) layer.append(el);
    };
    this.nodeEls = new Map();
    this.groupEls = new Map();
    this.pos = new Map();
    const groupLayer = s("g", { class: "groups" });
    const edgeLayer = s("g", { class: "edges" });
    const nodeLayer = s("g", { class: "nodes" });
    this.root.append(groupLayer, edgeLayer, nodeLayer);
    const overlay = OVERLAYS[this.view.overlay] || OVERLAYS.none;
    const scale = this.view.overlayScale;
    const colors = this.g.backend_colors || {};
    let drawn = 0;
    // outer groups first, so an inner group's box lies over its parent's
    const order = Object.entries(laid.boxes).sort((p, q) => (p[0][0] === q[0][0] ? 0 : p[0][0] === "g" ? -1 : 1)
      || (p[0][0] === "g" ? this.groupPath(p[0].slice(2)).length - this.groupPath(q[0].slice(2)).length : 0));
    for (const [id, [x, y, w, hgt]] of order) {
      this.pos.set(id, { x, y, w, h: hgt });
      if (id.startsWith("g:")) {
        const gid = id.slice(2);
        const gr = this.groups.get(gid);
        const collapsed = !this.expanded.has(gid);
        const ge = s("g", { class: `group ${gr.kind}${collapsed ? " collapsed" : ""}`, "data-group-id": gid,
          transform: `translate(${x},${y})` });
        if (collapsed) {
          ge.setAttribute("data-item", id);
          ge.setAttribute("role", "button");
          ge.setAttribute("tabindex", "-1");
          ge.setAttribute("aria-expanded", "false");
        }
        const rect = s("rect", { width: w, height: hgt });
        if (gr.backend && colors[gr.backend]) rect.setAttribute("style", `stroke:${colors[gr.backend]}`);
        ge.append(rect);
        const label = s("text", { class: "glabel", x: 8, y: 15 });
        label.textContent = (collapsed ? "▸ " : "▾ ") + gr.label;
        ge.append(label);
        if (collapsed) {
          const sub = s("text", { class: "sub", x: 8, y: 30 });
          const v = this.groupValue(gid, overlay);
          sub.textContent = `${this.groupSize.get(gid)} ops${v != null ? " · " + this.valueText(v) : ""}`;
          ge.append(sub);
          if (v != null && scale) {
            const fill = this.view.ramp(scale(v));
            rect.setAttribute("style", (rect.getAttribute("style") || "") + `;fill:${fill}`);
            ge.classList.add(lightInk(fill) ? "dark" : "ink");
          }
          ge.setAttribute("aria-label", `${gr.label}: group of ${this.groupSize.get(gid)} ops, closed` +
            (v != null ? `, ${OVERLAYS[this.view.overlay].label} ${this.valueText(v)}` : ""));
          ge.append(s("rect", { class: "ring", x: -4, y: -4, width: w + 8, height: hgt + 8, rx: 8 }));
          ge.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
        } else {
          label.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
        }
        place(ge, collapsed ? nodeLayer : groupLayer, x, y, x + w, y + hgt);
        this.groupEls.set(gid, ge);
      } else {
        const n = this.nodes[Number(id.slice(1))];
        const ne = s("g", { class: `node ${n.kind}`, "data-node-id": String(n.id), "data-node-name": n.name,
          "data-item": id, role: "button", tabindex: "-1", transform: `translate(${x},${y})` });
        const rect = s("rect", { width: w, height: hgt });
        let fill = OP_FILL[n.kind] || OP_FILL.op;
        const v = overlay.value ? overlay.value(n) : null;
        if (overlay.value) fill = v != null && scale ? this.view.ramp(scale(v)) : "#f4f4f4";
        if (overlay.value && v != null && scale) ne.classList.add(lightInk(fill) ? "dark" : "ink");
        ne.setAttribute("aria-label", this.describe(n).join(", "));
        let style = `fill:${fill}`;
        if (n.backend && colors[n.backend]) style += `;stroke:${colors[n.backend]};stroke-width:2`;
        rect.setAttribute("style", style);
        const t1 = s("text", { x: 8, y: 14 });
        t1.textContent = n.kind === "op" || n.kind === "control_flow" ? shortOp(n.op) : n.name;
        const t2 = s("text", { class: "sub", x: 8, y: 27 });
        t2.textContent = v != null ? this.valueText(v) : fmtShape(n);
        ne.append(rect, t1, t2, s("rect", { class: "ring", x: -4, y: -4, width: w + 8, height: hgt + 8, rx: 6 }));
        ne.addEventListener("click", (e) => { e.stopPropagation(); this.view.select(this, n.id, true); });
        place(ne, nodeLayer, x, y, x + w, y + hgt);
        this.nodeEls.set(n.id, ne);
        drawn++;
      }
    }
    const marker = `url(#arrow-${this.view.uid}-${this.index})`;
    for (const [, , pts] of laid.edges) {
      const d = pts.map((p, i) => `${i ? "L" : "M"}${p[0].toFixed(1)},${p[1].toFixed(1)}`).join(" ");
      const path = s("path", { class: "edge", d, "marker-end": marker });
      let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
      for (const [px, py] of pts) { x0 = Math.min(x0, px); y0 = Math.min(y0, py); x1 = Math.max(x1, px); y1 = Math.max(y1, py); }
      place(path, edgeLayer, x0, y0, x1, y1);
    }
    this.laid = laid;
    this.drawnNodes = drawn;
    this.svg.setAttribute("data-node-count", String(drawn));
    this.linkItems(laid);
    this.applyClasses();
    this.applyTransform();
    this.minimap.draw(laid);
    if (hadFocus && this.roving) this.focusItem(this.roving);
  }

  // What a node is, for its aria-label and its tooltip: name and op, shapes, time or overlay value,
  // backend, module.
  describe(n) {
    const lines = [n.kind === "op" || n.kind === "control_flow" ? `${n.name}: ${n.op}` : `${n.name} (${n.kind})`];
    const shape = fmtShape(n);
    if (shape) lines.push(shape);
    if (n.latency) lines.push(`p50 ${fmtNum(n.latency.p50)} ${this.g.time_unit || ""}`.trim());
    const o = this.view.overlay;
    if (o === "gap" && n.gap != null) lines.push(`gap ${this.valueText(n.gap)}`);
    if (o === "bytes" && n.bytes != null) lines.push(`output ${fmtBytes(n.bytes)}`);
    if (n.backend) lines.push(`delegated to ${n.backend}`);
    if (n.module) lines.push(`module ${n.module}`);
    return lines;
  }

  // Keyboard neighbours of the drawn items: along the drawn edges, and reading order.
  linkItems(laid) {
    this.succ = new Map();
    this.pred = new Map();
    for (const [a, b] of laid.edges) {
      if (!this.succ.has(a)) this.succ.set(a, []);
      if (!this.pred.has(b)) this.pred.set(b, []);
      this.succ.get(a).push(b);
      this.pred.get(b).push(a);
    }
    const el = (id) => (id.startsWith("g:") ? this.groupEls.get(id.slice(2)) : this.nodeEls.get(Number(id.slice(1))));
    this.itemEl = el;
    this.order = [...this.pos.keys()].filter((id) => el(id) && el(id).hasAttribute("data-item"))
      .sort((a, b) => this.pos.get(a).y - this.pos.get(b).y || this.pos.get(a).x - this.pos.get(b).x);
    let keep = this.roving && this.order.includes(this.roving) ? this.roving : null;
    if (!keep && this.roving && this.roving.startsWith("g:")) { // an opened group: its first item
      const gid = this.roving.slice(2);
      keep = this.order.find((id) => (id.startsWith("g:") ? this.groupChain(id.slice(2)) :
        this.groupChain(this.nodes[Number(id.slice(1))].group)).includes(gid));
    }
    if (!keep && this.selected != null) keep = this.visibleOf(this.selected);
    this.setRoving(keep && this.pos.has(keep) ? keep : this.order[0] || null);
  }

  // An overlay value with its unit: "1.234 ms" (latency), "4096 B" (bytes), "3.1e-07 MSE" (gap).
  valueText(v) {
    const o = this.view.overlay;
    const unit = o === "latency" ? this.g.time_unit : o === "bytes" ? "B" : o === "gap" ? this.g.gap_metric : "";
    return fmtNum(v) + (unit ? " " + unit : "");
  }

  groupValue(gid, overlay) {
    if (!overlay.value) return null;
    let total = null;
    for (const n of this.nodes) {
      if (!this.groupChain(n.group).includes(gid)) continue;
      const v = overlay.value(n);
      if (v == null) continue;
      if (this.view.center) { // a ratio: the group shows its node furthest from the center
        if (total == null || Math.abs(Math.log(v / this.view.center)) > Math.abs(Math.log(total / this.view.center))) total = v;
      } else total = this.view.overlay === "gap" ? Math.max(total ?? 0, v) : (total ?? 0) + v;
    }
    return total;
  }

  toggle(gid) {
    if (this.expanded.has(gid)) {
      this.expanded.delete(gid);
      for (const [g] of this.groups) if (this.groupChain(g).includes(gid)) this.expanded.delete(g);
    } else this.expanded.add(gid);
    this.refresh(false);
  }

  expandTo(nodeId) {
    let changed = false;
    for (const gid of this.groupChain(this.nodes[nodeId].group)) {
      if (!this.expanded.has(gid)) { this.expanded.add(gid); changed = true; }
    }
    return changed;
  }

  applyClasses() {
    for (const [id, el] of this.nodeEls) {
      el.classList.toggle("selected", id === this.selected);
      el.classList.toggle("linked", this.linked.has(id) && id !== this.selected);
      el.classList.toggle("match", this.matches.has(id));
    }
    const linkedGroups = new Set();
    const selGroups = new Set();
    for (const id of this.linked) { const v = this.visibleOf(id); if (v.startsWith("g:")) linkedGroups.add(v.slice(2)); }
    if (this.selected != null) { const v = this.visibleOf(this.selected); if (v.startsWith("g:")) selGroups.add(v.slice(2)); }
    for (const [gid, el] of this.groupEls) {
      el.classList.toggle("linked", linkedGroups.has(gid));
      el.classList.toggle("selected", selGroups.has(gid));
    }
  }

  // --- pan / zoom ---
  installPanZoom() {
    let drag = null;
    this.svg.addEventListener("pointerdown", (e) => {
      if (e.button !== 0) return;
      // capture only once it is a drag: a captured pointer would retarget the click to the svg
      drag = { x: e.clientX, y: e.clientY, tx: this.transform.x, ty: this.transform.y, moved: false, id: e.pointerId };
    });
    this.svg.addEventListener("pointermove", (e) => {
      if (!drag) return;
      const dx = e.clientX - drag.x, dy = e.clientY - drag.y;
      if (!drag.moved && Math.abs(dx) + Math.abs(dy) > 3) {
        drag.moved = true;
        this.svg.classList.add("dragging");
        this.svg.setPointerCapture(drag.id);
      }
      this.transform.x = drag.tx + dx;
      this.transform.y = drag.ty + dy;
      this.scheduleTransform();
    });
    const end = (e) => {
      if (drag && drag.moved) this.suppressClick = true;
      drag = null;
      this.svg.classList.remove("dragging");
      try { this.svg.releasePointerCapture(e.pointerId); } catch (err) { /* not captured */ }
    };
    this.svg.addEventListener("pointerup", end);
    this.svg.addEventListener("pointercancel", end);
    this.svg.addEventListener("click", (e) => {
      if (this.suppressClick) { this.suppressClick = false; e.stopPropagation(); return; }
    }, true);
    this.svg.addEventListener("wheel", (e) => {
      e.preventDefault();
      const r = this.svg.getBoundingClientRect();
      // one event zooms one notch at most, whatever its unit (pixels, lines, pages) or size
      const unit = e.deltaMode === 1 ? 16 : e.deltaMode === 2 ? r.height || 600 : 1;
      const dy = Math.max(-WHEEL_NOTCH_PX, Math.min(WHEEL_NOTCH_PX, e.deltaY * unit));
      this.zoomSmooth(e.clientX - r.left, e.clientY - r.top, Math.exp(-dy * WHEEL_RATE));
    }, { passive: false });
  }

  // Zooms by `f` about (mx, my) over a few frames (each takes 40% of the way left), so steps are seen
  // as motion; steps in a row add up to one goal.
  zoomSmooth(mx, my, f) {
    const from = this.zoomGoal ? this.zoomGoal.k : this.transform.k;
    this.zoomGoal = { k: Math.max(ZOOM_MIN, Math.min(ZOOM_MAX, from * f)), mx, my };
    if (!this.zoomFrame) this.zoomFrame = requestAnimationFrame(() => this.zoomStep());
  }

  zoomStep() {
    this.zoomFrame = 0;
    const g = this.zoomGoal;
    if (!g) return;
    const left = Math.log(g.k / this.transform.k);
    const done = Math.abs(left) < 0.01;
    const t = this.transform;
    const k = done ? g.k : t.k * Math.exp(left * 0.4);
    t.x = g.mx - (g.mx - t.x) * (k / t.k);
    t.y = g.my - (g.my - t.y) * (k / t.k);
    t.k = k;
    this.applyTransform();
    if (done) this.zoomGoal = null; else this.zoomFrame = requestAnimationFrame(() => this.zoomStep());
  }

  // --- keyboard: a roving tabindex over the drawn items (nodes, closed groups) ---
  setRoving(id) {
    const old = this.roving != null && this.itemEl ? this.itemEl(this.roving) : null;
    if (old) old.setAttribute("tabindex", "-1");
    this.roving = id;
    this.rovingEl = id != null ? this.itemEl(id) : null;
    if (this.rovingEl) {
      this.rovingEl.setAttribute("tabindex", "0");
      const it = (this.items || []).find((x) => x[0] === this.rovingEl);
      if (it && !it[6]) { it[6] = true; if (this.detach) it[1].append(it[0]); else it[0].style.display = ""; }
    }
  }

  installKeyboard() {
    const itemOf = (e) => (e.target.closest ? e.target.closest("[data-item]") : null);
    this.svg.addEventListener("keydown", (e) => {
      const el = itemOf(e);
      if (el) this.onKey(e, el.getAttribute("data-item"));
    });
    this.svg.addEventListener("focusin", (e) => {
      const el = itemOf(e);
      if (!el) return;
      const id = el.getAttribute("data-item");
      if (id !== this.roving) this.setRoving(id);
      this.showTip(id);
    });
    this.svg.addEventListener("focusout", () => this.hideTip());
    this.svg.addEventListener("pointerover", (e) => { const el = itemOf(e); if (el) this.showTip(el.getAttribute("data-item")); });
    this.svg.addEventListener("pointerout", (e) => {
      const el = itemOf(e);
      if (el && !el.contains(e.relatedTarget) && document.activeElement !== el) this.hideTip();
    });
  }

  onKey(e, id) {
    if (e.altKey || e.ctrlKey || e.metaKey) return;
    let next = null;
    const p = this.pos.get(id);
    switch (e.key) {
      case "ArrowDown": next = this.along(id, this.succ, 1); break;
      case "ArrowUp": next = this.along(id, this.pred, -1); break;
      case "ArrowRight": next = this.beside(id, 1); break;
      case "ArrowLeft": next = this.beside(id, -1); break;
      case "Home": next = this.order[0]; break;
      case "End": next = this.order[this.order.length - 1]; break;
      case "Enter": case " ":
        if (id.startsWith("g:")) this.toggle(id.slice(2));
        else this.view.select(this, Number(id.slice(1)), true);
        break;
      case "c": {
        const gid = id.startsWith("n") ? this.nodes[Number(id.slice(1))].group : this.groups.get(id.slice(2)).parent;
        if (gid == null) return;
        this.roving = "g:" + gid;
        this.toggle(gid);
        break;
      }
      case "+": case "=": case "-": {
        const t = this.transform;
        this.zoomSmooth(t.x + (p.x + p.w / 2) * t.k, t.y + (p.y + p.h / 2) * t.k, e.key === "-" ? 1 / 1.25 : 1.25);
        break;
      }
      case "Escape": this.hideTip(); this.view.leaveGraph(); break;
      default: return;
    }
    e.preventDefault();
    e.stopPropagation();
    if (next) this.focusItem(next);
  }

  // The next item along the edges (the one nearest in x), else the nearest one in reading order.
  along(id, links, dir) {
    const p = this.pos.get(id);
    const cx = (q) => q.x + q.w / 2;
    const near = (ids) => ids.reduce((best, b) => (best == null ||
      Math.abs(cx(this.pos.get(b)) - cx(p)) < Math.abs(cx(this.pos.get(best)) - cx(p)) ? b : best), null);
    const linked = (links.get(id) || []).filter((b) => this.pos.has(b) && this.itemEl(b));
    if (linked.length) return near(linked);
    const i = this.order.indexOf(id);
    return this.order[i + dir] || null;
  }

  // The nearest item on the same row to the left (dir -1) or right (1).
  beside(id, dir) {
    const p = this.pos.get(id);
    let best = null, dist = Infinity;
    for (const b of this.order) {
      const q = this.pos.get(b);
      if (b === id || q.y > p.y + p.h || q.y + q.h < p.y) continue;
      const d = (q.x - p.x) * dir;
      if (d > 0 && d < dist) { dist = d; best = b; }
    }
    return best;
  }

  focusItem(id) {
    if (!this.pos.has(id)) return;
    this.setRoving(id);
    this.ensureVisible(id);
    if (this.rovingEl) this.rovingEl.focus({ preventScroll: true });
  }

  // Pans (same zoom) so that an item is inside the pane.
  ensureVisible(id) {
    const p = this.pos.get(id);
    const r = this.svg.getBoundingClientRect();
    if (!p || !r.width) return;
    const t = this.transform;
    const x0 = t.x + p.x * t.k, y0 = t.y + p.y * t.k, x1 = x0 + p.w * t.k, y1 = y0 + p.h * t.k;
    if (x0 >= 10 && y0 >= 10 && x1 <= r.width - 10 && y1 <= r.height - 10) return;
    t.x = r.width / 2 - (p.x + p.w / 2) * t.k;
    t.y = r.height / 2 - (p.y + p.h / 2) * t.k;
    this.applyTransform();
  }

  // --- tooltip: shown on hover and on keyboard focus ---
  showTip(id) {
    const p = this.pos && this.pos.get(id);
    if (!p) return;
    this.tip.textContent = "";
    if (id.startsWith("g:")) {
      const gr = this.groups.get(id.slice(2));
      this.tip.append(h("b", {}, gr.label), `\n${this.groupSize.get(gr.id)} ops · Enter opens`);
    } else {
      const [first, ...rest] = this.describe(this.nodes[Number(id.slice(1))]);
      this.tip.append(h("b", {}, first), rest.length ? "\n" + rest.join("\n") : "");
    }
    this.tip.style.display = "";
    const t = this.transform;
    const r = this.svg.getBoundingClientRect();
    const tw = this.tip.offsetWidth, th = this.tip.offsetHeight;
    let x = t.x + (p.x + p.w) * t.k + 8, y = t.y + p.y * t.k;
    if (x + tw > r.width - 4) x = Math.max(4, t.x + p.x * t.k - tw - 8);
    y = Math.max(4, Math.min(y, r.height - th - 4));
    this.tip.style.left = `${x}px`;
    this.tip.style.top = `${y}px`;
    const el = this.itemEl(id);
    if (el) el.setAttribute("aria-describedby", this.tip.id);
  }

  hideTip() {
    if (this.tip) this.tip.style.display = "none";
  }

  scheduleTransform() {
    if (this.rafPending) return;
    this.rafPending = true;
    requestAnimationFrame(() => { this.rafPending = false; this.applyTransform(); });
  }

  applyTransform() {
    const t = this.transform;
    this.root.setAttribute("transform", `translate(${t.x},${t.y}) scale(${t.k})`);
    const low = t.k < 0.45;
    if (low !== this.lodLow) { this.lodLow = low; this.root.classList.toggle("lod-low", low); }
    this.cull();
    this.hideTip();
    this.minimap.update();
  }

  // Only what is in (or near) the viewport stays displayed: big graphs then pan and zoom at the
  // cost of what is on screen, not of the whole graph.
  cull() {
    if (!this.items || !this.items.length) return;
    if (!this.size || !this.size.w) {
      const r = this.svg.getBoundingClientRect();
      this.size = { w: r.width, h: r.height };
      if (!r.width) return;
    }
    const t = this.transform, k = t.k;
    const mx = this.size.w * 0.25 / k, my = this.size.h * 0.25 / k;
    const x0 = -t.x / k - mx, y0 = -t.y / k - my, x1 = (this.size.w - t.x) / k + mx, y1 = (this.size.h - t.y) / k + my;
    for (const it of this.items) {
      // the item Tab lands on stays, so that the keyboard can always enter the graph
      const show = (it[4] >= x0 && it[2] <= x1 && it[5] >= y0 && it[3] <= y1) || it[0] === this.rovingEl;
      if (show === it[6]) continue;
      it[6] = show;
      // an expanded group's box contains its children's, so it comes back first and stays beneath
      if (this.detach) { if (show) it[1].append(it[0]); else it[0].remove(); } else it[0].style.display = show ? "" : "none";
    }
  }

  fit() {
    const r = this.svg.getBoundingClientRect();
    let maxX = 0, maxY = 0;
    for (const p of this.pos.values()) { maxX = Math.max(maxX, p.x + p.w); maxY = Math.max(maxY, p.y + p.h); }
    if (!maxX) return;
    if (!r.width) { this.needsFit = true; return; }
    // whole graph when it fits at a readable size (>= 0.6); else as wide as the pane allows (at most
    // 1:1) from the top, to be panned down: a tall graph shrunk to 0.6 in a narrow pane is unreadable
    const kw = (r.width - 30) / maxX, kh = (r.height - 40) / maxY;
    const k = Math.max(0.02, kh >= 0.6 ? Math.min(1, kw, kh) : Math.min(1, kw));
    this.transform = { k, x: Math.max(10, (r.width - maxX * k) / 2), y: 30 };
    this.applyTransform();
  }

  centerOn(nodeId) {
    if (!this.pos) { this.pendingCenter = nodeId; return; } // not laid out yet: centered once drawn
    const p = this.pos.get(this.visibleOf(nodeId));
    if (!p) return;
    const r = this.svg.getBoundingClientRect();
    if (!r.width) { this.pendingCenter = nodeId; return; }
    const k = Math.min(ZOOM_MAX, Math.max(this.transform.k, 0.6));
    this.transform = { k, x: r.width / 2 - (p.x + p.w / 2) * k, y: r.height / 2 - (p.y + p.h / 2) * k };
    this.applyTransform();
  }
}
