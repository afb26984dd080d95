// The etlab JupyterLab extension: viewers for .pte, .etdp, .etrecord and .bpte (double-click and
// Open With), the artifacts sidebar, palette commands and a file-browser context-menu entry. The
// files are read by etlab's jupyter_server extension; this side only draws its JSON.

import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, InputDialog, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { ABCWidgetFactory, Base64ModelFactory, DocumentRegistry, DocumentWidget, IDocumentWidget } from '@jupyterlab/docregistry';
import { Contents } from '@jupyterlab/services';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { LabIcon } from '@jupyterlab/ui-components';

import { requestJSON } from './api';
import type { IArtifacts } from './contract';
import { ArtifactsPanel } from './sidebar';
import { fallbackPlugin } from './fallback';
import { ETLabViewer, ViewKind } from './viewer';

const KINDS: { kind: ViewKind; ext: string; label: string }[] = [
  { kind: 'pte', ext: '.pte', label: 'ExecuTorch program' },
  { kind: 'etdp', ext: '.etdp', label: 'ExecuTorch run (ETDump)' },
  { kind: 'etrecord', ext: '.etrecord', label: 'ExecuTorch ETRecord' },
  { kind: 'bpte', ext: '.bpte', label: 'ExecuTorch bundled program' }
];

export const etlabIcon = new LabIcon({
  name: 'etlab:icon',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<rect x="3" y="3" width="7" height="7" rx="1.5"/><rect x="14" y="14" width="7" height="7" rx="1.5"/>' +
    '<path d="M10 6.5h4.5a2 2 0 0 1 2 2V14h-1.5V8.5a.5.5 0 0 0-.5-.5H10z"/></g></svg>'
});

/** A document model that never downloads the file (fileFormat null: only its metadata is fetched):
 * the server reads the file, so a 14 MB .pte is not sent to the browser just to open its view. */
class MetadataOnlyModelFactory extends Base64ModelFactory {
  get name(): string {
    return 'etlab-metadata';
  }

  get fileFormat(): Contents.FileFormat {
    return null;
  }
}

class ViewerFactory extends ABCWidgetFactory<IDocumentWidget<ETLabViewer>, DocumentRegistry.IModel> {
  constructor(private kind: ViewKind, options: DocumentRegistry.IWidgetFactoryOptions<IDocumentWidget<ETLabViewer>>) {
    super(options);
  }

  protected createNewWidget(context: DocumentRegistry.Context): IDocumentWidget<ETLabViewer> {
    const content = new ETLabViewer({ kind: this.kind, path: context.path });
    const widget = new DocumentWidget({ content, context });
    widget.title.icon = etlabIcon;
    context.pathChanged.connect((_, p) => {
      content.path = p;
    });
    return widget;
  }
}

