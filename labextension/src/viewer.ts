// One viewer widget for the four file types (and the dashboard / comparison pages): it asks the
// server for the file's JSON, draws it with the shared view modules, links the views on the page
// (graph node <-> profile row <-> timeline spans / memory blocks) and offers a reload when the
// file changes on disk.

import { Widget } from '@lumino/widgets';

import { requestJSON } from './api';
import type {
  IBpteView, IBundledValue, ICompareView, IDelegation, IEtdpGraphs, IEtdpView, IEtrecordView, IFocus, IGraph,
  IMethodSummary, IProfileRow, IPteView, IStat, IVerifyReport
} from './contract';
import { fmtBytes, fmtNum, h, IGraphState, IMounted, memoryPlan, mountGraph, mountTable, section, table } from './render';
import { observedSection } from './memory';
import { runTimeline } from './timeline';

export type ViewKind = 'pte' | 'etdp' | 'etrecord' | 'bpte' | 'compare';

export interface IViewerOptions {
  kind: ViewKind;
  path: string; // relative to the server root; for 'compare' the first run
  program?: string | null; // etdp: the .pte/.etrecord to join with; compare: the program
  other?: string; // compare: the second run
}

const POLL_MS = 2000;
// Graphs of more nodes start with their module groups collapsed (expand all / a click opens them):
// two compare panes of a MobileNetV2 laid out in full take seconds; collapsed, a fraction of that.
const COLLAPSE_ABOVE = 120;

export class ETLabViewer extends Widget {
  constructor(options: IViewerOptions) {
    super();
    this.options = { ...options };
    this.addClass('jp-etlab');
    this.node.setAttribute('data-etlab-kind', options.kind);
    this.bar = h('div', { class: 'jp-etlab-reload', 'data-role': 'reload-bar', style: 'display:none' },
      'The file changed on disk. ', h('button', { class: 'jp-mod-styled jp-mod-accept', 'data-role': 'reload', onclick: () => void this.load() }, 'Reload'));
    this.body = h('div', { class: 'jp-etlab-body' });
    this.node.append(this.bar, this.body);
    this.ready = new Promise((resolve) => (this.resolveReady = resolve));
  }

  readonly ready: Promise<void>;

  get path(): string {
    return this.options.path;
  }

  set path(p: string) {
    this.options.path = p;
  }

  protected onAfterAttach(): void {
    if (!this.loaded) void this.load();
    this.timer = window.setInterval(() => void this.poll(), POLL_MS);
  }

