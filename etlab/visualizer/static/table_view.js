// TableView: a sortable, filterable table. Traits read: columns [{key, label, numeric}], rows
// [{...}], title, height. A click on a row sets `clicked` (the row) and dispatches a bubbling
// "etlab:focus" DOM event with the row's `focus` ({name, handles, kind}) for page-level glue.
// Keyboard: the rows are one Tab stop (a roving tabindex): arrows, Page Up/Down, Home/End move,
// Enter or Space picks the row as a click does; the column headers are buttons that sort.

import { cellText } from "./format.js";

const CSS = `
.etlab-tv { font: 12px system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--etlab-fg); }
.etlab-tv .bar { display: flex; gap: 8px; align-items: center; margin: 4px 0; }
.etlab-tv .bar input { width: 240px; padding: 3px 6px; }
.etlab-tv .bar .count { color: var(--etlab-fg-muted); }
.etlab-tv .scroll { overflow: auto; border: 1px solid var(--etlab-border); background: var(--etlab-bg); }
.etlab-tv table { border-collapse: collapse; min-width: 40%; }
.etlab-tv th { position: sticky; top: 0; background: var(--etlab-bg-alt); color: var(--etlab-fg); text-align: left; padding: 0;
  border-bottom: 1px solid var(--etlab-border); white-space: nowrap; }
.etlab-tv th button { all: unset; box-sizing: border-box; display: block; width: 100%; padding: 4px 8px; cursor: pointer; }
.etlab-tv th button:focus-visible, .etlab-tv .bar input:focus-visible { outline: 2px solid var(--etlab-accent); outline-offset: -2px; }
.etlab-tv tr.row:focus { outline: none; }
.etlab-tv tr.row:focus-visible { outline: 2px solid var(--etlab-accent); outline-offset: -2px; }
.etlab-tv td { padding: 3px 8px; border-bottom: 1px solid var(--etlab-border); color: var(--etlab-fg); max-width: 420px; overflow: hidden;
  text-overflow: ellipsis; white-space: nowrap; }
.etlab-tv td.num { text-align: right; font-variant-numeric: tabular-nums; }
.etlab-tv tr.row:hover { background: var(--etlab-hover); }
.etlab-tv tr.row.focusable { cursor: pointer; }
.etlab-tv tr.row.selected { background: var(--etlab-selected); }
.etlab-tv tr.row.selected td { color: var(--etlab-selected-fg); }
`;

/** A cell's full value as text (its tooltip, what the filter searches); the cell shows cellText. */
function raw(v) {
  if (v == null) return "";
  return Array.isArray(v) ? v.join(", ") : String(v);
}

