// Building DOM elements, for every etlab view and the JupyterLab extension (labextension/src imports
// this file; its types are elements.d.ts).

const SVGNS = "http://www.w3.org/2000/svg";

/**
 * An HTML element: attributes (null, undefined and false are left out; an "on<event>" function is
 * a listener) and children (nodes, or text; null and undefined are left out).
 * @param {string} tag
 * @param {Record<string, unknown>} [attrs]
 * @param {...(Node | string | number | null | undefined)} children
 * @returns {HTMLElement}
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), /** @type {EventListener} */ (v));
    else el.setAttribute(k, String(v));
  }
  for (const c of children) {
    if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/**
 * An SVG element with these attributes.
 * @param {string} tag
 * @param {Record<string, unknown>} [attrs]
 * @returns {SVGElement}
 */
export function s(tag, attrs = {}) {
  const el = /** @type {SVGElement} */ (document.createElementNS(SVGNS, tag));
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}