  protected onBeforeDetach(): void {
    window.clearInterval(this.timer);
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  /** (Re)reads the file on the server and draws it. */
  async load(): Promise<void> {
    this.loaded = true;
    this.bar.style.display = 'none';
    this.body.textContent = '';
    this.node.setAttribute('data-state', 'loading');
    const status = h('div', { class: 'jp-etlab-note' }, `reading ${this.options.path} …`);
    this.body.append(status);
    try {
      const o = this.options;
      const draw = async <T extends object>(data: T, page: Page<T>) => {
        this.version = 'mtime_ns' in data ? String(data.mtime_ns) : null;
        status.remove();
        await page(this, data);
      };
      const view = <T>() => requestJSON<T>(`api/view/${o.kind}`, { path: o.path, program: o.program });
      if (o.kind === 'compare') await draw(await requestJSON<ICompareView>('api/compare', { a: o.path, b: o.other, program: o.program }), comparePage);
      else if (o.kind === 'pte') await draw(await view<IPteView>(), ptePage);
      else if (o.kind === 'etdp') await draw(await view<IEtdpView>(), etdpPage);
      else if (o.kind === 'etrecord') await draw(await view<IEtrecordView>(), etrecordPage);
      else await draw(await view<IBpteView>(), bptePage);
      this.node.setAttribute('data-state', 'ready');
    } catch (err) {
      status.remove();
      this.body.append(h('div', { class: 'jp-etlab-error', 'data-role': 'error' }, errorText(err)));
      this.node.setAttribute('data-state', 'error');
    }
    this.resolveReady();
  }

  /** Offers a reload when the file's size or mtime changed. */
  private async poll(): Promise<void> {
    if (!this.version || this.options.kind === 'compare' || !this.isVisible) return;
    try {
      const st = await requestJSON<IStat>('api/stat', { path: this.options.path });
      if (st.mtime_ns !== this.version) this.bar.style.display = '';
    } catch {
      // gone or unreadable: the next load says why
    }
  }

  /** Joins the run with another program (the picker of the .etdp viewer). */
  setProgram(program: string | null): void {
    this.options.program = program;
    void this.load();
  }

  options: IViewerOptions;
  body: HTMLElement;
  private bar: HTMLElement;
  private timer = 0;
  private loaded = false;
  private version: string | null = null;
  private resolveReady: () => void = () => undefined;
}

/** What a graph view's "etlab:select" event says: the node picked. */
interface ISelectDetail {
  kind: string;
  name: string;
  handles: number[];
}

/** Calls fn with the detail of each `type` event (a CustomEvent the shared views dispatch) under el. */
function onDetail<T>(el: HTMLElement, type: 'etlab:select' | 'etlab:focus', fn: (detail: T) => void): void {
  el.addEventListener(type, (e) => fn((e as CustomEvent<T>).detail));
}

/** The graphs' panes shown at first: the first two of several. */
function shownPanes(graphs: IGraph[]): { shown?: string[] } {
  return graphs.length > 1 ? { shown: graphs.slice(0, 2).map((g) => g.kind) } : {};
}

/** An error's message for the page. */
function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

// --- linking -------------------------------------------------------------------------------------

/** Which rows/spans/blocks belong to a selected node: by instruction id (instruction graphs) or debug handles. */
interface ISelection {
  handles: number[];
  instruction: boolean; // handles are instruction ids
  label: string;
}

function matches(sel: ISelection, handles: number[], instruction: number | null): boolean {
  if (sel.instruction) return instruction !== null && sel.handles.includes(instruction);
  return handles.some((x) => sel.handles.includes(x));
}

function highlight(root: HTMLElement, selector: string, pick: (el: Element) => boolean): number {
  let n = 0;
  root.querySelectorAll(selector).forEach((el) => {
    const on = pick(el);
    el.classList.toggle('jp-etlab-hit', on);
    if (on) n++;
  });
  root.querySelectorAll(selector).forEach((el) => el.classList.toggle('jp-etlab-dim', n > 0 && !el.classList.contains('jp-etlab-hit')));
  return n;
}

function spanPick(sel: ISelection) {
  return (el: Element) => {
    const instr = el.getAttribute('data-instruction');
    const hs = (el.getAttribute('data-handles') || '').split(',').filter(Boolean).map(Number);
    return matches(sel, hs, instr === '' || instr === null ? null : Number(instr));
  };
}

// --- pages ---------------------------------------------------------------------------------------

type Page<T> = (v: ETLabViewer, data: T) => Promise<void>;

function methodsSection(methods: IMethodSummary[]): HTMLElement {
  const rows = methods.map((m) => [
    m.name, m.inputs.join(', ') || '–', m.outputs.join(', ') || '–', m.instructions,
    m.operators.map((o) => `${o.name} ×${o.calls}`).join(', ') || '–',
    m.delegates.map((d) => `${d.backend} #${d.index}`).join(', ') || '–',
    m.arena_bytes.map(fmtBytes).join(', ') || '–', fmtBytes(m.constant_bytes)
  ]);
  return section('Methods', table(['method', 'inputs', 'outputs', 'instructions', 'operators', 'delegates', 'arenas', 'constants'], rows, 'methods'));
}

/** What each backend took and why nodes were left out, grouped by category with counts (from the ETRecord). */
function delegationSection(d: IDelegation | null): HTMLElement | null {
  if (!d) return null;
  const taken = d.backends.map((b) => `${b.backend}: ${b.partitions} partition(s), ${b.nodes} node(s)`).join(' · ') || 'nothing delegated';
  const box = section(`Delegation of ${d.method} (from ${d.source}): ${taken} · ${d.left_out} node(s) left out`);
  box.setAttribute('data-role', 'delegation');
  const rows: string[][] = [];
  for (const g of d.groups) {
    for (const n of g.nodes) rows.push([g.category, n.node, n.op, n.reason, n.hint, n.source]);
  }
  for (const n of d.unexplained) rows.push(['no reason recorded', n.node, n.op, '', '', n.source]);
  const counts: (string | number)[][] = d.groups.map((g) => [g.category, g.count]);
  if (d.unexplained_count) counts.push(['no reason recorded', d.unexplained_count]);
  if (counts.length) {
    box.append(table(['left out because', 'nodes'], counts, 'refusal-groups'), table(['category', 'node', 'op', 'reason', 'what you can do', 'source line'], rows, 'refusals'));
  }
  return box;
}

const ptePage: Page<IPteView> = async (v, d) => {
  const head = h('div', { class: 'jp-etlab-head' },
    h('b', {}, d.path), ` · program v${d.version} · ${d.segments} segment(s), ${fmtBytes(d.segment_bytes)} · program hash ${d.signature}`);
  v.body.append(head, methodsSection(d.methods));
  const delegation = delegationSection(d.delegation);
  if (delegation) v.body.append(delegation);
  if (!d.graph) {
    v.body.append(h('div', { class: 'jp-etlab-note', 'data-role': 'no-methods' }, 'the program has no methods: no graph, no memory plan'));
    return;
  }
  const graphBox = section(`Instruction graph of ${d.method} (${d.graph.nodes.length} nodes)`);
  const memBox = section(`Memory plan of ${d.method} (${d.memory.length} planned tensors over ${d.steps} steps)`);
  v.body.append(graphBox, memBox);
  const graph = await mountGraph(graphBox, [d.graph], { height: 460 }, 'none');
  const mem = memoryPlan(d.memory, d.steps ?? 0, (b) => graph.model.set('focus_target', { handles: [b.first] }));
  memBox.append(mem);
  onDetail<ISelectDetail>(graph.el, 'etlab:select', (detail) => {
    const step = (detail.handles || [])[0];
    if (step === undefined) return;
    highlight(mem, 'rect.block', (el) => Number(el.getAttribute('data-first')) <= step && step <= Number(el.getAttribute('data-last')));
  });
};

async function runPanels(v: ETLabViewer, d: IEtdpView, graphs: IGraph[] | Promise<IGraph[]>, instructionGraph: boolean): Promise<void> {
  let graph: IMounted<IGraphState> | null = null;
  const graphBox = section('Graph with p50 latency');
  v.body.append(graphBox);
  const tableBox = section(`Profile (${d.rows.length} timed events, ${d.runs} run(s), ${d.unit})`);
  const filterNote = h('div', { class: 'jp-etlab-filter', 'data-role': 'filter-note', style: 'display:none' });
  tableBox.append(filterNote);
  v.body.append(tableBox);
  const tbl = await mountTable(tableBox, d.columns, d.rows, 'Operators');
  const timeBox = section('Timeline');
  v.body.append(timeBox);
  let showLive: (rows: IProfileRow[] | null) => void = () => undefined;
  const select = (sel: ISelection | null, fromGraph: boolean) => {
    const rows = sel ? d.rows.filter((r) => matches(sel, r.handles || [], r.instruction ?? null)) : d.rows;
    if (fromGraph) {
      tbl.model.set('rows', rows);
      filterNote.style.display = sel ? '' : 'none';
      filterNote.textContent = '';
      if (sel) filterNote.append(`profile rows of ${sel.label}: ${rows.length} `, h('button', { class: 'jp-mod-styled', 'data-role': 'show-all', onclick: () => select(null, true) }, 'show all'));
    }
    if (sel) highlight(timeBox, 'rect.span', spanPick(sel));
    else highlight(timeBox, 'rect.span', () => false);
    showLive(sel ? rows : null);
  };
  const focusGraph = (handles: number[], instruction: number | null, name: string | null) => {
    if (!graph) return;
    if (instructionGraph && instruction !== null) graph.model.set('focus_target', { handles: [instruction] });
    else if (handles.length || name) graph.model.set('focus_target', { name, handles });
  };
  timeBox.append(runTimeline(d.spans, d.unit, (sp) => {
    select({ handles: instructionGraph ? [sp.instruction ?? -1] : sp.handles, instruction: instructionGraph, label: sp.name }, true);
    focusGraph(sp.handles, sp.instruction, null);
  }));
  // the memory plan of the program (a .pte of it beside the run): tensors live at the selected instructions
  let mem: HTMLElement | null = null;
  if (d.memory && d.memory.length) {
    const memBox = section(`Memory plan (${d.memory_source}: ${d.memory.length} planned tensors over ${d.steps} steps)`);
    mem = memoryPlan(d.memory, d.steps ?? 0, (b) => {
      const row = d.rows.find((r) => r.instruction === b.first);
      select({ handles: instructionGraph ? [b.first] : row ? row.handles : [], instruction: instructionGraph, label: `step ${b.first}` }, true);
      focusGraph(row ? row.handles : [], b.first, null);
    });
    memBox.append(mem);
    v.body.append(memBox);
  }
  // what the run's allocation events add up to, on the same instruction axis (etlab/labextension memory.ts)
  if (d.observed_memory) {
    v.body.append(observedSection(d.observed_memory, d.steps ?? 0, (i) => {
      const row = d.rows.find((r) => r.instruction === i);
      select({ handles: instructionGraph ? [i] : row ? row.handles : [], instruction: instructionGraph, label: `instruction ${i}` }, true);
      focusGraph(row ? row.handles : [], i, null);
    }));
  }
  showLive = (rows: IProfileRow[] | null) => {
    if (!mem) return;
    const steps = new Set((rows || []).map((r) => r.instruction).filter((x): x is number => x !== null && x !== undefined));
    highlight(mem, 'rect.block', (el) => {
      const first = Number(el.getAttribute('data-first'));
      const last = Number(el.getAttribute('data-last'));
      for (const st of steps) if (first <= st && st <= last) return true;
      return false;
    });
  };
  onDetail<IFocus | null>(tbl.el, 'etlab:focus', (detail) => {
    const f: Partial<IFocus> = detail || {};
    select({ handles: instructionGraph ? [f.instruction ?? -1] : f.handles || [], instruction: instructionGraph, label: f.name || '' }, false);
    focusGraph(f.handles || [], f.instruction ?? null, f.name || null);
  });
  // the table and timeline are up: the graph (rebuilt from an ETRecord on the server) may come later
  const title = graphBox.querySelector('h3') as HTMLElement;
  const pending = h('div', { class: 'jp-etlab-note', 'data-role': 'graph-pending' }, `building the graphs of ${d.program || 'the program'} …`);
  graphBox.append(pending);
  const drawGraphs = async (gs: IGraph[]) => {
    pending.remove();
    if (!gs.length) {
      graphBox.append(h('div', { class: 'jp-etlab-note' }, d.program ? 'no graph recorded' : 'no program joined: no graph (pick one above)'));
      return;
    }
    title.textContent = `Graph${gs.length > 1 ? 's' : ''} with p50 latency (${gs.map((g) => `${g.title}: ${g.nodes.length} nodes`).join(' · ')})`;
    graph = await mountGraph(graphBox, gs, { height: 460, collapse_threshold: COLLAPSE_ABOVE, ...shownPanes(gs) }, 'latency');
    onDetail<ISelectDetail>(graph.el, 'etlab:select', (detail) => {
      select({ handles: detail.handles || [], instruction: instructionGraph, label: detail.name }, true);
    });
  };
  if (Array.isArray(graphs)) await drawGraphs(graphs);
  else {
    graphs.then(drawGraphs, (err: unknown) => {
      pending.remove();
      graphBox.append(h('div', { class: 'jp-etlab-error', 'data-role': 'graph-error' }, errorText(err)));
    });
  }
}

const etdpPage: Page<IEtdpView> = async (v, d) => {
  const picker = h('select', { 'data-role': 'program-picker', title: 'join the run with a program', 'aria-label': 'program joined with this run' }) as HTMLSelectElement;
  picker.append(h('option', { value: '' }, d.program || d.mismatch ? '(no program)' : '(no program found beside it)'));
  for (const p of d.programs || []) picker.append(h('option', { value: p }, p));
  picker.value = d.program || (d.mismatch ? v.options.program || '' : '');
  picker.addEventListener('change', () => v.setProgram(picker.value || null));
  v.body.append(h('div', { class: 'jp-etlab-head' }, h('b', {}, d.path), ` · ${d.blocks.length} run block(s) · joined with `, picker));
  if (d.mismatch) v.body.append(h('div', { class: 'jp-etlab-error', 'data-role': 'mismatch' }, d.mismatch));
  else if (!d.program && (d.candidates || []).length) {
    v.body.append(h('div', { class: 'jp-etlab-note', 'data-role': 'unpaired' }, `none of ${d.candidates.join(', ')} is the program of this run`));
  }
  // the summary first (times in ms), then the graph: the blocks as written in the file close the page
  const sm = d.summary;
  v.body.append(h('div', { class: 'jp-etlab-head', 'data-role': 'run-summary' },
    sm.runs ? `${sm.runs} run(s) · run length p50 ${fmtNum(sm.p50)} ${sm.unit} (min ${fmtNum(sm.min)}, max ${fmtNum(sm.max)})` : 'no timed runs',
    ` · ${d.rows.length} timed events`));
  const graphs = d.graphs_pending
    ? requestJSON<IEtdpGraphs>('api/view/etdp', { path: d.path, program: d.program, part: 'graphs' }).then((g) => g.graphs)
    : d.graphs || [];
  await runPanels(v, d, graphs, d.paired === 'pte');
  const blocks = h('details', { class: 'jp-etlab-section', 'data-role': 'run-blocks' }, h('summary', {}, `Run blocks as written in the file (${d.blocks.length})`),
    table(['block', 'events', 'profile events', 'debug events', 'span (ticks)'],
      d.blocks.map((b) => [b.name, b.events, b.profile_events, b.debug_events, b.span_ticks]), 'blocks'));
  v.body.append(blocks);
};

const etrecordPage: Page<IEtrecordView> = async (v, d) => {
  v.body.append(h('div', { class: 'jp-etlab-head' }, h('b', {}, d.path),
    ` · methods ${d.methods.join(', ')} · graphs ${d.kinds.join(', ') || 'none'} · ${d.instructions} instructions mapped · program hash ${d.signature}`));
  if (d.delegates.length) v.body.append(section('Delegates', table(['instruction', 'backend'], d.delegates.map((x) => [x.instruction, x.backend]), 'delegates')));
  const delegation = delegationSection(d.delegation);
  if (delegation) v.body.append(delegation);
  const graphBox = section(`Graphs of ${d.method}: ${d.graphs.map((g) => `${g.title} ${g.nodes.length} nodes`).join(' · ')}`);
  const layout = h('div', { class: 'jp-etlab-split' });
  const tree = h('div', { class: 'jp-etlab-tree', 'data-role': 'modules' }, h('div', { class: 'jp-etlab-sub' }, 'Module hierarchy'));
  const graphHost = h('div', { class: 'jp-etlab-grow' });
  layout.append(tree, graphHost);
  graphBox.append(layout);
  v.body.append(graphBox);
  const graph = d.graphs.length ? await mountGraph(graphHost, d.graphs, { height: 520, collapse_threshold: COLLAPSE_ABOVE, ...shownPanes(d.graphs) }) : null;
  for (const m of d.modules) {
    const row = h('div', { class: 'jp-etlab-module', 'data-module': m.id, style: `padding-left:${8 + m.depth * 14}px`, title: m.type,
      role: 'button', tabindex: 0 }, `${m.label} `, h('span', { class: 'jp-etlab-count' }, String(m.nodes)));
    row.addEventListener('click', () => {
      const search = graph?.el.querySelector('input[data-role=search]') as HTMLInputElement | null;
      if (!search) return;
      // the graph's search looks at ops and names first: a module is searched by its path
      search.value = m.kind === 'module' ? `module:${m.id}` : m.label.split(' · ').pop() || m.id;
      search.dispatchEvent(new Event('input'));
    });
    row.addEventListener('keydown', (e: KeyboardEvent) => {
      if (e.key !== 'Enter' && e.key !== ' ') return;
      e.preventDefault();
      row.click();
    });
    tree.append(row);
  }
  if (!d.modules.length) tree.append(h('div', { class: 'jp-etlab-note' }, 'no module groups'));
};

const bptePage: Page<IBpteView> = async (v, d) => {
  v.body.append(h('div', { class: 'jp-etlab-head' }, h('b', {}, d.path),
    ` · bundled program v${d.version} · embedded program ${fmtBytes(d.program_bytes)} · program hash ${d.signature}`));
  v.body.append(methodsSection(d.methods));
  const val = (x: IBundledValue) => (x.kind === 'tensor'
    ? `${x.dtype}[${(x.shape || []).join(', ')}]${x.preview && x.preview.length ? ' ' + x.preview.map((p) => fmtNum(p)).join(' ') + ' …' : ''}`
    : `${x.kind} ${x.value ?? ''}`);
  const rows: (string | number)[][] = [];
  for (const s of d.suites) for (const c of s.cases) rows.push([s.method, c.index, c.inputs.map(val).join('; '), c.expected.map(val).join('; ')]);
  v.body.append(section(`Test cases (${rows.length})`, table(['method', 'case', 'inputs', 'expected outputs'], rows, 'cases')));
  const result = h('div', { 'data-role': 'verify-result' });
  const button = h('button', { class: 'jp-mod-styled jp-mod-accept', 'data-role': 'verify' }, "Verify with etlab's runtime") as HTMLButtonElement;
  // the tolerance: |actual - expected| <= atol + rtol * |expected| per element (defaults: etlab.devtools')
  const tol = d.tolerance || { rtol: 1e-4, atol: 1e-6 };
  const field = (name: string, value: number) => h('input', {
    class: 'jp-mod-styled', 'data-role': name, type: 'text', inputmode: 'decimal', size: 8, value: String(value),
    'aria-label': `${name} (default ${value})`, title: `${name}, default ${value}`
  }) as HTMLInputElement;
  const rtol = field('rtol', tol.rtol);
  const atol = field('atol', tol.atol);
  const tolerance = h('span', { class: 'jp-etlab-tolerance' }, ' rtol ', rtol, ' atol ', atol,
    h('span', { class: 'jp-etlab-note' }, ` (an output passes where |actual − expected| ≤ atol + rtol·|expected|; defaults ${tol.rtol} / ${tol.atol})`));
  button.addEventListener('click', async () => {
    button.disabled = true;
    result.textContent = 'running the test cases on the server …';
    try {
      const r = await requestJSON<IVerifyReport>('api/verify', { path: d.path, rtol: rtol.value.trim(), atol: atol.value.trim() }, 'POST');
      result.textContent = '';
      const passed = r.cases.filter((c) => c.ok).length;
      result.append(h('div', { class: r.passed ? 'jp-etlab-ok' : 'jp-etlab-error', 'data-role': 'verdict' },
        `${passed} of ${r.cases.length} test case(s) passed at rtol ${r.rtol}, atol ${r.atol}`),
        table(['method', 'case', 'verdict', 'outputs'], r.cases.map((c) => [c.method, c.index,
          h('span', { class: c.ok ? 'jp-etlab-pass' : 'jp-etlab-fail' }, c.ok ? 'passed' : 'FAILED'), c.outputs.map((o) => o.text).join('; ')]), 'verify-cases'));
    } catch (err) {
      result.textContent = '';
      result.append(h('div', { class: 'jp-etlab-error' }, errorText(err)));
    }
    button.disabled = false;
  });
  v.body.append(section('Verification', button, tolerance, result));
};

const comparePage: Page<ICompareView> = async (v, d) => {
  v.body.append(h('div', { class: 'jp-etlab-head' }, 'Run A ', h('b', {}, d.a), ' vs run B ', h('b', {}, d.b), ` · per-op p50 (${d.unit})`));
  if (d.warning) v.body.append(h('div', { class: 'jp-etlab-warn', 'data-role': 'capture-warning' }, d.warning));
  const tableBox = section(`Per-op p50 delta (${d.rows.length} events)`);
  v.body.append(tableBox);
  const tbl = await mountTable(tableBox, d.columns, d.rows, 'B vs A');
  if (d.graphs.length) {
    const box = section(`${d.graphs[0].title} (the latency overlay shows the ratio B / A)`);
    v.body.append(box);
    const graph = await mountGraph(box, d.graphs, { height: 460 }, 'latency');
    onDetail<IFocus | null>(tbl.el, 'etlab:focus', (f) => {
      if (f && f.instruction !== null) graph.model.set('focus_target', { handles: [f.instruction] });
    });
  } else {
    v.body.append(h('div', { class: 'jp-etlab-note' }, 'no .pte of this program beside the runs: no graph overlay'));
  }
};
