"use strict";
// allocscope's HTML report. The data (the element #data) holds every stack root first and,
// per value, [estimate, error below, error above] (a diff: [change, below, above, width,
// base, new]); a frame sums its stacks and adds the errors in quadrature, z of them each
// side (crates/outputs/src/export/html/data.rs, node_bounds). Names from the target are set
// with textContent only.
(function () {
  const started = performance.now();
  const D = JSON.parse(document.getElementById("data").textContent);
  const DIFF = D.kind === "diff";
  const ROW = 18;
  const MIN_WIDTH = 1; // frames narrower than a pixel are not drawn
  const TABLE_ROWS = 500;
  const flame = document.getElementById("flame");
  const tooltip = document.getElementById("tooltip");
  const nodeOf = new WeakMap();
  let metric = D.first;
  let tree = null;
  let zoomPath = [];
  let term = null;
  let group = "stacks";
  let sortKey = "e";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function unit() { return D.metrics[metric].unit; }
  function fmt(v, u) {
    if (v === null || v === undefined || !isFinite(v)) return "∞";
    const sign = v < 0 ? "−" : "";
    let a = Math.abs(v);
    if (u === "count") {
      if (a >= 1e9) return sign + (a / 1e9).toFixed(2) + " G";
      if (a >= 1e6) return sign + (a / 1e6).toFixed(2) + " M";
      if (a >= 1e3) return sign + (a / 1e3).toFixed(1) + " k";
      return sign + a.toFixed(a < 10 ? 1 : 0);
    }
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (a >= 1024 && i < units.length - 1) { a /= 1024; i++; }
    const s = sign + (i ? a.toFixed(1) : a.toFixed(0)) + " " + units[i];
    return u === "bytes/s" ? s + "/s" : s;
  }
  function pct(x) { return isFinite(x) ? (100 * x).toFixed(x < 0.001 ? 3 : 1) + "%" : "–"; }
  const above = (v) => (v[2] === null ? Infinity : v[2]);
  const width = (v) => (DIFF ? v[3] : Math.max(0, v[0]));

  // The tree of the current value: every frame sums the stacks through it.
  function blank(name, parent, fi) {
    return { name, parent, fi, kids: new Map(), w: 0, e: 0, b2: 0, a2: 0, s: 0, base: 0, neu: 0, stacks: 0 };
  }
  function add(n, v, st) {
    n.w += width(v); n.e += v[0]; n.b2 += v[1] * v[1];
    const a = above(v); n.a2 += a * a; n.s += st.s; n.stacks += 1;
    if (DIFF) { n.base += v[4]; n.neu += v[5]; }
  }
  function build() {
    const root = blank("all", null, -1);
    for (const st of D.stacks) {
      const v = st.v[metric];
      if (!v) continue;
      let n = root;
      add(n, v, st);
      for (const f of st.f) {
        let c = n.kids.get(f);
        if (!c) { c = blank(D.frames[f], n, f); n.kids.set(f, c); }
        add(c, v, st);
        n = c;
      }
    }
    return root;
  }
  function bounds(n) {
    const lo = n.e - D.z * Math.sqrt(n.b2);
    return [D.metrics[metric].signed ? lo : Math.max(0, lo), n.e + D.z * Math.sqrt(n.a2)];
  }
  function significance(n) {
    const [lo, hi] = bounds(n);
    return lo > 0 ? 1 : hi < 0 ? -1 : 0;
  }
  function hue(name) {
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    return h;
  }
  function colour(n) {
    if (DIFF) {
      const s = significance(n);
      if (s === 0) return null;
      const base = Math.max(n.base, 1e-9);
      const strength = Math.min(1, Math.abs(n.e) / base);
      const light = 85 - 35 * strength;
      return s > 0 ? `hsl(0, 80%, ${light}%)` : `hsl(215, 80%, ${light}%)`;
    }
    const h = hue(n.name);
    return `hsl(${10 + (h % 45)}, ${70 + (h % 20)}%, ${55 + ((h >> 8) % 15)}%)`;
  }
  function isWide(n) {
    if (DIFF || n.e <= 0) return false;
    const [lo, hi] = bounds(n);
    return hi > 2 * n.e || lo < n.e / 2;
  }

  function zoomed() {
    let n = tree;
    for (const name of zoomPath) {
      const next = [...n.kids.values()].find((k) => k.name === name);
      if (!next) { zoomPath = []; return tree; }
      n = next;
    }
    return n;
  }
  function pathOf(n) {
    const names = [];
    for (let m = n; m && m.parent; m = m.parent) names.unshift(m.name);
    return names;
  }
  function box(n, x, w, depth, ancestor) {
    const d = el("div", "frame", n.name);
    d.style.left = x + "px";
    d.style.width = w + "px";
    d.style.top = depth * ROW + "px";
    const c = colour(n);
    if (c) d.style.backgroundColor = c; else d.classList.add("unchanged");
    if (ancestor) d.classList.add("ancestor");
    if (isWide(n)) d.classList.add("wide");
    if (term && term.test(n.name)) d.classList.add("match");
    const [lo, hi] = bounds(n);
    d.dataset.name = n.name;
    d.dataset.value = n.w;
    d.dataset.estimate = n.e;
    d.dataset.lower = lo;
    d.dataset.upper = hi;
    if (DIFF) d.dataset.sig = significance(n);
    nodeOf.set(d, n);
    flame.appendChild(d);
  }
  function render() {
    flame.textContent = "";
    const W = flame.clientWidth || 1200;
    flame.dataset.width = W;
    flame.dataset.minWidth = MIN_WIDTH;
    const z = zoomed();
    const chain = [];
    for (let n = z; n; n = n.parent) chain.unshift(n);
    chain.forEach((n, d) => { if (n !== z) box(n, 0, W, d, true); });
    let deepest = chain.length - 1;
    // An explicit stack, not recursion: a stack thousands of frames deep is drawn whole.
    const todo = [[z, 0, W, chain.length - 1]];
    while (todo.length) {
      const [n, x, w, d] = todo.pop();
      box(n, x, w, d, false);
      deepest = Math.max(deepest, d);
      if (n.w <= 0) continue;
      let cx = x;
      const kids = [...n.kids.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
      for (const k of kids) {
        const kw = (w * k.w) / n.w;
        if (kw >= MIN_WIDTH) todo.push([k, cx, kw, d + 1]);
        cx += kw;
      }
    }
    flame.style.height = (deepest + 1) * ROW + "px";
    showMatched();
  }
  function showMatched() {
    const out = document.getElementById("matched");
    if (!term) { out.textContent = ""; return; }
    // The matched share: frames matching, not counting one inside another that matches.
    let total = 0;
    const visit = (n, inside) => {
      const hit = n.parent && term.test(n.name);
      if (hit && !inside) total += n.w;
      for (const k of n.kids.values()) visit(k, inside || hit);
    };
    visit(tree, false);
    out.textContent = `matched: ${fmt(total, unit())} (${pct(total / Math.max(tree.w, 1e-300))})`;
    out.dataset.value = total;
  }

  function describe(n) {
    const m = D.metrics[metric];
    const [lo, hi] = bounds(n);
    const conf = (100 * D.confidence).toFixed(D.confidence > 0.99 ? 2 : 0) + "%";
    const lines = [n.name];
    if (DIFF) {
      const s = significance(n);
      lines.push(`${m.label}: ${fmt(n.base, m.unit)} → ${fmt(n.neu, m.unit)}`);
      lines.push(`change ${fmt(n.e, m.unit)} [${fmt(lo, m.unit)}, ${fmt(hi, m.unit)}] (simultaneous ${conf}): ` +
        (s > 0 ? "significant growth" : s < 0 ? "significant shrinkage" : "within the noise"));
    } else {
      lines.push(`${m.label}: ${fmt(n.e, m.unit)} [${fmt(lo, m.unit)}, ${fmt(hi, m.unit)}] at ${conf}`);
      lines.push(`${n.s} samples, ${n.stacks} stack${n.stacks === 1 ? "" : "s"}, ${pct(n.w / Math.max(tree.w, 1e-300))} of the total`);
      if (isWide(n)) lines.push("wide bounds: few samples, read the width with care");
    }
    lines.push("click to zoom");
    return lines.join("\n");
  }
  flame.addEventListener("mousemove", (ev) => {
    const n = nodeOf.get(ev.target);
    if (!n) { tooltip.hidden = true; return; }
    tooltip.textContent = describe(n);
    tooltip.hidden = false;
    tooltip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 360) + "px";
    tooltip.style.top = ev.clientY + 14 + "px";
  });
  flame.addEventListener("mouseleave", () => { tooltip.hidden = true; });
  flame.addEventListener("click", (ev) => {
    const n = nodeOf.get(ev.target);
    if (!n) return;
    zoomPath = pathOf(n);
    render();
  });
  document.getElementById("reset").addEventListener("click", () => { zoomPath = []; render(); });
  document.getElementById("search").addEventListener("input", (ev) => {
    const text = ev.target.value;
    if (!text) term = null;
    else {
      try { term = new RegExp(text); } catch (e) { term = new RegExp(text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")); }
    }
    render();
  });
  const select = document.getElementById("metric");
  D.metrics.forEach((m, i) => {
    const o = el("option", null, m.label);
    o.value = i;
    select.appendChild(o);
  });
  select.value = metric;
  select.addEventListener("change", () => {
    metric = Number(select.value);
    tree = build();
    render();
    table();
  });

  // The table: stacks, or functions (stacks summed by their allocating frame).
  function rows() {
    if (group === "stacks") {
      return D.stacks.filter((st) => st.v[metric]).map((st) => {
        const leaf = st.f.length - 1;
        const via = st.site < leaf ? " [via " + D.frames[st.f[leaf]] + (st.site < leaf - 1 ? " ← …" : "") + "]" : "";
        const n = blank(D.frames[st.f[st.site]] + via, null, -1);
        add(n, st.v[metric], st);
        n.stack = st;
        return n;
      });
    }
    const by = new Map();
    for (const st of D.stacks) {
      const v = st.v[metric];
      if (!v) continue;
      const site = st.f[st.site];
      let n = by.get(site);
      if (!n) { n = blank(D.frames[site], null, site); by.set(site, n); }
      add(n, v, st);
    }
    return [...by.values()];
  }
  function columns() {
    const u = unit();
    const cols = [{ key: "name", label: group === "stacks" ? "stack (its site: the first frame past the allocator)" : "site", cls: "name", get: (n) => n.name, show: (n) => n.name }];
    if (group === "stacks") cols.push({ key: "process", label: "process", cls: "name", get: (n) => D.frames[n.stack.f[0]], show: (n) => D.frames[n.stack.f[0]] });
    if (DIFF) {
      cols.push({ key: "base", label: "base", get: (n) => n.base, show: (n) => fmt(n.base, u) });
      cols.push({ key: "neu", label: "new", get: (n) => n.neu, show: (n) => fmt(n.neu, u) });
      cols.push({ key: "e", label: "change", get: (n) => n.e, show: (n) => fmt(n.e, u) });
    } else {
      cols.push({ key: "e", label: D.metrics[metric].label, get: (n) => n.e, show: (n) => fmt(n.e, u) });
    }
    cols.push({ key: "lo", label: "lower", get: (n) => bounds(n)[0], show: (n) => fmt(bounds(n)[0], u) });
    cols.push({ key: "hi", label: "upper", get: (n) => bounds(n)[1], show: (n) => fmt(bounds(n)[1], u) });
    if (!DIFF) {
      cols.push({ key: "s", label: "samples", get: (n) => n.s, show: (n) => String(n.s) });
      cols.push({ key: "share", label: "share", get: (n) => n.w, show: (n) => pct(n.w / Math.max(tree.w, 1e-300)) });
    } else {
      cols.push({ key: "sig", label: "significant", get: (n) => significance(n), show: (n) => ["shrank", "no", "grew"][significance(n) + 1] });
    }
    if (group === "stacks" && D.stacks.some((st) => st.life)) {
      cols.push({ key: "tmp", label: "freed < 1 ms", get: (n) => (n.stack.life ? n.stack.life[0] : -1), show: (n) => (n.stack.life ? pct(n.stack.life[0]) : "") });
    }
    return cols;
  }
  function table() {
    const cols = columns();
    if (!cols.some((c) => c.key === sortKey)) sortKey = "e";
    const col = cols.find((c) => c.key === sortKey);
    const all = rows();
    all.sort((a, b) => {
      const x = col.get(a), y = col.get(b);
      return typeof x === "string" ? (x < y ? -1 : x > y ? 1 : 0) : (DIFF && sortKey === "e" ? Math.abs(y) - Math.abs(x) : y - x);
    });
    const head = document.querySelector("#table thead");
    head.textContent = "";
    const hr = el("tr");
    for (const c of cols) {
      const th = el("th", (c.cls || "") + (c.key === sortKey ? " sorted" : ""), c.label);
      th.dataset.key = c.key;
      th.addEventListener("click", () => { sortKey = c.key; table(); });
      hr.appendChild(th);
    }
    head.appendChild(hr);
    const body = document.querySelector("#table tbody");
    body.textContent = "";
    for (const n of all.slice(0, TABLE_ROWS)) {
      const tr = el("tr", "row");
      for (const c of cols) {
        const td = el("td", c.cls || "", c.show(n));
        if (DIFF && c.key === "sig") {
          const s = significance(n);
          if (s) td.className = s > 0 ? "significant-up" : "significant-down";
        }
        tr.appendChild(td);
      }
      tr.addEventListener("click", () => expand(tr, n, cols.length));
      body.appendChild(tr);
    }
    document.getElementById("table-note").textContent =
      all.length > TABLE_ROWS ? `the top ${TABLE_ROWS} of ${all.length} rows` : `${all.length} rows`;
  }
  function expand(tr, n, span) {
    const next = tr.nextSibling;
    if (next && next.classList && next.classList.contains("detail")) { next.remove(); return; }
    const row = el("tr", "detail");
    const td = el("td");
    td.colSpan = span;
    const st = n.stack;
    if (st) {
      td.appendChild(el("div", null, "stack, allocating frame first:"));
      const ol = el("ol");
      for (let i = st.f.length - 1; i >= 0; i--) ol.appendChild(el("li", null, D.frames[st.f[i]]));
      td.appendChild(ol);
      if (st.life) {
        const l = st.life;
        const names = ["freed within 1 ms", "within 1 s", "later", "still in use"];
        const parts = names.map((name, i) => `${name} ${pct(l[3 * i])} [${pct(l[3 * i + 1])}, ${pct(l[3 * i + 2])}]`);
        td.appendChild(el("div", null, "lifetimes (share of its bytes): " + parts.join(", ") +
          (l[12] !== null ? `; p50 ${l[12]} s, p90 ${l[13]} s` : "")));
      }
      if (st.sizes && st.sizes.length) {
        td.appendChild(el("div", null, "sizes: " + st.sizes.map((c) => `${fmt(c[0], "bytes")}–${fmt(c[1], "bytes")}: ${fmt(c[2], "bytes")} [${fmt(c[3], "bytes")}, ${fmt(c[4], "bytes")}]`).join("; ")));
      }
      if (st.threads && st.threads.length) {
        td.appendChild(el("div", null, "threads: " + st.threads.map((t) => `${t[0]} ${fmt(t[1], "bytes")}`).join("; ")));
      }
    } else {
      td.appendChild(el("div", null, `${n.stacks} stacks allocate in ${n.name}`));
    }
    row.appendChild(td);
    tr.after(row);
  }
  for (const radio of document.querySelectorAll("input[name=group]")) {
    radio.addEventListener("change", () => { group = radio.value; table(); });
  }

  // Charts over time: one series per process total and top stack, a band for the bounds.
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2"];
  function chart(title, pick, u) {
    const W = 560, H = 220, L = 70, B = 24, T = 20;
    const box = svg("svg", { width: W, height: H, class: "chart", "data-title": title });
    const xs = D.at_seconds;
    const xmax = Math.max(xs[xs.length - 1] || 1, 1e-9);
    let ymax = 0;
    for (const s of D.series) for (const arr of [pick(s)[0], pick(s)[2]]) for (const y of arr) if (y !== null && isFinite(y)) ymax = Math.max(ymax, y);
    ymax = ymax || 1;
    const X = (x) => L + ((W - L - 10) * x) / xmax;
    const Y = (y) => H - B - ((H - B - T) * Math.min(y === null ? ymax : y, ymax)) / ymax;
    const t = svg("text", { x: L, y: 13 });
    t.textContent = title;
    box.appendChild(t);
    for (const [y, label] of [[0, fmt(0, u)], [ymax, fmt(ymax, u)]]) {
      const lt = svg("text", { x: 4, y: Y(y) + 4 });
      lt.textContent = label;
      box.appendChild(lt);
    }
    const xt = svg("text", { x: W - 60, y: H - 6 });
    xt.textContent = xmax.toFixed(1) + " s";
    box.appendChild(xt);
    box.appendChild(svg("line", { x1: L, y1: H - B, x2: W - 10, y2: H - B, stroke: "#999" }));
    D.series.forEach((s, i) => {
      const [est, lo, hi] = pick(s);
      const colour = PALETTE[i % PALETTE.length];
      const upper = xs.map((x, k) => `${X(x)},${Y(hi[k])}`);
      const lower = xs.map((x, k) => `${X(x)},${Y(lo[k])}`).reverse();
      box.appendChild(svg("polygon", { points: upper.concat(lower).join(" "), fill: colour, "fill-opacity": 0.15, class: "band" }));
      box.appendChild(svg("polyline", { points: xs.map((x, k) => `${X(x)},${Y(est[k])}`).join(" "), fill: "none", stroke: colour, "stroke-width": 1.5, class: "line", "data-name": s.name }));
    });
    return box;
  }
  function charts() {
    if (!D.series || !D.series.length) return;
    document.getElementById("charts-section").hidden = false;
    const out = document.getElementById("charts");
    out.appendChild(chart("live bytes (band: bounds)", (s) => s.inuse, "bytes"));
    out.appendChild(chart("allocation rate (band: bounds)", (s) => s.alloc, "bytes/s"));
    const legend = el("div", "chart-legend");
    D.series.forEach((s, i) => {
      const sw = el("span", "swatch");
      sw.style.backgroundColor = PALETTE[i % PALETTE.length];
      legend.appendChild(sw);
      legend.appendChild(document.createTextNode(s.name + "  "));
    });
    out.appendChild(legend);
  }
  function sizes() {
    if (!D.sizes || !D.sizes.length) return;
    document.getElementById("sizes-section").hidden = false;
    const W = Math.max(560, 60 * D.sizes.length), H = 240, L = 70, B = 40, T = 20;
    const box = svg("svg", { width: W, height: H, class: "chart", "data-title": "sizes" });
    const ymax = Math.max(...D.sizes.map((b) => (isFinite(b.upper) && b.upper !== null ? b.upper : b.bytes)), 1);
    const bw = (W - L - 10) / D.sizes.length;
    const Y = (y) => H - B - ((H - B - T) * Math.min(y === null ? ymax : y, ymax)) / ymax;
    const title = svg("text", { x: L, y: 13 });
    title.textContent = "bytes allocated per size class (whiskers: bounds)";
    box.appendChild(title);
    const top = svg("text", { x: 4, y: Y(ymax) + 4 });
    top.textContent = fmt(ymax, "bytes");
    box.appendChild(top);
    D.sizes.forEach((b, i) => {
      const x = L + i * bw;
      box.appendChild(svg("rect", { x: x + 2, y: Y(b.bytes), width: bw - 4, height: H - B - Y(b.bytes), fill: "#e6a04b", class: "bar", "data-bytes": b.bytes }));
      const cx = x + bw / 2;
      box.appendChild(svg("line", { x1: cx, x2: cx, y1: Y(b.lower), y2: Y(b.upper), stroke: "#333" }));
      const label = svg("text", { x: x + 2, y: H - B + 14 });
      label.textContent = "≤" + fmt(b.to, "bytes");
      box.appendChild(label);
    });
    document.getElementById("sizes").appendChild(box);
  }

  document.title = D.title;
  document.getElementById("title").textContent = D.title;
  document.getElementById("preamble").textContent = D.preamble;
  // A long header (many processes) starts folded, so the pictures come first.
  document.getElementById("how").open = D.preamble.split("\n").length <= 16;
  document.getElementById("legend").textContent = DIFF
    ? "Width: the larger of the two sides. Red: significant growth, blue: significant shrinkage (deeper: larger relative change); grey: within the noise. Bounds hold simultaneously over every comparison."
    : "Width: the estimate. Hatched: wide bounds (the upper bound above twice the estimate, or the lower below half). Hover for each frame's estimate and bounds; click to zoom; search highlights.";
  if (DIFF) document.querySelector("#flame-section h2").textContent = "Differential flame graph";
  tree = build();
  render();
  table();
  charts();
  sizes();
  window.addEventListener("resize", render);
  // Since navigation began (the file read and parsed), and this script's own part.
  document.body.dataset.readyMs = performance.now().toFixed(1);
  document.body.dataset.scriptMs = (performance.now() - started).toFixed(1);
  document.body.dataset.ready = "1";
})();
