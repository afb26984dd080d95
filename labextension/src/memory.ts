// What a run observed of memory (the server's ObservedMemory: etlab's Inspector.memory_summary()), on the
// plan's instruction axis as the memory plan draws it: at each instruction of the run with the tracked peak,
// what it added above the bytes held since load (those in the title: next to the load bytes, often the method
// allocator's megabytes, a run's kilobytes would not show): bytes accumulated in the run (unplanned tensors,
// held until the next instruction with events) and the instruction's own (temporaries, delegate work),
// stacked; the other runs as ticks; then the owners and load vs run. Nothing is computed here that the server
// did not send but where to draw it.

import type { IObservedMemory } from './contract';
import { fmtBytes, h, s, section, table } from './render';

type Part = 'accumulated' | 'transient';
const PARTS: [Part, string, string][] = [
  ['accumulated', 'accumulated in the run (held until the next instruction with events)', '#f58518'],
  ['transient', "the instruction's temporaries and delegate work", '#e45756']
];
const RUN_TICK = '#4c78a8';

/** The stacked bars of the peak run and the other runs' ticks (bytes above load); a click on a bar picks its instruction. */
export function observedChart(m: IObservedMemory, steps: number, onPick: (instruction: number) => void): SVGElement {
  const peakRun = m.peak_run ?? (m.timeline.length ? m.timeline[0].run : 0);
  const n = Math.max(steps, 1 + Math.max(0, ...m.timeline.map((t) => t.instruction)));
  const top = Math.max(1, ...m.timeline.map((t) => t.bytes - m.load_bytes));
  const left = 70;
  const width = 880;
  const height = 220; // as the memory plan's (render.ts memoryPlan): the two share one axis
  const step = width / n;
  const svg = s('svg', { viewBox: `0 0 ${left + width + 10} ${height + 24}`, width: '100%', role: 'img', 'data-role': 'observed-chart',
    'aria-label': `bytes above load at each instruction of run ${peakRun}: tracked peak ${fmtBytes(m.peak_bytes)}, ${fmtBytes(m.load_bytes)} held since load` });
  const y = (bytes: number) => height - (Math.max(0, bytes) / top) * height;
  const mine = m.timeline.filter((x) => x.run === peakRun).sort((a, b) => a.instruction - b.instruction);
  const bar = (part: Part, first: number, last: number, base: number, v: number, text: string, instruction: number) => {
    const label = PARTS.find((p) => p[0] === part) as [Part, string, string];
    const rect = s('rect', { x: left + first * step, y: y(base + v), width: Math.max(1, (last - first) * step - 1), height: Math.max(1, (v / top) * height),
      fill: label[2], class: `observed ${part}`, 'data-part': part, 'data-bytes': v, 'data-instruction': instruction });
    const title = s('title');
    title.textContent = `${label[1]}: ${fmtBytes(v)} · ${text}`;
    rect.append(title);
    rect.addEventListener('click', () => onPick(instruction));
    svg.append(rect);
  };
  mine.forEach((t, k) => {
    const acc = Math.max(0, t.accumulated);
    const own = Math.max(0, t.transient);
    const next = k + 1 < mine.length ? mine[k + 1].instruction : n;
    const text = `instruction ${t.instruction} · run ${peakRun}: ${fmtBytes(t.bytes)} tracked`;
    if (acc > 0) bar('accumulated', t.instruction, next, 0, acc, text, t.instruction);
    if (own > 0) bar('transient', t.instruction, t.instruction + 1, acc, own, text, t.instruction);
  });
  // the other runs over the bars: where one ran higher or lower, its tick shows
  for (const t of m.timeline) {
    if (t.run === peakRun) continue;
    const above = t.bytes - m.load_bytes;
    const tick = s('line', { x1: left + t.instruction * step + 1, x2: left + (t.instruction + 1) * step - 2, y1: y(above), y2: y(above),
      stroke: RUN_TICK, 'stroke-width': 1.5, opacity: 0.7, class: 'observed-run', 'data-run': t.run, 'data-instruction': t.instruction });
    const title = s('title');
    title.textContent = `run ${t.run}, instruction ${t.instruction}: ${fmtBytes(t.bytes)} tracked (${fmtBytes(above)} above load)`;
    tick.append(title);
    svg.append(tick);
  }
  const l1 = s('text', { x: left - 6, y: 12, 'text-anchor': 'end', class: 'lbl' });
  l1.textContent = `+${fmtBytes(top)}`;
  const l2 = s('text', { x: left + width, y: height + 18, 'text-anchor': 'end', class: 'lbl' });
  l2.textContent = `instruction step (0–${Math.max(0, n - 1)})`;
  svg.append(l1, l2);
  return svg;
}

function legend(): HTMLElement {
  const item = (color: string, label: string) => h('span', { class: 'jp-etlab-legend-item', style: 'margin-right:12px' },
    h('span', { style: `display:inline-block;width:10px;height:10px;margin-right:4px;background:${color}` }), label);
  return h('div', { class: 'jp-etlab-legend', 'data-role': 'observed-legend' }, ...PARTS.map(([, label, color]) => item(color, label)),
    item(RUN_TICK, 'other runs'));
}

/** The section: title with the tracked peak, the chart, its legend, owners and load vs run. */
export function observedSection(m: IObservedMemory, steps: number, onPick: (instruction: number) => void): HTMLElement {
  const where = m.peak_run !== null && m.peak_instruction !== null ? ` at run ${m.peak_run}, instruction ${m.peak_instruction}` : '';
  const box = section(`Memory observed in the runs: bytes above load per instruction (tracked peak ${fmtBytes(m.peak_bytes)}${where}; ${fmtBytes(m.load_bytes)} held since load)`);
  box.setAttribute('data-role', 'observed-memory');
  const at = (r: number | null, i: number | null) => (r === null ? '–' : `run ${r}${i === null ? '' : `, instruction ${i}`}`);
  box.append(h('div', { class: 'jp-etlab-memory' }, observedChart(m, steps, onPick)), legend(),
    table(['owner', 'kind', 'at load', 'run peak', 'peak', 'where'], m.owners.map((o) => [o.owner, o.kind, fmtBytes(o.load_bytes),
      fmtBytes(o.run_peak_bytes), fmtBytes(o.peak_bytes), at(o.peak_run, o.peak_instruction)]), 'memory-owners'),
    table(['phase', 'tracked', 'RSS growth', 'peak RSS growth'], m.phases.map((p) => [p.phase, fmtBytes(p.tracked_bytes),
      fmtBytes(p.rss_bytes), fmtBytes(p.peak_rss_bytes)]), 'memory-phases'));
  return box;
}
