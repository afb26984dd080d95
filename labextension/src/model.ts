// The little of an anywidget model the shared view modules use (get/set/on/off/save_changes), so the
// same ES modules render in the notebook, in the offline report and here.

export type Handler = () => void;

export interface IViewModel {
  get(key: string): any;
  set(key: string, value: any): void;
  on(event: string, fn: Handler): void;
  off(event: string, fn: Handler): void;
  save_changes(): void;
}

export function viewModel(state: Record<string, any>): IViewModel {
  const handlers: Record<string, Handler[]> = {};
  return {
    get: (k) => state[k],
    set: (k, v) => {
      state[k] = v;
      (handlers['change:' + k] || []).forEach((f) => f());
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
