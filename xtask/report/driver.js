// `cargo xtask bench --report`: reads the page's own times and times a search and a change
// of value, as a user would make them; prints one line into <pre id="bench">.
(function () {
  const body = document.body.dataset;
  const data = JSON.parse(document.getElementById("data").textContent);
  const t0 = performance.now();
  const search = document.getElementById("search");
  search.value = "left";
  search.dispatchEvent(new Event("input"));
  const t1 = performance.now();
  const select = document.getElementById("metric");
  select.value = "1";
  select.dispatchEvent(new Event("change"));
  const t2 = performance.now();
  const pre = document.createElement("pre");
  pre.id = "bench";
  const frames = document.querySelectorAll("#flame .frame").length;
  pre.textContent = `${String(data.stacks.length).padStart(6)}  ${String(frames).padStart(12)}  ${body.readyMs.padStart(16)}  ${body.scriptMs.padStart(11)}  ${(t1 - t0).toFixed(1).padStart(11)}  ${(t2 - t1).toFixed(1).padStart(17)}`;
  document.body.appendChild(pre);
})();
