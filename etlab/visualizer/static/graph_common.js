// GraphView, shared part: styles, helpers, overlays and the minimap (see graph_view.js).

import { h } from "./elements.js";

export const DETACH_ABOVE = 1500; // drawn boxes (nodes + groups) above which off-screen ones leave the DOM

// --- styles --------------------------------------------------------------------------------------

const CSS = `
.etlab-gv { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--etlab-fg); display: flex;
  flex-direction: column; border: 1px solid var(--etlab-border); border-radius: 6px; background: var(--etlab-bg); }
.etlab-gv .bar { display: flex; gap: 8px; align-items: center; padding: 6px 8px; border-bottom: 1px solid var(--etlab-border);
  flex-wrap: wrap; }
.etlab-gv .bar input[type=search] { width: 220px; padding: 3px 6px; }
.etlab-gv .bar button, .etlab-gv .bar select { padding: 2px 8px; }
.etlab-gv .bar button, .etlab-gv .bar select, .etlab-gv .bar input[type=search] { background: var(--etlab-bg);
  color: var(--etlab-fg); border: 1px solid var(--etlab-border); border-radius: 3px; font: inherit; }
.etlab-gv .bar button:hover, .etlab-gv .bar select:hover { background: var(--etlab-hover); }
.etlab-gv .bar input[type=search]::placeholder { color: var(--etlab-fg-muted); }
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
.etlab-gv .node.ink text, .etlab-gv .group.collapsed.ink text { fill: #000; }
.etlab-gv .node:focus, .etlab-gv .group:focus { outline: none; }
.etlab-gv .node > rect.ring, .etlab-gv .group > rect.ring { fill: none !important; stroke: var(--etlab-accent) !important;
  stroke-width: 2.5 !important; stroke-dasharray: none !important; display: none; pointer-events: none; }
.etlab-gv .node:focus-visible > .ring, .etlab-gv .group:focus-visible > .ring, .etlab-gv .focus-shown > .ring { display: inline; }
.etlab-gv .sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
.etlab-gv .tip { position: absolute; z-index: 4; max-width: 340px; padding: 5px 8px; border-radius: 4px; pointer-events: none;
  background: var(--etlab-bg); color: var(--etlab-fg); border: 1px solid var(--etlab-border); box-shadow: 0 2px 6px rgba(0,0,0,.25);
  font-size: 11px; line-height: 1.35; white-space: pre-wrap; word-break: break-word; }
.etlab-gv .tip b { font-weight: 600; }
.etlab-gv canvas.minimap { position: absolute; right: 8px; bottom: 8px; z-index: 3; border: 1px solid var(--etlab-border);
  background: var(--etlab-bg); opacity: .92; cursor: crosshair; border-radius: 3px; }
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
.etlab-gv .matches button { display: block; width: 100%; text-align: left; cursor: pointer; padding: 1px 2px; border: none;
  background: none; color: var(--etlab-fg); font: inherit; }
.etlab-gv .matches button:hover { background: var(--etlab-hover); }
.etlab-gv .matches .field { color: var(--etlab-fg-muted); }
.etlab-gv button:focus-visible, .etlab-gv select:focus-visible, .etlab-gv input:focus-visible, .etlab-gv .details:focus-visible {
  outline: 2px solid var(--etlab-accent); outline-offset: 1px; }
.etlab-gv .legend { display: flex; align-items: center; gap: 4px; }
.etlab-gv .legend .ramp { width: 90px; height: 10px; border: 1px solid var(--etlab-border); }
.etlab-gv .backend-key { display: inline-flex; align-items: center; gap: 3px; }
.etlab-gv .pane-toggles { display: inline-flex; gap: 8px; align-items: center; color: var(--etlab-fg-muted); }
.etlab-gv .pane-toggles label { display: inline-flex; gap: 3px; align-items: center; cursor: pointer; }
.etlab-gv .backend-key i { width: 12px; height: 12px; border: 2.5px solid; border-radius: 3px; display: inline-block; }
`;

