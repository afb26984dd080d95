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

/**
 * A table cell as every etlab table writes it (the Python side's etlab.inspector.cell_text, so a live
 * TableView, its saved static copy and the terminal's `etlab inspect` read the same): missing or NaN
 * empty; a whole number all its digits; any other number 4 significant digits as Python's "%.4g"
 * (no trailing zeros, exponent from 1e-4 down and 1e4 up: "1.235e+04"); a list its items, joined.
 * @param {unknown} v
 * @returns {string}
 */
export function cellText(v) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) return v.map((x) => (Array.isArray(x) ? `[${cellText(x)}]` : cellText(x))).join(", ");
  if (typeof v === "boolean") return v ? "True" : "False";
  if (typeof v !== "number") return String(v);
  if (Number.isNaN(v)) return "";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v); // as a Python float (JSON keeps no int type)
  const [mantissa, e] = v.toExponential(3).split("e");
  const exp = Number(e);
  const trim = (t) => (t.includes(".") ? t.replace(/0+$/, "").replace(/\.$/, "") : t);
  if (exp < -4 || exp >= 4) return `${trim(mantissa)}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  return trim(v.toFixed(3 - exp));
}
