// Drives the HTML report as a user would (allocscope's tests/tests/report.rs) and
// writes what the page showed into <pre id="test-results">.
(function () {
  const out = {};
  const flame = document.getElementById("flame");
  const frames = () => [...flame.querySelectorAll(".frame")].map((d) => ({
    name: d.dataset.name, w: parseFloat(d.style.width), depth: Math.round(parseFloat(d.style.top) / 18),
    estimate: parseFloat(d.dataset.estimate), lower: parseFloat(d.dataset.lower), upper: parseFloat(d.dataset.upper),
    match: d.classList.contains("match"), ancestor: d.classList.contains("ancestor") }));
  const find = (name) => [...flame.querySelectorAll(".frame")].find((d) => d.dataset.name === name);
  out.ready = document.body.dataset.ready;
  out.readyMs = parseFloat(document.body.dataset.readyMs);
  out.width = parseFloat(flame.dataset.width);
  out.minWidth = parseFloat(flame.dataset.minWidth);
  out.metrics = [...document.querySelectorAll("#metric option")].map((o) => o.textContent);
  out.initial = frames();
  const search = document.getElementById("search");
  search.value = "site_(small|calloc)";
  search.dispatchEvent(new Event("input"));
  out.searched = frames().filter((f) => f.match).map((f) => f.name);
  out.matched = document.getElementById("matched").textContent;
  search.value = "";
  search.dispatchEvent(new Event("input"));
  const small = find("site_small");
  small.dispatchEvent(new MouseEvent("mousemove", { bubbles: true, clientX: 10, clientY: 10 }));
  const tip = document.getElementById("tooltip");
  out.tooltip = { hidden: tip.hidden, text: tip.textContent };
  find("one_round").dispatchEvent(new MouseEvent("click", { bubbles: true }));
  out.zoomed = frames();
  document.getElementById("reset").click();
  const select = document.getElementById("metric");
  select.value = String([...select.options].findIndex((o) => o.textContent === "allocations"));
  select.dispatchEvent(new Event("change"));
  out.objects = frames();
  out.charts = [...document.querySelectorAll("svg.chart")].map((s) => ({
    title: s.dataset.title, lines: s.querySelectorAll("polyline.line").length,
    bands: s.querySelectorAll("polygon.band").length, bars: s.querySelectorAll("rect.bar").length }));
  const rows = () => [...document.querySelectorAll("#table tbody tr.row")];
  out.rows = rows().length;
  document.querySelector('#table th[data-key="s"]').click();
  out.sortedSamples = rows().slice(0, 3).map((r) => parseInt(r.children[5].textContent));
  rows()[0].click();
  const detail = document.querySelector("#table tr.detail");
  out.detail = detail ? [...detail.querySelectorAll("li")].map((li) => li.textContent) : null;
  const pre = document.createElement("pre");
  pre.id = "test-results";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
