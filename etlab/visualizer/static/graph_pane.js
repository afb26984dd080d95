// GraphView, one graph pane: placement (graph_layout.js), SVG drawing, viewport culling, pan/zoom (see graph_view.js).

// --- one graph pane ------------------------------------------------------------------------------

class Pane {
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
    this.shown = view.shownKinds.has(graph.kind);
    this.build();
  }

  build() {
    this.el = h("div", { class: "pane", "data-pane": String(this.index), "data-kind": this.g.kind });
    if (!this.shown) this.el.style.display = "none";
    this.el.append(h("div", { class: "pane-title" }, `${this.g.title} · ${this.nodes.length} nodes`));
    this.svg = s("svg", { class: "canvas" });
    const defs = s("defs");
    const marker = s("marker", { id: `arrow-${this.view.uid}-${this.index}`, viewBox: "0 0 10 10", refX: "9", refY: "5",
      markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" });
    marker.append(s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#8a96a6" }));
    defs.append(marker);
    this.svg.append(defs);
    this.root = s("g", { class: "root" });
    this.svg.append(this.root);
    this.el.append(this.svg);
    this.installPanZoom();
    // laid out or selected while hidden (a closed tab, a hidden pane): fit / center once it gets a size
    this.needsFit = false;
    this.pendingCenter = null;
    if (typeof ResizeObserver !== "undefined") {
      new ResizeObserver(() => {
        this.size = null;
        this.cull();
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
          if (v != null && scale) rect.setAttribute("style", (rect.getAttribute("style") || "") + `;fill:${this.view.ramp(scale(v))}`);
          if (v != null && scale && this.view.darkAt(scale(v))) ge.classList.add("dark");
          ge.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
        } else {
          label.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
        }
        place(ge, collapsed ? nodeLayer : groupLayer, x, y, x + w, y + hgt);
        this.groupEls.set(gid, ge);
      } else {
        const n = this.nodes[Number(id.slice(1))];
        const ne = s("g", { class: `node ${n.kind}`, "data-node-id": String(n.id), "data-node-name": n.name,
          transform: `translate(${x},${y})` });
        const rect = s("rect", { width: w, height: hgt });
        let fill = OP_FILL[n.kind] || OP_FILL.op;
        const v = overlay.value ? overlay.value(n) : null;
        if (overlay.value) fill = v != null && scale ? this.view.ramp(scale(v)) : "#f4f4f4";
        if (overlay.value && v != null && scale && this.view.darkAt(scale(v))) ne.classList.add("dark");
        let style = `fill:${fill}`;
        if (n.backend && colors[n.backend]) style += `;stroke:${colors[n.backend]};stroke-width:2`;
        rect.setAttribute("style", style);
        const t1 = s("text", { x: 8, y: 14 });
        t1.textContent = n.kind === "op" || n.kind === "control_flow" ? shortOp(n.op) : n.name;
        const t2 = s("text", { class: "sub", x: 8, y: 27 });
        t2.textContent = v != null ? this.valueText(v) : fmtShape(n);
        const title = s("title");
        title.textContent = `${n.name}\n${n.op}${n.module ? "\n" + n.module : ""}`;
        ne.append(rect, t1, t2, title);
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
    this.applyClasses();
    this.applyTransform();
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
      const mx = e.clientX - r.left, my = e.clientY - r.top;
      const f = Math.exp(-e.deltaY * 0.0015);
      this.zoomAt(mx, my, f);
    }, { passive: false });
  }

  zoomAt(mx, my, f) {
    const t = this.transform;
    const k = Math.max(0.02, Math.min(4, t.k * f));
    t.x = mx - (mx - t.x) * (k / t.k);
    t.y = my - (my - t.y) * (k / t.k);
    t.k = k;
    this.scheduleTransform();
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
      const show = it[4] >= x0 && it[2] <= x1 && it[5] >= y0 && it[3] <= y1;
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
    const k = Math.max(this.transform.k, 0.6);
    this.transform = { k, x: r.width / 2 - (p.x + p.w / 2) * k, y: r.height / 2 - (p.y + p.h / 2) * k };
    this.applyTransform();
  }
}
