// The JupyterLab side of the views: small HTML summaries, the run timeline and the memory-plan
// timeline (SVG), and mounting the shared graph/table modules. Colors come from JupyterLab's CSS
// variables (style/base.css), so light and dark themes both work.

import { viewModule } from './api';
import { IViewModel, viewModel } from './model';

export function h(tag: string, attrs: Record<string, any> = {}, ...children: (Node | string | null | undefined)[]): HTMLElement {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) el.append(c);
  return el;
}

const SVGNS = 'http://www.w3.org/2000/svg';
function s(tag: string, attrs: Record<string, any> = {}): SVGElement {
  const el = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  return el;
}

export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB'];
  let v = n;
  let u = 0;
  while (v >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${units[u]}`;
}

export function fmtNum(v: number | null | undefined): string {
  if (v === null || v === undefined) return '–';
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : Number.isInteger(v) ? String(v) : v.toPrecision(4);
}

/** A plain key/value or row table. */
export function table(headers: string[], rows: (string | number | Node)[][], role?: string): HTMLElement {
  const t = h('table', { class: 'jp-etlab-table', 'data-role': role });
  t.append(h('thead', {}, h('tr', {}, ...headers.map((x) => h('th', {}, x)))));
  const body = h('tbody');
  for (const r of rows) body.append(h('tr', {}, ...r.map((c) => h('td', {}, c instanceof Node ? c : String(c)))));
  t.append(body);
  return t;
}

export function section(title: string, ...children: (Node | null)[]): HTMLElement {
  return h('section', { class: 'jp-etlab-section' }, h('h3', {}, title), ...children);
}

// --- shared view modules ------------------------------------------------------------------------

export interface IMounted {
  model: IViewModel;
  el: HTMLElement;
}

export async function mountGraph(parent: HTMLElement, graphs: any[], options: Record<string, any>, overlay = 'none'): Promise<IMounted> {
  const mod = await viewModule('graph_view.js');
  const el = h('div', { class: 'jp-etlab-graph' });
  parent.append(el);
  const model = viewModel({ graphs, overlay, focus_target: null, selected: {}, options });
  mod.render({ model, el });
  return { model, el };
}

export async function mountTable(parent: HTMLElement, columns: any[], rows: any[], title: string, height = 320): Promise<IMounted> {
  const mod = await viewModule('table_view.js');
  const el = h('div', { class: 'jp-etlab-tablebox' });
  parent.append(el);
  const model = viewModel({ columns, rows, title, height, clicked: null });
  mod.render({ model, el });
  return { model, el };
}

// --- timelines ----------------------------------------------------------------------------------

const PALETTE = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#72b7b2', '#b279a2', '#ff9da6', '#9d755d', '#bab0ac', '#eeca3b'];

export interface ISpan {
  run: number;
  row: number;
  start: number | null;
  dur: number | null;
  name: string;
  handles: number[];
  instruction: number | null;
  delegated: boolean;
}

/** Runs as lanes, each timed event a bar from the run's start; bars carry data-instruction / data-handles. */
export function runTimeline(spans: ISpan[], unit: string, onPick: (span: ISpan) => void): HTMLElement {
  const runs = Math.max(0, ...spans.map((x) => x.run + 1));
  const end = Math.max(1e-9, ...spans.map((x) => (x.start || 0) + (x.dur || 0)));
  const lane = runs > 30 ? 8 : 16;
  const left = 60;
  const width = 900;
  const height = runs * lane + 30;
  const names = [...new Set(spans.map((x) => x.name))];
  // one picture for a screen reader (the profile table beside it holds the same events, row by row)
  const svg = s('svg', { class: 'jp-etlab-timeline', 'data-role': 'timeline', viewBox: `0 0 ${left + width + 10} ${height}`, width: '100%',
    role: 'img', 'aria-label': `timeline: ${runs} run(s), ${names.length} kinds of event, ${fmtNum(end)} ${unit} from each run's start` });
  for (let r = 0; r < runs; r++) {
    if (runs <= 30 || r % 5 === 0) {
      const t = s('text', { x: left - 6, y: r * lane + lane * 0.75, 'text-anchor': 'end', class: 'lbl' });
      t.textContent = `run ${r}`;
      svg.append(t);
    }
  }
  for (const sp of spans) {
    if (sp.start === null || sp.dur === null) continue;
    const rect = s('rect', {
      x: left + (sp.start / end) * width,
      y: sp.run * lane + 1,
      width: Math.max(0.5, (sp.dur / end) * width),
      height: lane - 2,
      fill: PALETTE[names.indexOf(sp.name) % PALETTE.length],
      class: 'span' + (sp.delegated ? ' delegated' : ''),
      'data-instruction': sp.instruction ?? '',
      'data-handles': sp.handles.join(',')
    });
    const title = s('title');
    title.textContent = `${sp.name} · run ${sp.run} · ${fmtNum(sp.start)} + ${fmtNum(sp.dur)} ${unit}`;
    rect.append(title);
    rect.addEventListener('click', () => onPick(sp));
    svg.append(rect);
  }
  const axis = s('text', { x: left + width, y: height - 8, 'text-anchor': 'end', class: 'lbl' });
  axis.textContent = `${fmtNum(end)} ${unit} from each run's start`;
  svg.append(axis);
  const box = h('div', { class: 'jp-etlab-scroll' });
  box.append(svg);
  return box;
}

