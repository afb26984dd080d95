// Talking to etlab's jupyter_server extension (etlab/jupyter): JSON endpoints under /etlab/api and
// the shared view modules under /etlab/modules. Requests carry the server's token (ServerConnection).

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { IErrorReply } from './contract';

const settings = ServerConnection.makeSettings();

/** An error the server answered as {"error": message} (a bad file, a path outside the root, ...). */
export class EtlabError extends Error {}

export function apiUrl(endpoint: string, params: Record<string, string | null | undefined>): string {
  const query = Object.entries(params)
    .filter(([, v]) => v !== null && v !== undefined && v !== '')
    .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v as string)}`)
    .join('&');
  return URLExt.join(settings.baseUrl, 'etlab', endpoint) + (query ? `?${query}` : '');
}

/** GET (or POST) an endpoint; the parsed JSON, or EtlabError with the server's message. */
export async function requestJSON<T>(
  endpoint: string,
  params: Record<string, string | null | undefined> = {},
  method = 'GET'
): Promise<T> {
  const response = await ServerConnection.makeRequest(apiUrl(endpoint, params), { method }, settings);
  const text = await response.text();
  let data: unknown = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    throw new EtlabError(`etlab server extension: ${response.status} ${response.statusText} (not JSON; is the etlab server extension enabled?)`);
  }
  const failed = data as Partial<IErrorReply & { message: string }> | null;
  if (!response.ok || (failed && failed.error)) {
    throw new EtlabError((failed && (failed.error || failed.message)) || `${response.status} ${response.statusText}`);
  }
  return data as T;
}

let themeStyle: Promise<void> | null = null;

/** The views' color variables (etlab/visualizer/static/theme.css: they follow JupyterLab's theme), once per page. */
export function viewTheme(): Promise<void> {
  if (!themeStyle) {
    themeStyle = (async () => {
      const response = await ServerConnection.makeRequest(apiUrl('modules/theme.css', {}), {}, settings);
      if (!response.ok) {
        throw new EtlabError(`could not load the views' theme: ${response.status}`);
      }
      const style = document.createElement('style');
      style.setAttribute('data-etlab-theme', '');
      style.textContent = await response.text();
      document.head.append(style);
    })();
    themeStyle.catch(() => (themeStyle = null));
  }
  return themeStyle;
}

/** What a shared view module exports: anywidget's render({ model, el }) (a cleanup function, maybe). */
export interface IViewModule {
  render(view: { model: unknown; el: HTMLElement }): void | (() => void) | Promise<void | (() => void)>;
}

const modules = new Map<string, Promise<IViewModule>>();

/** A shared view module of etlab.visualizer (graph_view.js, table_view.js), imported as an ES module from
 *  its URL on the server (a strict Content-Security-Policy allows it: same origin, no blob: or eval); the
 *  modules it imports (graph_pane.js, format.js, ...) come from beside it, each once per page. */
export function viewModule(name: 'graph_view.js' | 'table_view.js'): Promise<IViewModule> {
  let p = modules.get(name);
  if (!p) {
    p = (async () => {
      await viewTheme();
      const url = apiUrl(`modules/${name}`, {});
      try {
        const mod = (await import(/* webpackIgnore: true */ url)) as { default: IViewModule };
        return mod.default;
      } catch (err) {
        throw new EtlabError(`could not load the view module ${name}: ${err instanceof Error ? err.message : String(err)}`);
      }
    })();
    p.catch(() => modules.delete(name));
    modules.set(name, p);
  }
  return p;
}
