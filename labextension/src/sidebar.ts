// The left sidebar: ExecuTorch artifacts under the file browser's current folder, grouped by
// program (same program hash), with "open dashboard" and "compare two runs" per program.

import { Widget } from '@lumino/widgets';

import { requestJSON } from './api';
import type { IArtifactFile, IArtifacts } from './contract';
import { fmtBytes, h } from './render';

export type IArtifact = IArtifactFile;

export interface ISidebarActions {
  open(path: string): void;
  dashboard(run: string, program: string | null): void;
  compare(a: string, b: string, program: string | null): void;
}

function baseName(path: string): string {
  return path.slice(path.lastIndexOf('/') + 1);
}

/** A group's title: the name of its program files (model.pte, model.etrecord -> "model"), not its hash. */
export function programName(files: IArtifact[]): string {
  const stems = files.filter((f) => f.kind !== 'etdp' && !f.error).map((f) => baseName(f.path).replace(/\.[^.]+$/, ''));
  return [...new Set(stems)].join(' / ');
}

export class ArtifactsPanel extends Widget {
  constructor(private folder: () => string, private actions: ISidebarActions) {
    super();
    this.id = 'etlab-artifacts';
    this.addClass('jp-etlab');
    this.addClass('jp-etlab-sidebar');
    this.title.caption = 'ExecuTorch artifacts';
    const refresh = h('button', { class: 'jp-mod-styled', 'data-role': 'refresh', onclick: () => void this.refresh() }, 'refresh');
    this.head = h('div', { class: 'jp-etlab-sidebar-head' }, h('b', {}, 'ExecuTorch artifacts'), refresh);
    this.list = h('div', { 'data-role': 'artifact-groups' });
    this.node.append(this.head, this.list);
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  async refresh(): Promise<void> {
    const folder = this.folder();
    this.list.textContent = '';
    this.list.append(h('div', { class: 'jp-etlab-note' }, `reading ${folder || 'the root folder'} …`));
    try {
      const d = await requestJSON<IArtifacts>('api/artifacts', { folder });
      this.render(d);
    } catch (err) {
      this.list.textContent = '';
      this.list.append(h('div', { class: 'jp-etlab-error', 'data-role': 'error' }, err instanceof Error ? err.message : String(err)));
    }
  }

  private render(d: IArtifacts): void {
    this.list.textContent = '';
    this.list.append(h('div', { class: 'jp-etlab-note' }, `under /${d.folder}`));
    if (!d.groups.length) this.list.append(h('div', { class: 'jp-etlab-note' }, 'no .pte, .etdp, .etrecord or .bpte files here'));
    for (const g of d.groups) {
      const files = g.files;
      const runs = files.filter((f) => f.kind === 'etdp');
      const program = files.find((f) => f.kind === 'etrecord') || files.find((f) => f.kind === 'pte') || null;
      const pte = files.find((f) => f.kind === 'pte') || null;
      const name = programName(files);
      const title = g.program
        ? h('div', { class: 'jp-etlab-sub', 'data-role': 'group-title', title: `program hash ${g.program}` },
          h('b', {}, name || 'program'), ' ', h('span', { class: 'jp-etlab-count' }, `#${String(g.program).slice(0, 8)}`))
        : h('div', { class: 'jp-etlab-sub', 'data-role': 'group-title' }, 'runs of no program here / unreadable');
      const box = h('div', { class: 'jp-etlab-group', 'data-program': g.program || '', 'aria-label': name || 'other files' }, title);
      const picked = new Set<string>();
      for (const f of files) {
        const check = f.kind === 'etdp' ? (h('input', { type: 'checkbox', 'data-role': 'pick-run', title: 'pick for compare' }) as HTMLInputElement) : null;
        check?.addEventListener('change', () => (check.checked ? picked.add(f.path) : picked.delete(f.path)));
        const name = h('a', { class: 'jp-etlab-file', 'data-path': f.path, title: f.error || f.path, onclick: () => this.actions.open(f.path) }, f.path);
        box.append(h('div', { class: 'jp-etlab-row' + (f.error ? ' jp-etlab-bad' : '') }, check, h('span', { class: `jp-etlab-kind k-${f.kind}` }, f.kind), name, h('span', { class: 'jp-etlab-count' }, fmtBytes(f.size))));
      }
      const buttons = h('div', { class: 'jp-etlab-actions' });
      if (runs.length) {
        // the newest run (files come sorted by path; the run picked for compare wins when one is ticked)
        const latest = runs.reduce((a, b) => (b.mtime > a.mtime ? b : a));
        const which = () => (picked.size === 1 ? [...picked][0] : latest.path);
        const open = h('button', {
          class: 'jp-mod-styled', 'data-role': 'open-dashboard', 'data-run': latest.path, style: 'white-space:normal;overflow-wrap:anywhere;text-align:left;max-width:100%',
          title: `the dashboard of ${latest.path}${program ? ` joined with ${program.path}` : ''} (tick one run to pick another)`,
          onclick: () => this.actions.dashboard(which(), program ? program.path : null)
        }, `open dashboard: ${baseName(latest.path)}`);
        buttons.append(open);
        box.addEventListener('change', () => {
          const run = which();
          open.textContent = `open dashboard: ${baseName(run)}`;
          open.setAttribute('data-run', run);
        });
      }
      if (runs.length >= 2) {
        buttons.append(h('button', {
          class: 'jp-mod-styled', 'data-role': 'compare-runs',
          onclick: () => {
            const two = picked.size === 2 ? [...picked] : runs.slice(-2).map((r) => r.path);
            this.actions.compare(two[0], two[1], pte ? pte.path : null);
          }
        }, 'compare two runs'));
      }
      box.append(buttons);
      this.list.append(box);
    }
  }

  private head: HTMLElement;
  private list: HTMLElement;
}