export interface IBlock {
  value: number;
  memory_id: number;
  offset: number;
  size: number;
  first: number;
  last: number;
  shape: number[];
  dtype: string;
}

/** The memory plan: per memory arena, each planned tensor a box (x: the steps it is live, y: its offset). */
export function memoryPlan(blocks: IBlock[], steps: number, onPick: (b: IBlock) => void): HTMLElement {
  const box = h('div', { class: 'jp-etlab-memory', 'data-role': 'memory' });
  const ids = [...new Set(blocks.map((b) => b.memory_id))].sort((a, b) => a - b);
  if (!blocks.length) box.append(h('p', { class: 'jp-etlab-note' }, 'no planned tensors'));
  for (const id of ids) {
    const mine = blocks.filter((b) => b.memory_id === id);
    const top = Math.max(1, ...mine.map((b) => b.offset + b.size));
    const left = 70;
    const width = 880;
    const height = 220;
    const svg = s('svg', { viewBox: `0 0 ${left + width + 10} ${height + 24}`, width: '100%', 'data-memory-id': id, role: 'img',
      'aria-label': `memory plan of arena ${id}: ${mine.length} planned tensors, ${fmtBytes(top)} used, over ${steps} instruction steps` });
    const step = width / Math.max(1, steps);
    for (const b of mine) {
      const rect = s('rect', {
        x: left + b.first * step,
        y: height - ((b.offset + b.size) / top) * height,
        width: Math.max(1, (b.last - b.first + 1) * step - 1),
        height: Math.max(1, (b.size / top) * height),
        fill: PALETTE[b.value % PALETTE.length],
        class: 'block',
        'data-first': b.first,
        'data-last': b.last,
        'data-value': b.value
      });
      const title = s('title');
      title.textContent = `value ${b.value}: ${b.dtype}[${b.shape.join(', ')}] · ${fmtBytes(b.size)} at offset ${b.offset} · steps ${b.first}–${b.last}`;
      rect.append(title);
      rect.addEventListener('click', () => onPick(b));
      svg.append(rect);
    }
    const l1 = s('text', { x: left - 6, y: 12, 'text-anchor': 'end', class: 'lbl' });
    l1.textContent = fmtBytes(top);
    const l2 = s('text', { x: left + width, y: height + 18, 'text-anchor': 'end', class: 'lbl' });
    l2.textContent = `instruction step (0–${Math.max(0, steps - 1)})`;
    svg.append(l1, l2);
    box.append(h('div', { class: 'jp-etlab-sub' }, `arena ${id}: ${mine.length} planned tensors, ${fmtBytes(top)} used`), svg);
  }
  return box;
}
