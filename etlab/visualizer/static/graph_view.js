// GraphView: one or more graphs side by side (compare mode), laid out by ELK (elkjs, vendored) in a
// web worker, drawn in SVG. The Python side prepends `const ELK_SOURCE = "...";` to this module.
//
// Model traits read: graphs (list of graph JSON), overlay, focus, options. Written: selected.
// options.shown: the kinds of graph whose panes start visible (all by default); a toolbar checkbox
// per graph shows or hides its pane, hidden panes keep their layout and selection.
// Big graphs start with every module group collapsed; a layout is computed per set of expanded
// groups, so only what is visible is laid out and drawn. Pan/zoom changes one transform.

const SVGNS = "http://www.w3.org/2000/svg";
const CHAR_W = 6.6;
const NODE_H = 34;
const GROUP_HEADER = 22;

// --- layout worker -----------------------------------------------------------------------------

let layoutEngine = null;

function makeLayoutEngine() {
  const handler = `
    const elk = new ELK();
    self.onmessage = (e) => {
      const { id, graph } = e.data;
      elk.layout(graph).then((g) => self.postMessage({ id, graph: g }),
                             (err) => self.postMessage({ id, error: String(err && err.message || err) }));
    };`;
  let worker = null;
  try {
    const url = URL.createObjectURL(new Blob([ELK_SOURCE, handler], { type: "text/javascript" }));
    worker = new Worker(url);
  } catch (err) {
    worker = null; // e.g. a webview that forbids blob workers: lay out on the main thread below
  }
  if (worker) {
    const pending = new Map();
    let next = 0;
    worker.onmessage = (e) => {
      const p = pending.get(e.data.id);
      pending.delete(e.data.id);
      if (!p) return;
      if (e.data.error) p.reject(new Error(e.data.error)); else p.resolve(e.data.graph);
    };
    worker.onerror = (e) => {
      for (const p of pending.values()) p.reject(new Error(e.message || "layout worker failed"));
      pending.clear();
    };
    return { layout: (graph) => new Promise((resolve, reject) => {
      const id = next++;
      pending.set(id, { resolve, reject });
      worker.postMessage({ id, graph });
    }) };
  }
  const scope = {};
  new Function("self", "window", "module", "exports", "define", ELK_SOURCE)(scope, undefined, undefined, undefined, undefined);
  const elk = new scope.ELK();
  return { layout: (graph) => elk.layout(graph) };
}

function engine() {
  if (!layoutEngine) layoutEngine = makeLayoutEngine();
  return layoutEngine;
}

// --- styles --------------------------------------------------------------------------------------

