// The little of an anywidget model the shared view modules use (get/set/on/off/save_changes), so the
// same ES modules render in the notebook, in the offline report and here. S: the traits' types.

export type Handler = () => void;

export interface IViewModel<S> {
  get<K extends keyof S>(key: K): S[K];
  set<K extends keyof S>(key: K, value: S[K]): void;
  on(event: string, fn: Handler): void;
  off(event: string, fn: Handler): void;
  save_changes(): void;
}

export function viewModel<S>(state: S): IViewModel<S> {
  const handlers: Record<string, Handler[]> = {};
  return {
    get: (k) => state[k],
    set: (k, v) => {
      state[k] = v;
      (handlers['change:' + String(k)] || []).forEach((f) => f());
    },
    on: (ev, f) => {
      (handlers[ev] = handlers[ev] || []).push(f);
    },
    off: (ev, f) => {
      handlers[ev] = (handlers[ev] || []).filter((g) => g !== f);
    },
    save_changes: () => undefined
  };
}
