// Notebook outputs of etlab's views that outlive their kernel. A saved notebook keeps each view's
// output: the widget reference (application/vnd.jupyter.widget-view+json) and a static copy (text/html,
// marked data-role='widget-fallback': tables, the graph as SVG). Reopened without the kernel that made
// it, the widget manager has no such model: it writes "Loading widget..." or "Error displaying widget:
// model not found". For etlab's outputs the static copy is shown instead, until a live view appears
// (the cell run again). Other widgets are left as they are.

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import type { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import type { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

type Factory = IRenderMime.IRendererFactory & { etlabFallback?: boolean };
type Registry = IRenderMimeRegistry & { etlabFallback?: boolean };

const WIDGET_VIEW = 'application/vnd.jupyter.widget-view+json';
// What the widget manager writes while it has no model: waiting (forever, when the kernel that made it
// is gone and restoring from the new one failed) or its error once it gave up.
const NO_MODEL = /^\s*(Loading widget\.\.\.|Error displaying widget.*)\s*$/s;
const GRACE_MS = 1500; // a live view appears well within this; a saved output's model never does

function isEtlabOutput(model: IRenderMime.IMimeModel | null): boolean {
  const html = model && model.data ? model.data['text/html'] : null;
  return typeof html === 'string' && html.includes("data-role='widget-fallback'");
}

/** The copy's note says to install the widget front end: here it is installed (this renderer wraps
 *  it), only the kernel that made the view is gone, so the note says that instead. */
export const KERNEL_GONE = "This view's kernel is gone (the notebook was reopened or its kernel restarted): this is " +
  'the copy saved with it (tables, charts and the graph as images). Run the cell again for the interactive view.';

function retitle(node: HTMLElement): void {
  const notes = [...node.querySelectorAll('p')].filter((p) => p.getAttribute('data-role') === 'widget-fallback' || (p.textContent || '').includes('pip install anywidget'));
  for (const p of notes) {
    p.textContent = KERNEL_GONE;
    p.setAttribute('data-role', 'widget-fallback');
    p.setAttribute('data-reason', 'kernel-gone');
  }
}

/** The widget manager's renderer, with the output's static copy shown while it has no model. */
class FallbackRenderer extends Panel {
  private observer: MutationObserver | null = null;
  private copy: Widget | null = null;
  private timer = 0;

  constructor(private inner: IRenderMime.IRenderer, private rendermime: IRenderMimeRegistry) {
    super();
    this.addClass('jp-etlab-widget-output');
    this.addWidget(inner);
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const done = this.inner.renderModel(model);
    if (isEtlabOutput(model) && !this.observer) {
      this.timer = window.setTimeout(() => {
        this.observer = new MutationObserver(() => this.check(model));
        this.observer.observe(this.inner.node, { childList: true, characterData: true, subtree: true });
        this.check(model);
      }, GRACE_MS);
    }
    return done;
  }

  private check(model: IRenderMime.IMimeModel): void {
    const node = this.inner.node;
    const noModel = node.childElementCount === 0 && NO_MODEL.test(node.textContent || '');
    if (noModel && !this.copy) {
      const copy = this.rendermime.createRenderer('text/html');
      this.copy = copy;
      this.addWidget(copy);
      void Promise.resolve(copy.renderModel(model)).then(() => retitle(copy.node));
    }
    if (this.copy) {
      this.copy.setHidden(!noModel);
      this.inner.setHidden(noModel);
    }
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    this.observer?.disconnect();
    super.dispose();
  }
}

function wrap(factory: Factory, rendermime: IRenderMimeRegistry): Factory {
  if (!factory || factory.etlabFallback) {
    return factory;
  }
  return {
    ...factory,
    mimeTypes: factory.mimeTypes,
    safe: factory.safe,
    etlabFallback: true,
    createRenderer: (options: IRenderMime.IRendererOptions) => new FallbackRenderer(factory.createRenderer(options), rendermime)
  };
}

/** Wraps a notebook's widget renderer now, or when the widget manager registers it (either order). */
function install(rendermime: Registry | null | undefined): void {
  if (!rendermime || rendermime.etlabFallback) {
    return;
  }
  rendermime.etlabFallback = true;
  const add = rendermime.addFactory.bind(rendermime);
  rendermime.addFactory = (factory: Factory, rank?: number) =>
    add(factory && (factory.mimeTypes || []).includes(WIDGET_VIEW) ? wrap(factory, rendermime) : factory, rank);
  const current = rendermime.getFactory(WIDGET_VIEW);
  if (current) {
    const rank = rendermime.getRank(WIDGET_VIEW);
    rendermime.removeMimeType(WIDGET_VIEW);
    add(wrap(current, rendermime), rank);
  }
}

export const fallbackPlugin: JupyterFrontEndPlugin<void> = {
  id: 'etlab-labextension:widget-fallback',
  description: "Shows the static copy of an etlab view whose widget model is gone (a saved notebook reopened)",
  autoStart: true,
  activate: (app: JupyterFrontEnd) => {
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew: (panel: Widget) => {
        // a NotebookPanel: its content (the Notebook) holds the rendermime registry its outputs use
        install((panel as Widget & { content?: { rendermime?: IRenderMimeRegistry } }).content?.rendermime);
      }
    });
  }
};