const CSS = `
.etlab-gv { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; display: flex;
  flex-direction: column; border: 1px solid #ddd; border-radius: 6px; background: #fff; }
.etlab-gv .bar { display: flex; gap: 8px; align-items: center; padding: 6px 8px; border-bottom: 1px solid #eee;
  flex-wrap: wrap; }
.etlab-gv .bar input[type=search] { width: 220px; padding: 3px 6px; }
.etlab-gv .bar button, .etlab-gv .bar select { padding: 2px 8px; }
.etlab-gv .status { color: #666; margin-left: auto; }
.etlab-gv .main { display: flex; min-height: 0; }
.etlab-gv .panes { display: flex; flex: 1; min-width: 0; }
.etlab-gv .pane { flex: 1; min-width: 0; position: relative; border-right: 1px solid #eee; }
.etlab-gv .pane:last-child { border-right: none; }
.etlab-gv .pane-title { position: absolute; top: 4px; left: 8px; font-weight: 600; background: rgba(255,255,255,.85);
  padding: 1px 4px; border-radius: 3px; pointer-events: none; z-index: 2; }
.etlab-gv svg.canvas { width: 100%; height: 100%; display: block; cursor: grab; user-select: none; }
.etlab-gv svg.canvas.dragging { cursor: grabbing; }
.etlab-gv .node rect { stroke: #7a8899; stroke-width: 1; rx: 4; }
.etlab-gv .node text { font-size: 11px; fill: #1b1b1b; pointer-events: none; }
.etlab-gv .node text.sub { fill: #555; font-size: 10px; }
.etlab-gv .node { cursor: pointer; }
.etlab-gv .node.dark text { fill: #fff; }
.etlab-gv .node.input rect, .etlab-gv .node.output rect { fill: #eef3e8; stroke: #6a8f4e; }
.etlab-gv .node.selected rect { stroke: #0b62d6; stroke-width: 3; }
.etlab-gv .node.linked rect { stroke: #0b62d6; stroke-width: 2.5; stroke-dasharray: 4 2; }
.etlab-gv .node.match rect { stroke: #e8a400; stroke-width: 3; }
.etlab-gv .group > rect { fill: rgba(120, 140, 170, .06); stroke: #a9b4c2; stroke-width: 1; rx: 6; }
.etlab-gv .group.delegate > rect { fill: rgba(255,255,255,0); stroke-width: 2.5; }
.etlab-gv .group .glabel { font-size: 11px; fill: #445; cursor: pointer; }
.etlab-gv .group.collapsed > rect { fill: #f1f3f7; stroke-dasharray: 5 3; cursor: pointer; }
.etlab-gv .group.collapsed.delegate > rect { stroke-dasharray: none; fill: #fbf6f6; }
.etlab-gv .group.selected > rect { stroke: #0b62d6; stroke-width: 3; }
.etlab-gv .group.linked > rect { stroke: #0b62d6; stroke-width: 2.5; }
.etlab-gv .edge { fill: none; stroke: #8a96a6; stroke-width: 1.1; }
.etlab-gv .lod-low text { display: none; }
.etlab-gv .details { width: 300px; border-left: 1px solid #eee; padding: 8px 10px; overflow: auto; }
.etlab-gv .details h4 { margin: 0 0 6px 0; font-size: 13px; word-break: break-all; }
.etlab-gv .details table { border-collapse: collapse; width: 100%; }
.etlab-gv .details td { vertical-align: top; padding: 2px 4px; border-bottom: 1px solid #f2f2f2; word-break: break-word; }
.etlab-gv .details td.k { color: #666; white-space: nowrap; }
.etlab-gv .details pre { white-space: pre-wrap; font-size: 10px; background: #f7f7f7; padding: 4px; max-height: 160px; overflow: auto; }
.etlab-gv .matches { max-height: 120px; overflow: auto; margin: 4px 0; }
.etlab-gv .matches div { cursor: pointer; padding: 1px 2px; }
.etlab-gv .matches div:hover { background: #eef4ff; }
.etlab-gv .legend { display: flex; align-items: center; gap: 4px; }
.etlab-gv .legend .ramp { width: 90px; height: 10px; border: 1px solid #ccc; }
.etlab-gv .backend-key { display: inline-flex; align-items: center; gap: 3px; }
.etlab-gv .pane-toggles { display: inline-flex; gap: 8px; align-items: center; color: #444; }
.etlab-gv .pane-toggles label { display: inline-flex; gap: 3px; align-items: center; cursor: pointer; }
.etlab-gv .backend-key i { width: 12px; height: 12px; border: 2.5px solid; border-radius: 3px; display: inline-block; }
`;

function injectStyle(el) {
  if (el.querySelector("style[data-etlab-gv]")) return;
  const s = document.createElement("style");
  s.setAttribute("data-etlab-gv", "");
  s.textContent = CSS;
  el.appendChild(s);
}

// --- helpers -------------------------------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function s(tag, attrs = {}) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function shortOp(op) {
  // "aten.addmm.default" -> "addmm", "aten.relu.out" -> "relu"
  const parts = String(op).split(".");
  if (parts[0] === "aten" || parts[0] === "dim_order_ops" || parts[0] === "quantized_decomposed") return parts[1] || op;
  return op;
}

function fmtShape(n) {
  if (!n.shapes || !n.shapes.length) return "";
  const t = n.shapes.map((sh) => "[" + sh.join(",") + "]").join(" ");
  return (n.dtypes && n.dtypes.length ? n.dtypes[0] + " " : "") + t;
}

function fmtBytes(b) {
  if (b == null) return "–";
  if (b < 1024) return b + " B";
  if (b < 1 << 20) return (b / 1024).toFixed(1) + " KiB";
  return (b / (1 << 20)).toFixed(2) + " MiB";
}

function fmtNum(x, digits = 4) {
  if (x == null || Number.isNaN(x)) return "–";
  if (x === 0) return "0";
  const a = Math.abs(x);
  return a >= 1e4 || a < 1e-3 ? x.toExponential(2) : x.toPrecision(digits);
}

