// How every etlab view writes numbers and byte counts: the notebook widgets, the offline pages and the
// JupyterLab extension (labextension/src imports this file; its types are format.d.ts). One rule each,
// tested in tests/visualizer/test_front_end_format.py.

/**
 * A byte count in binary units: "512 B", "1.5 KiB", "3.0 GiB" (one decimal from KiB up; "–" for none).
 * @param {number | null | undefined} n
 * @returns {string}
 */
export function fmtBytes(n) {
  if (n === null || n === undefined || Number.isNaN(n)) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
  let v = n;
  let u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) {
    v /= 1024;
    u++;
  }
  return u === 0 ? `${v} B` : `${v.toFixed(1)} ${units[u]}`;
}

/**
 * A measured number: integers below 1e5 as they are, otherwise `digits` significant digits, and
 * exponent notation outside [1e-3, 1e5) ("–" for none or NaN).
 * @param {number | null | undefined} x
 * @param {number} [digits]
 * @returns {string}
 */
export function fmtNum(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (x === 0) return "0";
  if (!Number.isFinite(x)) return x > 0 ? "∞" : "-∞";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(digits - 1);
  return Number.isInteger(x) ? String(x) : x.toPrecision(digits);
}
