// The types of format.js (hand-written: the JavaScript file is the implementation).
export function fmtBytes(n: number | null | undefined): string;
export function fmtNum(x: number | null | undefined, digits?: number): string;
export function cellText(v: unknown): string;
