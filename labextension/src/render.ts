// The JupyterLab side of the views: small HTML summaries, the run timeline and the memory-plan
// timeline (SVG), and mounting the shared graph/table modules. Colors come from JupyterLab's CSS
// variables (style/base.css), so light and dark themes both work.

import { viewModule } from './api';
import type { IColumn, IGraph, IMemoryBlock } from './contract';
import { h, s } from '../../etlab/visualizer/static/elements.js';
import { fmtBytes, fmtNum } from '../../etlab/visualizer/static/format.js';
import { IViewModel, viewModel } from './model';

// one implementation for the views and this extension (etlab/visualizer/static: elements.js, format.js)
export { fmtBytes, fmtNum, h, s };

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

/** Which node a graph view shows and selects (its `focus_target` trait): by name, or debug handles. */
export interface IFocusTarget {
  name?: string | null;
  handles?: number[];
  kind?: string | null;
}

/** The graph view's options trait (static/graph_view.js). */
export interface IGraphOptions {
  height?: number;
  collapse_threshold?: number;
  shown?: string[];
}

export interface IGraphState {
  graphs: IGraph[];
  overlay: string;
  focus_target: IFocusTarget | null;
  selected: Record<string, unknown>;
  options: IGraphOptions;
}

export interface ITableState<R> {
  columns: IColumn[];
  rows: R[];
  title: string;
  height: number;
  clicked: R | null;
}

export interface IMounted<S> {
  model: IViewModel<S>;
  el: HTMLElement;
}

export async function mountGraph(parent: HTMLElement, graphs: IGraph[], options: IGraphOptions, overlay = 'none'): Promise<IMounted<IGraphState>> {
  const mod = await viewModule('graph_view.js');
  const el = h('div', { class: 'jp-etlab-graph' });
  parent.append(el);
  const model = viewModel<IGraphState>({ graphs, overlay, focus_target: null, selected: {}, options });
  mod.render({ model, el });
  return { model, el };
}

export async function mountTable<R>(parent: HTMLElement, columns: IColumn[], rows: R[], title: string, height = 320): Promise<IMounted<ITableState<R>>> {
  const mod = await viewModule('table_view.js');
  const el = h('div', { class: 'jp-etlab-tablebox' });
  parent.append(el);
  const model = viewModel<ITableState<R>>({ columns, rows, title, height, clicked: null });
  mod.render({ model, el });
  return { model, el };
}

// --- the memory plan ----------------------------------------------------------------------------

const PALETTE = ['#4c78a8', '#f58518', '#54a24b', '#e45756', '#72b7b2', '#b279a2', '#ff9da6', '#9d755d', '#bab0ac', '#eeca3b'];

export type IBlock = IMemoryBlock;

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