function render({ model, el }) {
  if (!el.querySelector("style[data-etlab-tv]")) {
    const st = document.createElement("style");
    st.setAttribute("data-etlab-tv", "");
    st.textContent = CSS;
    el.appendChild(st);
  }
  const root = document.createElement("div");
  root.className = "etlab-tv etlab-theme";
  root.setAttribute("data-etlab-view", "table");
  el.appendChild(root);
  let sortKey = null, sortDir = 1, filter = "", selected = null;

  function draw() {
    const columns = model.get("columns") || [];
    const rows = model.get("rows") || [];
    root.textContent = "";
    const bar = document.createElement("div");
    bar.className = "bar";
    const title = document.createElement("b");
    title.textContent = model.get("title") || "";
    const input = document.createElement("input");
    input.type = "search";
    input.placeholder = "filter rows";
    input.value = filter;
    input.setAttribute("data-role", "filter");
    input.setAttribute("aria-label", `filter the rows${model.get("title") ? " of " + model.get("title") : ""}`);
    const count = document.createElement("span");
    count.className = "count";
    count.setAttribute("role", "status");
    bar.append(title, input, count);
    const scroll = document.createElement("div");
    scroll.className = "scroll";
    scroll.style.maxHeight = (model.get("height") || 360) + "px";
    const table = document.createElement("table");
    if (model.get("title")) table.setAttribute("aria-label", model.get("title"));
    const thead = document.createElement("thead");
    const hr = document.createElement("tr");
    for (const c of columns) {
      const th = document.createElement("th");
      const sortBtn = document.createElement("button");
      sortBtn.type = "button";
      sortBtn.textContent = c.label + (sortKey === c.key ? (sortDir > 0 ? " ▲" : " ▼") : "");
      th.append(sortBtn);
      th.setAttribute("data-key", c.key);
      if (sortKey === c.key) th.setAttribute("aria-sort", sortDir > 0 ? "ascending" : "descending");
      sortBtn.addEventListener("click", () => {
        sortDir = sortKey === c.key ? -sortDir : (c.numeric ? -1 : 1);
        sortKey = c.key;
        draw();
        const again = root.querySelector(`th[data-key="${CSS.escape(c.key)}"] button`);
        if (again) again.focus();
      });
      hr.append(th);
    }
    thead.append(hr);
    const tbody = document.createElement("tbody");
    table.append(thead, tbody);
    scroll.append(table);
    root.append(bar, scroll);

    const fill = () => {
      const q = filter.trim().toLowerCase();
      let shown = rows.map((r, i) => [r, i]);
      if (q) shown = shown.filter(([r]) => columns.some((c) => raw(r[c.key]).toLowerCase().includes(q)));
      if (sortKey) {
        shown.sort(([a], [b]) => {
          const x = a[sortKey], y = b[sortKey];
          if (x == null) return 1;
          if (y == null) return -1;
          return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
        });
      }
      tbody.textContent = "";
      for (const [r, i] of shown) {
        const tr = document.createElement("tr");
        tr.className = "row" + (r.focus ? " focusable" : "") + (i === selected ? " selected" : "");
        tr.setAttribute("data-row", String(i));
        tr.tabIndex = -1;
        if (i === selected) tr.setAttribute("aria-current", "true");
        for (const c of columns) {
          const td = document.createElement("td");
          if (c.numeric) td.className = "num";
          td.textContent = cellText(r[c.key]);
          td.title = raw(r[c.key]);
          tr.append(td);
        }
        tr.addEventListener("click", () => {
          selected = i;
          for (const other of tbody.querySelectorAll("tr.selected")) {
            other.classList.remove("selected");
            other.removeAttribute("aria-current");
          }
          tr.classList.add("selected");
          tr.setAttribute("aria-current", "true");
          rove(tr);
          model.set("clicked", { index: i, row: r });
          model.save_changes();
          if (r.focus) el.dispatchEvent(new CustomEvent("etlab:focus", { bubbles: true, detail: r.focus }));
        });
        tbody.append(tr);
      }
      count.textContent = `${shown.length} of ${rows.length} rows`;
      rove(tbody.querySelector("tr.row.selected") || tbody.querySelector("tr.row"));
    };
    // one row of the table is in the Tab order: the last one focused or picked (the first to start with)
    const rove = (tr) => {
      if (!tr) return;
      for (const other of tbody.querySelectorAll("tr.row[tabindex='0']")) other.tabIndex = -1;
      tr.tabIndex = 0;
    };
    tbody.addEventListener("focusin", (e) => { const tr = e.target.closest("tr.row"); if (tr) rove(tr); });
    tbody.addEventListener("keydown", (e) => {
      const tr = e.target.closest("tr.row");
      if (!tr || e.altKey || e.ctrlKey || e.metaKey) return;
      const all = [...tbody.querySelectorAll("tr.row")];
      const i = all.indexOf(tr);
      const page = Math.max(1, Math.floor(scroll.clientHeight / Math.max(1, tr.offsetHeight)) - 1);
      const to = { ArrowDown: i + 1, ArrowUp: i - 1, PageDown: i + page, PageUp: i - page, Home: 0, End: all.length - 1 }[e.key];
      if (e.key === "Enter" || e.key === " ") tr.click();
      else if (to === undefined) return;
      else {
        const next = all[Math.max(0, Math.min(all.length - 1, to))];
        rove(next);
        next.focus();
      }
      e.preventDefault();
    });
    input.addEventListener("input", () => { filter = input.value; fill(); });
    fill();
  }

  draw();
  const redraw = () => draw();
  model.on("change:rows", redraw);
  model.on("change:columns", redraw);
  return () => { model.off("change:rows", redraw); model.off("change:columns", redraw); };
}

export default { render };
