// The run timeline of the .etdp dashboard, as Perfetto draws a trace: one lane per run, a time axis
// in the run's unit (ms) with ticks, a legend of what the colors mean (op kinds, a backend's calls),
// and a delegate call's per-op events nested under it (a second row of the run's lane).

import type { ISpan } from './contract';
import { fmtNum, h, s } from './render';

// kind: what colors it (the op kind, or "<backend> (delegated)" / "<backend> call"); depth 1: a backend's
// event inside its DELEGATE_CALL (depth 0)
export type ITimelineSpan = ISpan;

// Op kinds take these in order of first appearance (no red: it marks delegated work); a backend's
// calls and its events share one hue, the calls lighter, so the nesting reads as one delegate.
const KIND_COLORS = ['#4c78a8', '#f58518', '#54a24b', '#72b7b2', '#b279a2', '#eeca3b', '#9d755d', '#bab0ac', '#ff9da6', '#79706e'];
const DELEGATE_COLORS = ['#e45756', '#8c564b', '#17becf'];

/** A step of 1, 2 or 5 × 10^k giving about `n` ticks over [0, end]. */
export function tickStep(end: number, n = 6): number {
  const raw = end / Math.max(1, n);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

/** Kind -> color, in order of first appearance; delegated kinds in the delegate hues. */
export function kindColors(spans: ITimelineSpan[]): Map<string, string> {
  const colors = new Map<string, string>();
  let ops = 0;
  const backends = new Map<string, string>();
  for (const sp of spans) {
    const kind = sp.kind || sp.name;
    if (colors.has(kind)) continue;
    if (sp.delegated) {
      const backend = kind.replace(/ (call|\(delegated\))$/, '');
      if (!backends.has(backend)) backends.set(backend, DELEGATE_COLORS[backends.size % DELEGATE_COLORS.length]);
      colors.set(kind, backends.get(backend) as string);
    } else {
      colors.set(kind, KIND_COLORS[ops++ % KIND_COLORS.length]);
    }
  }
  return colors;
}

/** Runs as lanes (a delegate's events on a second row under its call), a ms axis and a legend; bars
 *  carry data-instruction / data-handles for the page's linking. */
export function runTimeline(spans: ITimelineSpan[], unit: string, onPick: (span: ISpan) => void): HTMLElement {
  const runs = Math.max(0, ...spans.map((x) => x.run + 1));
  const ends = new Array(runs).fill(0);
  for (const sp of spans) if (sp.start !== null && sp.dur !== null) ends[sp.run] = Math.max(ends[sp.run], sp.start + sp.dur);
  // the x range fits a typical run (the median run, and a fifth more); a slower run (warm-up, a busy
  // machine) runs off the right edge, its length in its label
  const sorted = [...ends].sort((a, b) => a - b);
  const typical = sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 1;
  const end = Math.max(1e-9, Math.min(sorted.length ? sorted[sorted.length - 1] : 1, typical * 1.2));
  const nested = spans.some((x) => (x.depth || 0) > 0);
  const row = runs > 30 ? 6 : 14;
  const lane = row * (nested ? 2 : 1) + 2;
  const left = 110;
  const width = 880;
  const top = 22;
  const height = top + runs * lane + 8;
  const colors = kindColors(spans);
  const svg = s('svg', {
    class: 'jp-etlab-timeline', 'data-role': 'timeline', viewBox: `0 0 ${left + width + 10} ${height}`, width: '100%',
    role: 'img', 'aria-label': `timeline: ${runs} run(s), ${colors.size} kinds of event, axis in ${unit} from each run's start`
  });
  // the axis: ticks and their times along the top, a faint line down each lane
  const step = tickStep(end);
  const axis = s('g', { class: 'axis', 'data-role': 'time-axis' });
  for (let t = 0; t <= end * 1.0001; t += step) {
    const x = left + (t / end) * width;
    axis.append(s('line', { x1: x, x2: x, y1: top - 4, y2: height - 8, class: 'grid', stroke: 'var(--jp-border-color2, #ccc)', 'stroke-width': 0.5 }));
    const anchor = t === 0 ? 'start' : x > left + width - 40 ? 'end' : 'middle';
    const label = s('text', { x, y: top - 8, 'text-anchor': anchor, class: 'lbl tick' });
    label.textContent = `${String(Number(t.toPrecision(6)))} ${unit}`; // 0.05, not 0.05000
    axis.append(label);
  }
  svg.append(axis);
  for (let r = 0; r < runs; r++) {
    if (runs <= 30 || r % 5 === 0) {
      const t = s('text', { x: left - 6, y: top + r * lane + row * 0.85, 'text-anchor': 'end', class: 'lbl' });
      t.textContent = `run ${r} · ${fmtNum(ends[r])} ${unit}`;
      svg.append(t);
    }
  }
  for (const sp of spans) {
    if (sp.start === null || sp.dur === null) continue;
    // a span past the right edge (a slow run) stays drawn, as a sliver at the edge: still linked and clickable
    const off = sp.start >= end;
    const depth = sp.depth || 0;
    const kind = sp.kind || sp.name;
    const rect = s('rect', {
      x: off ? left + width - 2 : left + (sp.start / end) * width,
      y: top + sp.run * lane + depth * row + 1,
      width: off ? 2 : Math.max(0.5, (Math.min(sp.dur, end - sp.start) / end) * width),
      height: row - 1,
      fill: colors.get(kind) || KIND_COLORS[0],
      'fill-opacity': sp.delegated && depth === 0 && nested ? 0.45 : 1,
      class: 'span' + (sp.delegated ? ' delegated' : '') + (off ? ' off-edge' : ''),
      'data-instruction': sp.instruction ?? '',
      'data-handles': sp.handles.join(','),
      'data-depth': depth
    });
    const title = s('title');
    title.textContent = `${sp.name} (${kind}) · run ${sp.run} · starts at ${fmtNum(sp.start)} ${unit}, takes ${fmtNum(sp.dur)} ${unit}`;
    rect.append(title);
    rect.addEventListener('click', () => onPick(sp));
    svg.append(rect);
  }
  const legend = h('div', { class: 'jp-etlab-legend', 'data-role': 'timeline-legend', style: 'display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0;font-size:12px' });
  for (const [kind, color] of colors) {
    legend.append(h('span', { class: 'jp-etlab-key', 'data-kind': kind }, h('span', { class: 'jp-etlab-swatch', style: `display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px;background:${color}` }), kind));
  }
  if (nested) legend.append(h('span', { class: 'jp-etlab-note' }, 'a delegate call (light) holds its backend\'s per-op events (the row under it)'));
  const slow = ends.filter((e) => e > end).length;
  const note = h('div', { class: 'jp-etlab-note' }, `time from each run's start (${unit}); the axis fits the median run` +
    (slow ? `: ${slow} slower run(s) run off the right edge (their length is in the label)` : ''));
  const box = h('div', { class: 'jp-etlab-scroll' });
  box.append(svg);
  return h('div', { class: 'jp-etlab-timeline-box' }, legend, box, note);
}