const COMMANDS = {
  dashboard: 'etlab:open-dashboard',
  compare: 'etlab:compare-runs',
  openWith: 'etlab:open-in-viewer',
  artifacts: 'etlab:show-artifacts'
};

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'etlab-labextension:plugin',
  description: 'Viewers for ExecuTorch .pte, .etdp, .etrecord and .bpte files, served by etlab',
  autoStart: true,
  requires: [IDefaultFileBrowser],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (app: JupyterFrontEnd, browser: IDefaultFileBrowser, palette: ICommandPalette | null, restorer: ILayoutRestorer | null) => {
    app.docRegistry.addModelFactory(new MetadataOnlyModelFactory());
    const tracker = new WidgetTracker<MainAreaWidget<ETLabViewer>>({ namespace: 'etlab' });
    for (const { kind, ext, label } of KINDS) {
      app.docRegistry.addFileType({
        name: `etlab-${kind}`, displayName: label, extensions: [ext], mimeTypes: ['application/octet-stream'],
        contentType: 'file', fileFormat: 'base64', icon: etlabIcon
      });
      app.docRegistry.addWidgetFactory(new ViewerFactory(kind, {
        name: `etlab ${kind} viewer`, label: `etlab ${label} viewer`, modelName: 'etlab-metadata',
        fileTypes: [`etlab-${kind}`], defaultFor: [`etlab-${kind}`], readOnly: true
      }));
    }

    const openPage = (options: ConstructorParameters<typeof ETLabViewer>[0], title: string) => {
      const content = new ETLabViewer(options);
      const widget = new MainAreaWidget({ content });
      widget.id = `etlab-${options.kind}-${Date.now()}`;
      widget.title.label = title;
      widget.title.icon = etlabIcon;
      widget.title.closable = true;
      app.shell.add(widget, 'main');
      void tracker.add(widget);
      app.shell.activateById(widget.id);
      return widget;
    };

    const listRuns = async (): Promise<{ runs: string[]; programs: string[]; ptes: string[] }> => {
      const d = await requestJSON<IArtifacts>('api/artifacts', { folder: browser.model.path });
      const files = d.groups.flatMap((g) => g.files);
      return {
        runs: files.filter((f) => f.kind === 'etdp').map((f) => f.path),
        programs: files.filter((f) => f.kind === 'etrecord' || f.kind === 'pte').map((f) => f.path),
        ptes: files.filter((f) => f.kind === 'pte').map((f) => f.path)
      };
    };

    app.commands.addCommand(COMMANDS.dashboard, {
      label: (args) => (args.path ? 'etlab: open dashboard' : 'etlab: open dashboard for…'),
      caption: 'A run (.etdp) joined with its program (.etrecord or .pte): graph, profile table, timeline',
      execute: async (args) => {
        let run = (args.path as string) || '';
        let program = (args.program as string) || null;
        if (!run) {
          const { runs, programs } = await listRuns();
          const r = await InputDialog.getItem({ title: 'etlab: open dashboard for run', items: runs.length ? runs : ['(no .etdp here)'] });
          if (!r.button.accept || !r.value || !runs.includes(r.value)) return;
          run = r.value;
          const p = await InputDialog.getItem({ title: 'etlab: join with program', items: ['(find beside the run)', ...programs] });
          if (!p.button.accept) return;
          program = p.value && programs.includes(p.value) ? p.value : null;
        }
        return openPage({ kind: 'etdp', path: run, program }, `dashboard: ${run.split('/').pop()}`);
      }
    });

    app.commands.addCommand(COMMANDS.compare, {
      label: (args) => (args.a ? 'etlab: compare runs' : 'etlab: compare runs…'),
      caption: 'Per-op p50 of two runs of one program, with the ratio on the graph',
      execute: async (args) => {
        let a = (args.a as string) || '';
        let b = (args.b as string) || '';
        let program = (args.program as string) || null;
        if (!a || !b) {
          const { runs, ptes } = await listRuns();
          const first = await InputDialog.getItem({ title: 'etlab: compare runs: run A', items: runs });
          if (!first.button.accept || !first.value) return;
          const second = await InputDialog.getItem({ title: 'etlab: compare runs: run B', items: runs.filter((r) => r !== first.value) });
          if (!second.button.accept || !second.value) return;
          [a, b] = [first.value, second.value];
          program = ptes.length === 1 ? ptes[0] : null;
        }
        return openPage({ kind: 'compare', path: a, other: b, program }, `compare: ${b.split('/').pop()} / ${a.split('/').pop()}`);
      }
    });

    const selectedPath = (): string | null => {
      const item = browser.selectedItems().next();
      return !item.done && item.value.path ? item.value.path : null;
    };

    app.commands.addCommand(COMMANDS.openWith, {
      label: 'Open in etlab viewer',
      caption: 'Open this ExecuTorch file (an .etdp as the joined dashboard)',
      isVisible: () => {
        const p = selectedPath();
        return !!p && KINDS.some((k) => p.toLowerCase().endsWith(k.ext));
      },
      execute: () => {
        const p = selectedPath();
        if (!p) return;
        if (p.toLowerCase().endsWith('.etdp')) return app.commands.execute(COMMANDS.dashboard, { path: p });
        return app.commands.execute('docmanager:open', { path: p, factory: `etlab ${KINDS.find((k) => p.toLowerCase().endsWith(k.ext))!.kind} viewer` });
      }
    });
    app.contextMenu.addItem({ command: COMMANDS.openWith, selector: '.jp-DirListing-item[data-isdir="false"]', rank: 3 });

    const panel = new ArtifactsPanel(() => browser.model.path, {
      open: (path) => void app.commands.execute('docmanager:open', { path }),
      dashboard: (run, program) => void app.commands.execute(COMMANDS.dashboard, { path: run, program }),
      compare: (a, b, program) => void app.commands.execute(COMMANDS.compare, { a, b, program })
    });
    panel.title.icon = etlabIcon;
    app.shell.add(panel, 'left', { rank: 600 });
    if (restorer) restorer.add(panel, 'etlab-artifacts');
    browser.model.pathChanged.connect(() => {
      if (panel.isVisible) void panel.refresh();
    });
    app.commands.addCommand(COMMANDS.artifacts, {
      label: 'etlab: show ExecuTorch artifacts',
      execute: () => {
        app.shell.activateById(panel.id);
        return panel.refresh();
      }
    });

    if (palette) {
      for (const command of [COMMANDS.dashboard, COMMANDS.compare, COMMANDS.artifacts]) palette.addItem({ command, category: 'etlab' });
    }
  }
};

export default [plugin, fallbackPlugin];
