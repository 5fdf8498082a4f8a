// Reads the differential report's frames and their significance (tests/tests/report.rs).
const f = [...document.querySelectorAll("#flame .frame")].map((d) => ({ name: d.dataset.name, sig: d.dataset.sig, unchanged: d.classList.contains("unchanged") }));
const pre = document.createElement("pre"); pre.id = "test-results";
pre.textContent = JSON.stringify({ frames: f, title: document.querySelector("#flame-section h2").textContent, rows: document.querySelectorAll("#table tbody tr.row").length });
document.body.appendChild(pre);
    