export function injectStyle(el) {
  if (el.querySelector("style[data-etlab-gv]")) return;
  const s = document.createElement("style");
  s.setAttribute("data-etlab-gv", "");
  s.textContent = CSS;
  el.appendChild(s);
}

// --- helpers -------------------------------------------------------------------------------------

export function shortOp(op) {
  // "aten.addmm.default" -> "addmm", "aten.relu.out" -> "relu"
  const parts = String(op).split(".");
  if (parts[0] === "aten" || parts[0] === "dim_order_ops" || parts[0] === "quantized_decomposed") return parts[1] || op;
  return op;
}

export function fmtShape(n) {
  if (!n.shapes || !n.shapes.length) return "";
  const t = n.shapes.map((sh) => "[" + sh.join(",") + "]").join(" ");
  return (n.dtypes && n.dtypes.length ? n.dtypes[0] + " " : "") + t;
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
export const rampColor = (t) => lerpStops(RAMP, t);

// diverging ramp for ratios (blue: below the center, faster; red: above, slower); 0.5 = the center
const DIVERGING = [[33, 102, 172], [146, 197, 222], [247, 247, 247], [244, 165, 130], [178, 24, 43]];
export const divergingColor = (t) => lerpStops(DIVERGING, t);

// The text color that reads on a fill: black or white, whichever contrasts more (WCAG). Either one
// keeps >= 4.58:1 on any fill; a near-black (#1b1b1b) would drop to 4.3:1 on mid oranges.
function rgbOf(color) {
  const c = String(color).trim();
  if (c[0] === "#") {
    const x = c.length === 4 ? [...c.slice(1)].map((d) => d + d) : [c.slice(1, 3), c.slice(3, 5), c.slice(5, 7)];
    return x.map((d) => parseInt(d, 16));
  }
  return (c.match(/[\d.]+/g) || [0, 0, 0]).slice(0, 3).map(Number);
}
function luminance(color) {
  const lin = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const [r, g, b] = rgbOf(color).map(lin);
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
export const lightInk = (fill) => 1.05 / (luminance(fill) + 0.05) > (luminance(fill) + 0.05) / 0.05;

export const OP_FILL = { op: "#e8eef7", control_flow: "#f3e9f7", delegate: "#fdecec", input: "#eef3e8", output: "#eef3e8" };

export const OVERLAYS = {
  none: { label: "no overlay" },
  latency: { label: "p50 latency", value: (n) => (n.latency ? n.latency.p50 : null), log: true },
  gap: { label: "numeric gap", value: (n) => n.gap, log: true },
  bytes: { label: "output bytes", value: (n) => n.bytes, log: true },
};

// --- minimap: the whole drawing small in a pane's corner with the viewport as a frame; a click or a
// drag on it pans there. Shown for big drawings (MINIMAP_ABOVE boxes) while part of them is out of view.
const MINIMAP_W = 170, MINIMAP_H = 130, MINIMAP_MIN = 24, MINIMAP_ABOVE = 30;

export class Minimap {
  constructor(pane) {
    this.pane = pane;
    this.canvas = h("canvas", { class: "minimap", "data-role": "minimap", "aria-hidden": "true",
      title: "overview: click or drag to move the view" });
    this.canvas.style.display = "none";
    this.laid = null;
    let dragging = false;
    const go = (e) => {
      const r = this.canvas.getBoundingClientRect();
      this.panTo((e.clientX - r.left - this.ox) / this.scale, (e.clientY - r.top - this.oy) / this.scale);
    };
    this.canvas.addEventListener("pointerdown", (e) => {
      if (e.button !== 0 || !this.laid) return;
      dragging = true;
      this.canvas.setPointerCapture(e.pointerId);
      e.preventDefault();
      go(e);
    });
    this.canvas.addEventListener("pointermove", (e) => { if (dragging) go(e); });
    const end = () => { dragging = false; };
    this.canvas.addEventListener("pointerup", end);
    this.canvas.addEventListener("pointercancel", end);
    this.canvas.addEventListener("wheel", (e) => e.preventDefault(), { passive: false });
  }

  // Centers the pane's view on a point of the drawing (its coordinates, not the screen's).
  panTo(gx, gy) {
    const p = this.pane, t = p.transform, size = this.viewSize();
    if (!size) return;
    t.x = size.w / 2 - gx * t.k;
    t.y = size.h / 2 - gy * t.k;
    p.applyTransform();
  }

  viewSize() {
    const p = this.pane;
    if (!p.size || !p.size.w) { const r = p.svg.getBoundingClientRect(); p.size = { w: r.width, h: r.height }; }
    return p.size.w ? p.size : null;
  }

  // The drawing's boxes, once per layout, into an image the viewport frame is drawn over.
  draw(laid) {
    this.laid = laid;
    this.boxes = Object.keys(laid.boxes).length;
    const [w, hgt] = laid.size;
    // a tall, narrow graph (a chain of ops) gets a taller map, up to half the pane
    const size = this.viewSize();
    const maxH = Math.max(MINIMAP_H, Math.min(2 * MINIMAP_H, size ? size.h / 2 : 0));
    this.scale = Math.min(MINIMAP_W / w, maxH / hgt);
    const cw = Math.max(MINIMAP_MIN, Math.ceil(w * this.scale)), ch = Math.max(MINIMAP_MIN, Math.ceil(hgt * this.scale));
    this.ox = (cw - w * this.scale) / 2; // the drawing centered in the map
    this.oy = (ch - hgt * this.scale) / 2;
    const dpr = globalThis.devicePixelRatio || 1;
    this.base = document.createElement("canvas");
    this.base.width = this.canvas.width = cw * dpr;
    this.base.height = this.canvas.height = ch * dpr;
    this.canvas.style.width = cw + "px";
    this.canvas.style.height = ch + "px";
    const ctx = this.base.getContext("2d");
    if (!ctx) return;
    ctx.setTransform(dpr * this.scale, 0, 0, dpr * this.scale, dpr * this.ox, dpr * this.oy);
    const css = getComputedStyle(this.pane.el);
    ctx.strokeStyle = css.getPropertyValue("--etlab-group-stroke").trim() || "#a9b4c2";
    ctx.lineWidth = 1 / this.scale;
    for (const [id, b] of Object.entries(laid.boxes)) {
      const el = id.startsWith("g:") ? this.pane.groupEls.get(id.slice(2)) : this.pane.nodeEls.get(Number(id.slice(1)));
      if (id.startsWith("g:") && !(el && el.classList.contains("collapsed"))) { ctx.strokeRect(b[0], b[1], b[2], b[3]); continue; }
      const rect = el && el.querySelector("rect");
      ctx.fillStyle = (rect && rect.style.fill) || "#9aa7b8";
      ctx.fillRect(b[0], b[1], b[2], b[3]);
      ctx.strokeRect(b[0], b[1], b[2], b[3]);
    }
    this.update();
  }

  // Shown when a big drawing is not all in view; the viewport frame follows pan and zoom.
  update() {
    const size = this.laid && this.viewSize();
    const t = this.pane.transform;
    const show = !!size && this.boxes > MINIMAP_ABOVE && (t.x < 0 || t.y < 0 ||
      t.x + this.laid.size[0] * t.k > size.w || t.y + this.laid.size[1] * t.k > size.h);
    this.canvas.style.display = show ? "" : "none";
    if (!show) return;
    const ctx = this.canvas.getContext("2d");
    if (!ctx) return;
    const dpr = globalThis.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    ctx.drawImage(this.base, 0, 0);
    const k = this.scale * dpr;
    ctx.strokeStyle = getComputedStyle(this.pane.el).getPropertyValue("--etlab-accent").trim() || "#0b62d6";
    ctx.lineWidth = 2 * dpr;
    ctx.strokeRect(this.ox * dpr + (-t.x / t.k) * k, this.oy * dpr + (-t.y / t.k) * k, (size.w / t.k) * k, (size.h / t.k) * k);
  }
}
