// The left sidebar: ExecuTorch artifacts under the file browser's current folder, grouped by
// program (same program hash), with "open dashboard" and "compare two runs" per program.

import { Widget } from '@lumino/widgets';

import { requestJSON } from './api';
import { fmtBytes, h } from './render';

export interface IArtifact {
  path: string;
  kind: string;
  size: number;
  program: string | null;
  error: string | null;
}

export interface ISidebarActions {
  open(path: string): void;
  dashboard(run: string, program: string | null): void;
  compare(a: string, b: string, program: string | null): void;
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
      const d = await requestJSON('api/artifacts', { folder });
      this.render(d);
    } catch (err: any) {
      this.list.textContent = '';
      this.list.append(h('div', { class: 'jp-etlab-error', 'data-role': 'error' }, String(err.message || err)));
    }
  }

  private render(d: any): void {
    this.list.textContent = '';
    this.list.append(h('div', { class: 'jp-etlab-note' }, `under /${d.folder}`));
    if (!d.groups.length) this.list.append(h('div', { class: 'jp-etlab-note' }, 'no .pte, .etdp, .etrecord or .bpte files here'));
    for (const g of d.groups) {
      const files: IArtifact[] = g.files;
      const runs = files.filter((f) => f.kind === 'etdp');
      const program = files.find((f) => f.kind === 'etrecord') || files.find((f) => f.kind === 'pte') || null;
      const pte = files.find((f) => f.kind === 'pte') || null;
      const box = h('div', { class: 'jp-etlab-group', 'data-program': g.program || '' },
        h('div', { class: 'jp-etlab-sub' }, g.program ? `program ${g.program}` : 'runs of no program here / unreadable'));
      const picked = new Set<string>();
      for (const f of files) {
        const check = f.kind === 'etdp' ? (h('input', { type: 'checkbox', 'data-role': 'pick-run', title: 'pick for compare' }) as HTMLInputElement) : null;
        check?.addEventListener('change', () => (check.checked ? picked.add(f.path) : picked.delete(f.path)));
        const name = h('a', { class: 'jp-etlab-file', 'data-path': f.path, title: f.error || f.path, onclick: () => this.actions.open(f.path) }, f.path);
        box.append(h('div', { class: 'jp-etlab-row' + (f.error ? ' jp-etlab-bad' : '') }, check, h('span', { class: `jp-etlab-kind k-${f.kind}` }, f.kind), name, h('span', { class: 'jp-etlab-count' }, fmtBytes(f.size))));
      }
      const buttons = h('div', { class: 'jp-etlab-actions' });
      if (runs.length) {
        buttons.append(h('button', { class: 'jp-mod-styled', 'data-role': 'open-dashboard', onclick: () => this.actions.dashboard(runs[runs.length - 1].path, program ? program.path : null) }, 'open dashboard'));
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
