// The types of elements.js (hand-written: the JavaScript file is the implementation).
export function h(tag: string, attrs?: Record<string, unknown>, ...children: (Node | string | number | null | undefined)[]): HTMLElement;
export function s(tag: string, attrs?: Record<string, unknown>): SVGElement;