// sequential color ramp (light yellow -> dark red), t in [0, 1]
const RAMP = [[255, 247, 188], [254, 196, 79], [236, 112, 20], [204, 76, 2], [140, 45, 4]];
function rampColor(t) {
  t = Math.max(0, Math.min(1, t));
  const x = t * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i;
  const c = RAMP[i].map((v, k) => Math.round(v + (RAMP[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

const OP_FILL = { op: "#e8eef7", control_flow: "#f3e9f7", delegate: "#fdecec", input: "#eef3e8", output: "#eef3e8" };

const OVERLAYS = {
  none: { label: "no overlay" },
  latency: { label: "p50 latency", value: (n) => (n.latency ? n.latency.p50 : null), log: true },
  gap: { label: "numeric gap", value: (n) => n.gap, log: true },
  bytes: { label: "output bytes", value: (n) => n.bytes, log: true },
};

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

  elkGraph() {
    const elkNodes = new Map();
    const root = { id: "root", children: [], edges: [], layoutOptions: {
      "elk.algorithm": "layered", "elk.direction": "DOWN", "elk.hierarchyHandling": "INCLUDE_CHILDREN",
      "elk.layered.spacing.nodeNodeBetweenLayers": "22", "elk.spacing.nodeNode": "14",
      "elk.layered.thoroughness": this.nodes.length > 800 ? "1" : "7",
      "elk.layered.nodePlacement.strategy": this.nodes.length > 800 ? "LINEAR_SEGMENTS" : "NETWORK_SIMPLEX",
      "elk.edgeRouting": "POLYLINE",
    } };
    const containerOf = (gid) => {
      // the ELK node holding the content of an expanded group (created on demand, parents first)
      if (gid == null) return root;
      if (elkNodes.has("g:" + gid)) return elkNodes.get("g:" + gid);
      const gr = this.groups.get(gid);
      const parent = containerOf(gr.parent);
      const node = { id: "g:" + gid, children: [], edges: [], layoutOptions: {
        "elk.padding": `[top=${GROUP_HEADER + 6},left=10,bottom=10,right=10]` } };
      parent.children.push(node);
      elkNodes.set(node.id, node);
      return node;
    };
    const leafSize = (label, sub) => Math.max(70, Math.min(260, Math.max(label.length, sub.length) * CHAR_W + 18));
    const seen = new Set();
    for (const n of this.nodes) {
      const vis = this.visibleOf(n.id);
      if (seen.has(vis)) continue;
      seen.add(vis);
      if (vis.startsWith("g:")) {
        const gid = vis.slice(2);
        const gr = this.groups.get(gid);
        const label = "▸ " + gr.label;
        const sub = `${this.groupSize.get(gid)} ops`;
        const node = { id: vis, width: leafSize(label, sub), height: NODE_H + 6 };
        containerOf(gr.parent).children.push(node);
        elkNodes.set(vis, node);
      } else {
        const label = n.kind === "op" || n.kind === "control_flow" ? shortOp(n.op) : n.name;
        const node = { id: vis, width: leafSize(label, fmtShape(n)), height: NODE_H };
        containerOf(n.group).children.push(node);
        elkNodes.set(vis, node);
      }
    }
    const edgeSet = new Set();
    for (const [a, b] of this.g.edges) {
      const va = this.visibleOf(a), vb = this.visibleOf(b);
      if (va === vb) continue;
      const key = va + "|" + vb;
      if (edgeSet.has(key)) continue;
      edgeSet.add(key);
      root.edges.push({ id: "e" + edgeSet.size, sources: [va], targets: [vb] });
    }
    return root;
  }

  async layout() {
    const key = [...this.expanded].sort().join("\n");
    if (!this.layoutCache.has(key)) {
      const t0 = performance.now();
      const result = await engine().layout(this.elkGraph());
      this.layoutCache.set(key, result);
      this.lastLayoutMs = performance.now() - t0;
    }
    return this.layoutCache.get(key);
  }

  async refresh(fit = false) {
    this.view.setStatus(`laying out ${this.g.kind}…`);
    this.el.setAttribute("data-state", "layout");
    let laid;
    try {
      laid = await this.layout();
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
      `layout ${Math.round(this.lastLayoutMs || 0)} ms`);
    this.view.paneReady(this);
  }

  draw(laid) {
    this.root.textContent = "";
    this.items = []; // [element, x0, y0, x1, y1, shown] for viewport culling
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
    const walk = (node, ox, oy) => {
      for (const c of node.children || []) {
        const x = ox + c.x, y = oy + c.y;
        this.pos.set(c.id, { x, y, w: c.width, h: c.height });
        if (c.id.startsWith("g:")) {
          const gid = c.id.slice(2);
          const gr = this.groups.get(gid);
          const collapsed = !this.expanded.has(gid);
          const ge = s("g", { class: `group ${gr.kind}${collapsed ? " collapsed" : ""}`, "data-group-id": gid,
            transform: `translate(${x},${y})` });
          const rect = s("rect", { width: c.width, height: c.height });
          if (gr.backend && colors[gr.backend]) rect.setAttribute("style", `stroke:${colors[gr.backend]}`);
          ge.append(rect);
          const label = s("text", { class: "glabel", x: 8, y: collapsed ? 15 : 15 });
          label.textContent = (collapsed ? "▸ " : "▾ ") + gr.label;
          ge.append(label);
          if (collapsed) {
            const sub = s("text", { class: "sub", x: 8, y: 30 });
            sub.textContent = `${this.groupSize.get(gid)} ops${this.groupValue(gid, overlay) != null
              ? " · " + fmtNum(this.groupValue(gid, overlay)) : ""}`;
            ge.append(sub);
            const v = this.groupValue(gid, overlay);
            if (v != null && scale) rect.setAttribute("style", (rect.getAttribute("style") || "") + `;fill:${rampColor(scale(v))}`);
            ge.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
            nodeLayer.append(ge);
          } else {
            label.addEventListener("click", (e) => { e.stopPropagation(); this.toggle(gid); });
            groupLayer.append(ge);
          }
          this.groupEls.set(gid, ge);
          this.items.push([ge, x, y, x + c.width, y + c.height, true]);
          walk(c, x, y);
        } else {
          const n = this.nodes[Number(c.id.slice(1))];
          const ne = s("g", { class: `node ${n.kind}`, "data-node-id": String(n.id), "data-node-name": n.name,
            transform: `translate(${x},${y})` });
          const rect = s("rect", { width: c.width, height: c.height });
          let fill = OP_FILL[n.kind] || OP_FILL.op;
          const v = overlay.value ? overlay.value(n) : null;
          if (overlay.value) fill = v != null && scale ? rampColor(scale(v)) : "#f4f4f4";
          if (overlay.value && v != null && scale && scale(v) > 0.62) ne.classList.add("dark");
          let style = `fill:${fill}`;
          if (n.backend && colors[n.backend]) style += `;stroke:${colors[n.backend]};stroke-width:2`;
          rect.setAttribute("style", style);
          const t1 = s("text", { x: 8, y: 14 });
          t1.textContent = n.kind === "op" || n.kind === "control_flow" ? shortOp(n.op) : n.name;
          const t2 = s("text", { class: "sub", x: 8, y: 27 });
          t2.textContent = v != null ? fmtNum(v) + (this.view.overlay === "latency" ? " " + (this.g.time_unit || "")
            : this.view.overlay === "bytes" ? " B" : "") : fmtShape(n);
          const title = s("title");
          title.textContent = `${n.name}\n${n.op}${n.module ? "\n" + n.module : ""}`;
          ne.append(rect, t1, t2, title);
          ne.addEventListener("click", (e) => { e.stopPropagation(); this.view.select(this, n.id, true); });
          nodeLayer.append(ne);
          this.nodeEls.set(n.id, ne);
          this.items.push([ne, x, y, x + c.width, y + c.height, true]);
          drawn++;
        }
      }
      for (const e of node.edges || []) this.drawEdge(e, edgeLayer);
    };
    this.edgeOffsets = new Map();
    walk(laid, 0, 0);
    this.drawnNodes = drawn;
    this.svg.setAttribute("data-node-count", String(drawn));
    this.applyClasses();
    this.applyTransform();
  }

  drawEdge(e, layer) {
    // elkjs reports edge points relative to the edge's container
    let ox = 0, oy = 0;
    if (e.container && e.container !== "root" && this.pos.has(e.container)) {
      const p = this.pos.get(e.container);
      ox = p.x; oy = p.y;
    }
    for (const sec of e.sections || []) {
      const pts = [sec.startPoint, ...(sec.bendPoints || []), sec.endPoint];
      const d = pts.map((p, i) => `${i ? "L" : "M"}${(p.x + ox).toFixed(1)},${(p.y + oy).toFixed(1)}`).join(" ");
      const path = s("path", { class: "edge", d, "marker-end": `url(#arrow-${this.view.uid}-${this.index})` });
      layer.append(path);
      const xs = pts.map((p) => p.x + ox), ys = pts.map((p) => p.y + oy);
      this.items.push([path, Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys), true]);
    }
  }

  groupValue(gid, overlay) {
    if (!overlay.value) return null;
    let total = null;
    for (const n of this.nodes) {
      if (!this.groupChain(n.group).includes(gid)) continue;
      const v = overlay.value(n);
      if (v != null) total = this.view.overlay === "gap" ? Math.max(total ?? 0, v) : (total ?? 0) + v;
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
      const show = it[3] >= x0 && it[1] <= x1 && it[4] >= y0 && it[2] <= y1;
      if (show !== it[5]) { it[5] = show; it[0].style.display = show ? "" : "none"; }
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
    const p = this.pos.get(this.visibleOf(nodeId));
    if (!p) return;
    const r = this.svg.getBoundingClientRect();
    if (!r.width) { this.pendingCenter = nodeId; return; }
    const k = Math.max(this.transform.k, 0.6);
    this.transform = { k, x: r.width / 2 - (p.x + p.w / 2) * k, y: r.height / 2 - (p.y + p.h / 2) * k };
    this.applyTransform();
  }
}

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
    const graphs = this.model.get("graphs") || [];
    const height = this.options.height || 560;
    this.root = h("div", { class: "etlab-gv", "data-etlab-view": "graph" });
    const bar = h("div", { class: "bar" });
    this.overlaySel = h("select", { "data-role": "overlay", title: "color nodes by" });
    for (const [k, o] of Object.entries(OVERLAYS)) {
      const available = k === "none" || graphs.some((g) => g.nodes.some((n) => o.value(n) != null));
      const opt = h("option", { value: k }, o.label + (available ? "" : " (no data)"));
      if (!available) opt.disabled = true;
      this.overlaySel.append(opt);
    }
    this.overlaySel.value = this.overlay;
    this.overlaySel.addEventListener("change", () => this.setOverlay(this.overlaySel.value, true));
    this.search = h("input", { type: "search", placeholder: "search nodes (name, op, module)", "data-role": "search" });
    this.search.addEventListener("input", () => this.runSearch(this.search.value));
    this.search.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && this.matchList.length) this.select(this.matchList[0].pane, this.matchList[0].id, true);
    });
    const btn = (label, fn, role) => h("button", { onclick: fn, "data-role": role }, label);
    this.legend = h("span", { class: "legend" });
    this.status = h("span", { class: "status", "data-role": "status" }, "");
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
    this.details = h("div", { class: "details", "data-role": "details" }, h("div", {}, "Click a node to see its details."));
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
    // first layout once attached (sizes are known then)
    requestAnimationFrame(() => this.panes.forEach((p) => p.refresh(true)));
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
    if (!o || !o.value) return;
    const vals = [];
    for (const p of this.panes || []) for (const n of p.nodes) { const v = o.value(n); if (v != null && v > 0) vals.push(v); }
    if (!vals.length) return;
    const lo = Math.min(...vals), hi = Math.max(...vals);
    this.scaleRange = [lo, hi];
    const f = o.log ? (v) => Math.log10(Math.max(v, lo)) : (v) => v;
    const a = f(lo), b = f(hi);
    this.overlayScale = (v) => (b > a ? (f(v) - a) / (b - a) : 1);
  }

  renderLegend() {
    this.legend.textContent = "";
    if (!this.overlayScale) return;
    const ramp = h("span", { class: "ramp" });
    ramp.setAttribute("style", `background:linear-gradient(to right, ${rampColor(0)}, ${rampColor(0.5)}, ${rampColor(1)})`);
    this.legend.append(fmtNum(this.scaleRange[0]) + " ", ramp, " " + fmtNum(this.scaleRange[1]) + (OVERLAYS[this.overlay].log ? " (log)" : ""));
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

  runSearch(q) {
    q = q.trim().toLowerCase();
    this.matchList = [];
    this.matchBox.textContent = "";
    for (const p of this.panes) {
      p.matches = new Set();
      if (q) for (const n of p.nodes) {
        if (n.name.toLowerCase().includes(q) || String(n.op).toLowerCase().includes(q) || n.module.toLowerCase().includes(q)) {
          p.matches.add(n.id);
          this.matchList.push({ pane: p, id: n.id });
        }
      }
      p.applyClasses();
    }
    for (const m of this.matchList.slice(0, 50)) {
      const n = m.pane.nodes[m.id];
      this.matchBox.append(h("div", { onclick: () => this.select(m.pane, m.id, true), "data-node-name": n.name },
        `${n.name} · ${shortOp(n.op)}${n.module ? " · " + n.module : ""}${this.panes.length > 1 ? " (" + m.pane.g.kind + ")" : ""}`));
    }
    if (q) this.setStatus(`${this.matchList.length} match${this.matchList.length === 1 ? "" : "es"}`);
  }

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
