// GraphView, shared part: styles, helpers and overlays (see graph_view.js).

const SVGNS = "http://www.w3.org/2000/svg";
const CHAR_W = 6.6;
const NODE_H = 34;
const GROUP_HEADER = 22;
const DETACH_ABOVE = 1500; // drawn boxes (nodes + groups) above which off-screen ones leave the DOM

// --- styles --------------------------------------------------------------------------------------

const CSS = `
.etlab-gv { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--etlab-fg); display: flex;
  flex-direction: column; border: 1px solid var(--etlab-border); border-radius: 6px; background: var(--etlab-bg); }
.etlab-gv .bar { display: flex; gap: 8px; align-items: center; padding: 6px 8px; border-bottom: 1px solid var(--etlab-border);
  flex-wrap: wrap; }
.etlab-gv .bar input[type=search] { width: 220px; padding: 3px 6px; }
.etlab-gv .bar button, .etlab-gv .bar select { padding: 2px 8px; }
.etlab-gv .status { color: var(--etlab-fg-muted); margin-left: auto; }
.etlab-gv .main { display: flex; min-height: 0; }
.etlab-gv .panes { display: flex; flex: 1; min-width: 0; }
.etlab-gv .pane { flex: 1; min-width: 0; position: relative; border-right: 1px solid var(--etlab-border); }
.etlab-gv .pane:last-child { border-right: none; }
.etlab-gv .pane-title { position: absolute; top: 4px; left: 8px; font-weight: 600; background: var(--etlab-bg); opacity: .9;
  padding: 1px 4px; border-radius: 3px; pointer-events: none; z-index: 2; }
.etlab-gv svg.canvas { width: 100%; height: 100%; display: block; cursor: grab; user-select: none; }
.etlab-gv svg.canvas.dragging { cursor: grabbing; }
.etlab-gv .node rect { stroke: #7a8899; stroke-width: 1; rx: 4; }
.etlab-gv .node text { font-size: 11px; fill: var(--etlab-node-fg); pointer-events: none; }
.etlab-gv .node text.sub { fill: var(--etlab-node-fg-muted); font-size: 10px; }
.etlab-gv .node { cursor: pointer; }
.etlab-gv .node.dark text, .etlab-gv .group.collapsed.dark text { fill: #fff; }
.etlab-gv .node.input rect, .etlab-gv .node.output rect { fill: #eef3e8; stroke: #6a8f4e; }
.etlab-gv .node.selected rect { stroke: var(--etlab-accent); stroke-width: 3; }
.etlab-gv .node.linked rect { stroke: var(--etlab-accent); stroke-width: 2.5; stroke-dasharray: 4 2; }
.etlab-gv .node.match rect { stroke: #e8a400; stroke-width: 3; }
.etlab-gv .group > rect { fill: var(--etlab-group-fill); stroke: var(--etlab-group-stroke); stroke-width: 1; rx: 6; }
.etlab-gv .group.delegate > rect { fill: rgba(255,255,255,0); stroke-width: 2.5; }
.etlab-gv .group .glabel { font-size: 11px; fill: var(--etlab-fg); cursor: pointer; }
.etlab-gv .group.collapsed > rect { fill: #e9edf3; stroke-dasharray: 5 3; cursor: pointer; }
.etlab-gv .group.collapsed .glabel { fill: var(--etlab-node-fg); }
.etlab-gv .group.collapsed.delegate > rect { stroke-dasharray: none; fill: #fbf6f6; }
.etlab-gv .group.selected > rect { stroke: var(--etlab-accent); stroke-width: 3; }
.etlab-gv .group.linked > rect { stroke: var(--etlab-accent); stroke-width: 2.5; }
.etlab-gv .edge { fill: none; stroke: var(--etlab-edge); stroke-width: 1.1; }
.etlab-gv .lod-low text { display: none; }
.etlab-gv .details { width: 300px; border-left: 1px solid var(--etlab-border); padding: 8px 10px; overflow: auto; }
.etlab-gv .details h4 { margin: 0 0 6px 0; font-size: 13px; word-break: break-all; }
.etlab-gv .details table { border-collapse: collapse; width: 100%; }
.etlab-gv .details td { vertical-align: top; padding: 2px 4px; border-bottom: 1px solid var(--etlab-border); word-break: break-word; }
.etlab-gv .details td.k { color: var(--etlab-fg-muted); white-space: nowrap; }
.etlab-gv .details pre { white-space: pre-wrap; font-size: 10px; background: var(--etlab-bg-alt); color: var(--etlab-fg); padding: 4px; max-height: 160px; overflow: auto; }
.etlab-gv .matches { max-height: 120px; overflow: auto; margin: 4px 0; }
.etlab-gv .matches div { cursor: pointer; padding: 1px 2px; }
.etlab-gv .matches div:hover { background: var(--etlab-hover); }
.etlab-gv .legend { display: flex; align-items: center; gap: 4px; }
.etlab-gv .legend .ramp { width: 90px; height: 10px; border: 1px solid var(--etlab-border); }
.etlab-gv .backend-key { display: inline-flex; align-items: center; gap: 3px; }
.etlab-gv .pane-toggles { display: inline-flex; gap: 8px; align-items: center; color: var(--etlab-fg-muted); }
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

// a color between stops (RGB triples), t in [0, 1]
function lerpStops(stops, t) {
  t = Math.max(0, Math.min(1, t));
  const x = t * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2);
  const f = x - i;
  const c = stops[i].map((v, k) => Math.round(v + (stops[i + 1][k] - v) * f));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

// sequential ramp (light yellow -> dark red)
const RAMP = [[255, 247, 188], [254, 196, 79], [236, 112, 20], [204, 76, 2], [140, 45, 4]];
const rampColor = (t) => lerpStops(RAMP, t);

// diverging ramp for ratios (blue: below the center, faster; red: above, slower); 0.5 = the center
const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
const divergingColor = (t) => lerpStops(DIVERGING, t);

const OP_FILL = { op: "#e8eef7", control_flow: "#f3e9f7", delegate: "#fdecec", input: "#eef3e8", output: "#eef3e8" };

const OVERLAYS = {
  none: { label: "no overlay" },
  latency: { label: "p50 latency", value: (n) => (n.latency ? n.latency.p50 : null), log: true },
  gap: { label: "numeric gap", value: (n) => n.gap, log: true },
  bytes: { label: "output bytes", value: (n) => n.bytes, log: true },
};
