// GraphView: placing a graph from the layout computed in Python (etlab/visualizer/_layout.py, which
// documents it). graph.layout holds, per container (root "" and each group), its items' layer, center x
// and size with every child group collapsed, the layers' order and each edge's chain of points. This
// is `compose` of _layout.py: an expanded group's box takes its container's size, boxes beside it move
// aside, later layers move down; one linear pass, no layout in the browser.

const L_LAYER_GAP = 26, L_PAD = 10, L_PAD_TOP = 28;

function placeContainer(kit, cid, expanded, out) {
  const c = kit.containers[cid];
  const items = c.items;
  const size = {};
  for (const [b, it] of Object.entries(items)) {
    if (b.startsWith("g:") && expanded.has(b.slice(2))) {
      const [cw, ch] = placeContainer(kit, b.slice(2), expanded, out);
      size[b] = [Math.max(cw + 2 * L_PAD, kit.labels[b.slice(2)] || 0), ch + L_PAD_TOP + L_PAD];
    } else size[b] = [it[2], it[3]];
  }
  const pos = {};
  const bands = [];
  let y = 0, left = Infinity, right = 0;
  for (const layer of c.layers) {
    let height = 0;
    for (const b of layer) height = Math.max(height, size[b][1]);
    const grow = layer.map((b) => size[b][0] - items[b][2]);
    const total = grow.reduce((a, g) => a + g, 0);
    let before = 0;
    layer.forEach((b, i) => {
      const g = grow[i];
      const cx = items[b][1] + before / 2 - (total - before - g) / 2;
      before += g;
      const [w, h] = size[b];
      pos[b] = [cx - w / 2, y, w, h];
      left = Math.min(left, cx - w / 2);
      right = Math.max(right, cx + w / 2);
    });
    bands.push([y, y + height]);
    y += height + L_LAYER_GAP;
  }
  if (left === Infinity) left = right = 0;
  for (const v of Object.values(pos)) v[0] -= left;
  out[cid] = { pos, bands, size: [right - left, Math.max(0, y - L_LAYER_GAP)] };
  return out[cid].size;
}

// The containers a node is drawn inside (root first) and the item it is drawn as.
function visiblePath(path, expanded, nid) {
  for (let i = 1; i < path.length; i++) if (!expanded.has(path[i])) return [path.slice(0, i), "g:" + path[i]];
  return [path, "n" + nid];
}

// {boxes: {item: [x, y, w, h]}, edges: [[source item, target item, [[x, y], ...]]], size: [w, h]}
export function composeLayout(kit, graph, groupPath, expanded) {
  const placed = {};
  placeContainer(kit, "", expanded, placed);
  const origin = { "": [L_PAD, L_PAD_TOP] };
  const boxes = {}, ports = {};
  const stack = [""];
  while (stack.length) {
    const cid = stack.pop();
    const [ox, oy] = origin[cid];
    for (const [b, [x, y, w, h]] of Object.entries(placed[cid].pos)) {
      const abs = [x + ox, y + oy, w, h];
      if (b.startsWith("in:") || b.startsWith("out:")) { ports[b + "@" + cid] = abs; continue; }
      if (b.startsWith("d")) continue;
      boxes[b] = abs;
      if (b.startsWith("g:") && expanded.has(b.slice(2))) {
        const cw = placed[b.slice(2)].size[0];
        origin[b.slice(2)] = [x + ox + (w - cw) / 2, y + oy + L_PAD_TOP];
        stack.push(b.slice(2));
      }
    }
  }
  const portX = (cid, port) => { const b = ports[port + "@" + cid]; return b ? b[0] + b[2] / 2 : null; };
  const points = (cid, chain, startX, endX) => {
    const [ox, oy] = origin[cid];
    const p = placed[cid], items = kit.containers[cid].items;
    const pts = [];
    const last = chain.length - 1;
    chain.forEach((b, k) => {
      let box;
      if (b.startsWith("in:") || b.startsWith("out:")) box = ports[b + "@" + cid];
      else if (b.startsWith("d")) box = [p.pos[b][0] + ox, 0, p.pos[b][2], 0];
      else box = boxes[b];
      const [x, y, w, h] = box;
      const band = p.bands[items[b][0]];
      const top = band[0] + oy, bottom = band[1] + oy;
      let cx = x + w / 2;
      if (b.startsWith("in:")) pts.push([cx, oy - L_PAD_TOP], [cx, bottom]);
      else if (b.startsWith("out:")) pts.push([cx, top], [cx, oy + p.size[1] + L_PAD]);
      else if (k === 0) { if (startX != null) cx = startX; pts.push([cx, y + h], [cx, bottom]); }
      else if (k === last) pts.push([endX != null ? endX : cx, top]);
      else pts.push([cx, top], [cx, bottom]);
    });
    return pts;
  };
  const edges = [];
  const seen = new Set();
  for (const [a, b] of graph.edges) {
    const [pa, va] = visiblePath(groupPath(graph.nodes[a].group), expanded, a);
    const [pb, vb] = visiblePath(groupPath(graph.nodes[b].group), expanded, b);
    if (va === vb || seen.has(va + "|" + vb)) continue;
    seen.add(va + "|" + vb);
    const child = (p, depth, v) => (depth + 1 < p.length ? "g:" + p[depth + 1] : v);
    let common = 0;
    while (common + 1 < Math.min(pa.length, pb.length) && pa[common + 1] === pb[common + 1]) common++;
    const pieces = [];
    for (let d = pa.length - 1; d > common; d--) { const c = child(pa, d, va); pieces.push([pa[d], c, "out:" + c]); }
    pieces.push([pa[common], child(pa, common, va), child(pb, common, vb)]);
    for (let d = common + 1; d < pb.length; d++) { const c = child(pb, d, vb); pieces.push([pb[d], "in:" + c, c]); }
    let line = [];
    let exitX = null;
    pieces.forEach(([cid, s, t], i) => {
      const chain = kit.containers[cid].chains[s + ">" + t];
      const forward = chain[0] === s;
      let entryX = null;
      if (i + 1 < pieces.length && pieces[i + 1][1].startsWith("in:")) entryX = portX(pieces[i + 1][0], pieces[i + 1][1]);
      const pts = points(cid, chain, forward ? exitX : null, forward ? entryX : null);
      line = line.concat(forward ? pts : pts.reverse());
      exitX = t.startsWith("out:") ? portX(cid, t) : null;
    });
    line = line.filter((q, i) => i === 0 || q[0] !== line[i - 1][0] || q[1] !== line[i - 1][1]);
    edges.push([va, vb, line]);
  }
  const [w, h] = placed[""].size;
  return { boxes, edges, size: [w + 2 * L_PAD, h + L_PAD_TOP + L_PAD] };
}
