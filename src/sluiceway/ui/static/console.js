// sluice ui: the page refreshing itself, and its charts (uPlot, vendored beside this file).
//
// The page's content is fetched again every few seconds and put in place; elements marked
// data-keep (the charts, the sparklines) are carried over into the new content rather than
// drawn again, and then given fresh data from /api/history.
(function () {
  "use strict";
  const sluice = (window.sluice = { charts: {}, sparks: {} });
  const palette = ["#0969da", "#b35900", "#1a7f37", "#8250df", "#cf222e", "#57606a", "#bf3989", "#0a3069"];

  function formatValue(unit, v) {
    if (v === null || v === undefined) return "–";
    const a = Math.abs(v);
    if (unit === "B" || unit === "B/s") {
      const units = ["B", "KiB", "MiB", "GiB", "TiB"];
      let i = 0, x = v;
      while (Math.abs(x) >= 1024 && i < units.length - 1) { x /= 1024; i++; }
      return (i === 0 ? x.toFixed(0) : x.toFixed(1)) + " " + units[i] + (unit === "B/s" ? "/s" : "");
    }
    if (unit === "s") return a < 1 ? (v * 1000).toFixed(0) + " ms" : a < 120 ? v.toFixed(1) + " s" : (v / 60).toFixed(1) + " min";
    const n = a >= 1e6 ? (v / 1e6).toFixed(1) + "M" : a >= 1e4 ? (v / 1e3).toFixed(1) + "k" : a >= 100 || Number.isInteger(v) ? v.toFixed(0) : v.toFixed(2);
    return n + (unit.endsWith("/s") ? " /s" : "");
  }

  async function history(query) {
    const response = await fetch("/api/history?" + new URLSearchParams(query), { credentials: "same-origin" });
    if (!response.ok) throw new Error((await response.json()).error || response.statusText);
    return response.json();
  }

  // One panel per unit: the series of a part that share a unit are drawn together.
  function panelsOf(chart) {
    const groups = new Map();
    for (const s of chart.series) {
      if (s.name === "health" || !s.values.some((v) => v !== null)) continue;
      const key = s.name.includes(":") ? s.name.split(":")[0] + ":" : s.unit;
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(s);
    }
    return [...groups.entries()];
  }

  function drawHistory(section) {
    const part = section.dataset.part, range = section.dataset.range;
    const panels = section.querySelector(".panels"), note = section.querySelector(".note");
    history({ part: part, range: range }).then((chart) => {
      const drawn = sluice.charts[part];
      const groups = panelsOf(chart);
      const shape = groups.map(([k, ss]) => k + "=" + ss.map((s) => s.name).join(",")).join(";");
      note.textContent = chart.times.length ? "" : "no samples in this range yet";
      if (drawn && drawn.shape === shape) {
        drawn.plots.forEach((plot, i) => plot.setData([chart.times, ...groups[i][1].map((s) => s.values)]));
        drawn.chart = chart;
        return;
      }
      if (drawn) drawn.plots.forEach((plot) => plot.destroy());
      panels.innerHTML = "";
      const plots = groups.map(([key, series]) => {
        const box = document.createElement("div");
        box.className = "panel";
        box.dataset.series = series.map((s) => s.name).join(",");
        const title = document.createElement("div");
        title.className = "label";
        title.textContent = series.length === 1 ? series[0].label : series.map((s) => s.label).join(" · ");
        box.appendChild(title);
        panels.appendChild(box);
        const unit = series[0].unit;
        return new uPlot(
          {
            width: Math.max(320, box.clientWidth - 8), height: 170,
            series: [{}, ...series.map((s, i) => ({ label: s.label, stroke: palette[i % palette.length], width: 1.5,
              spanGaps: false, value: (u, v) => formatValue(unit, v) }))],
            axes: [{}, { size: 70, values: (u, ticks) => ticks.map((v) => formatValue(unit, v)) }],
            scales: { y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max * 1.1 : 1] } },
          },
          [chart.times, ...series.map((s) => s.values)],
          box,
        );
      });
      sluice.charts[part] = { shape: shape, plots: plots, chart: chart };
    }).catch((e) => { note.textContent = "history: " + e.message; });
  }

  function drawSparks() {
    const cells = document.querySelectorAll("td.spark[data-part]");
    if (!cells.length) return;
    history({ range: "15m" }).then((all) => {
      const byPart = new Map(all.parts.map((c) => [c.part, c]));
      cells.forEach((cell) => {
        const chart = byPart.get(cell.dataset.part);
        if (!chart || !chart.series.length) return;
        const s = chart.series[0], data = [chart.times, s.values];
        const drawn = sluice.sparks[chart.part];
        cell.title = s.label + ", last 15 min";
        if (drawn && drawn.plot.root.isConnected) { drawn.plot.setData(data); drawn.chart = chart; return; }
        cell.innerHTML = "";
        const plot = new uPlot({
          width: 130, height: 30, legend: { show: false }, cursor: { show: false }, select: { show: false },
          axes: [{ show: false }, { show: false }], scales: { x: { time: false }, y: { range: (u, min, max) => [Math.min(0, min), max > 0 ? max : 1] } },
          series: [{}, { stroke: "#0969da", width: 1.25, fill: "rgba(9,105,218,0.12)" }],
        }, data, cell);
        sluice.sparks[chart.part] = { plot: plot, chart: chart };
      });
    }).catch(() => { /* the overview stands without its sparklines */ });
  }

  function draw() {
    document.querySelectorAll("section.history[data-part]").forEach(drawHistory);
    drawSparks();
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("section.history button[data-range]");
    if (!button) return;
    const section = button.closest("section.history");
    section.dataset.range = button.dataset.range;
    section.querySelectorAll("button[data-range]").forEach((b) => b.classList.toggle("on", b === button));
    drawHistory(section);
  });

  const main = document.getElementById("content");
  const seconds = parseFloat(main.dataset.refresh || "0");
  const url = new URL(location.href);
  if (url.searchParams.has("msg")) { url.searchParams.delete("msg"); window.history.replaceState(null, "", url); }
  const stamp = () => { document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString(); };
  stamp();
  draw();
  sluice.refreshes = 0;
  if (!(seconds > 0)) return;
  setInterval(async function () {
    const active = document.activeElement;
    const typing = active && ["INPUT", "TEXTAREA", "SELECT"].includes(active.tagName);
    if (typing || (active && active.tagName === "BUTTON" && !active.dataset.range)) return;
    try {
      const response = await fetch(location.href, { headers: { "X-Sluice-Fragment": "1" } });
      if (!response.ok) return;
      const kept = new Map([...main.querySelectorAll("[data-keep][id]")].map((el) => [el.id, el]));
      main.innerHTML = await response.text();
      main.querySelectorAll("[data-keep][id]").forEach((fresh) => {
        const old = kept.get(fresh.id);
        if (old) fresh.replaceWith(old);
      });
      stamp();
      draw();
      sluice.refreshes += 1;
    } catch (e) { /* the server is away for a moment: try again at the next tick */ }
  }, seconds * 1000);
})();
