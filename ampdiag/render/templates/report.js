// ampdiag report: sortable tables, zoomable line charts, sections that fold. No network, no framework; the
// page's Content-Security-Policy allows this one script by its hash.
(function () {
  "use strict";
  var UNITS = { "µs": 1e-6, "ms": 1e-3, "s": 1, "min": 60, "h": 3600, "B": 1, "KiB": 1024,
    "MiB": 1048576, "GiB": 1073741824, "TiB": 1099511627776, "FLOP": 1, "kFLOP": 1e3,
    "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15, "%": 0.01, "x": 1 };

  // A cell's value for sorting: a number with its unit ("12.5 ms", "1,024", "31.0%"), else text.
  function key(cell) {
    var t = (cell.textContent || "").trim();
    var m = /^(-?[\d,]*\.?\d+)\s*(µs|ms|s|min|h|B|KiB|MiB|GiB|TiB|FLOP|kFLOP|MFLOP|GFLOP|TFLOP|PFLOP|%|x)?\b/.exec(t);
    if (!m && /^-?[\d,]*\.?\d+%$/.test(t)) { m = [t, t.slice(0, -1), "%"]; }
    if (m) { return { n: parseFloat(m[1].replace(/,/g, "")) * (UNITS[m[2]] || 1), t: t }; }
    return { n: null, t: t.toLowerCase() };
  }

  function sortable(table) {
    var head = table.tHead;
    if (!head || !table.tBodies.length) { return; }
    var ths = head.rows[0].cells;
    Array.prototype.forEach.call(ths, function (th, col) {
      th.classList.add("sortable");
      th.setAttribute("title", "sort by this column");
      th.addEventListener("click", function () {
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        var desc = th.getAttribute("aria-sort") !== "descending";
        Array.prototype.forEach.call(ths, function (o) { o.removeAttribute("aria-sort"); });
        th.setAttribute("aria-sort", desc ? "descending" : "ascending");
        rows.sort(function (a, b) {
          var x = key(a.cells[col] || a), y = key(b.cells[col] || b), r;
          if (x.n !== null && y.n !== null) { r = x.n - y.n; }
          else if (x.n !== null) { r = -1; } else if (y.n !== null) { r = 1; }
          else { r = x.t < y.t ? -1 : x.t > y.t ? 1 : 0; }
          return desc ? -r : r;
        });
        rows.forEach(function (row) { body.appendChild(row); });
        if (table.dataset.condensed === "yes") { condense(table); }
      });
    });
  }

  // A long table shows its first rows; a button under it shows them all (sorting first
  // still orders every row, so the rows shown are the top of the chosen order).
  var SHOWN_ROWS = 5;
  function condense(table) {
    var rows = table.tBodies[0].rows;
    Array.prototype.forEach.call(rows, function (row, i) { row.hidden = i >= SHOWN_ROWS; });
  }
  function shorten(table) {
    if (!table.tBodies.length || table.tBodies[0].rows.length <= SHOWN_ROWS + 1) { return; }
    var n = table.tBodies[0].rows.length;
    table.dataset.condensed = "yes";
    condense(table);
    var button = document.createElement("button");
    button.type = "button";
    button.className = "more";
    button.textContent = "Show all " + n + " rows";
    button.addEventListener("click", function () {
      var open = table.dataset.condensed === "yes";
      table.dataset.condensed = open ? "no" : "yes";
      if (open) {
        Array.prototype.forEach.call(table.tBodies[0].rows, function (r) { r.hidden = false; });
      } else { condense(table); }
      button.textContent = open ? "Show the first " + SHOWN_ROWS + " rows" : "Show all " + n + " rows";
    });
    table.parentNode.insertBefore(button, table.nextSibling);
  }

  // Zoom a line chart on the x axis: the wheel zooms around the pointer, a drag pans,
  // a double click shows the whole run again. The x data is in the SVG (data-x, data-xs).
  function zoomable(svg) {
    var p0 = parseFloat(svg.dataset.p0), p1 = parseFloat(svg.dataset.p1);
    var lo0 = parseFloat(svg.dataset.lo), hi0 = parseFloat(svg.dataset.hi);
    if (!(p1 > p0) || !(hi0 > lo0)) { return; }
    var lo = lo0, hi = hi0;
    var lines = Array.prototype.map.call(svg.querySelectorAll("polyline[data-xs]"), function (pl) {
      var xs = pl.dataset.xs.split(" ").map(parseFloat);
      var ys = pl.getAttribute("points").split(" ").map(function (p) { return p.split(",")[1]; });
      return { el: pl, xs: xs, ys: ys };
    });
    var ticks = svg.querySelectorAll("text.xtick");
    var integer = Array.prototype.every.call(ticks, function (t) {
      return /^-?[\d,]+$/.test(t.textContent);
    });
    function px(x) { return p0 + (x - lo) / (hi - lo) * (p1 - p0); }
    function draw() {
      lines.forEach(function (l) {
        l.el.setAttribute("points", l.xs.map(function (x, i) {
          return px(x).toFixed(1) + "," + l.ys[i];
        }).join(" "));
      });
      svg.querySelectorAll("g.points").forEach(function (g, k) {
        var xs = lines[k] ? lines[k].xs : [];
        Array.prototype.forEach.call(g.children, function (c, i) {
          if (i < xs.length) { c.setAttribute("cx", px(xs[i]).toFixed(1)); }
        });
      });
      svg.querySelectorAll("line[data-x], text[data-x]").forEach(function (e) {
        var x = px(parseFloat(e.dataset.x)).toFixed(1);
        if (e.tagName === "line") { e.setAttribute("x1", x); e.setAttribute("x2", x); }
        else { e.setAttribute("x", x); }
      });
      svg.querySelectorAll("rect[data-x0]").forEach(function (r) {
        var a = px(parseFloat(r.dataset.x0)), b = px(parseFloat(r.dataset.x1));
        r.setAttribute("x", a.toFixed(1)); r.setAttribute("width", Math.max(0, b - a).toFixed(1));
      });
      ticks.forEach(function (t) {
        var v = lo + (parseFloat(t.dataset.px) - p0) / (p1 - p0) * (hi - lo);
        t.textContent = integer ? Math.round(v).toLocaleString("en-US") : v.toPrecision(3);
      });
      svg.dataset.zoomLo = lo; svg.dataset.zoomHi = hi;
    }
    function toData(evt, a, b) {
      var box = svg.getBoundingClientRect();
      var sx = (evt.clientX - box.left) * (svg.viewBox.baseVal.width / box.width);
      return a + (sx - p0) / (p1 - p0) * (b - a);
    }
    svg.addEventListener("wheel", function (evt) {
      evt.preventDefault();
      var at = toData(evt, lo, hi), f = evt.deltaY < 0 ? 0.8 : 1.25;
      var span = Math.min(hi0 - lo0, Math.max((hi - lo) * f, (hi0 - lo0) / 200));
      lo = Math.max(lo0, at - (at - lo) / (hi - lo) * span);
      hi = Math.min(hi0, lo + span); lo = Math.max(lo0, hi - span);
      draw();
    }, { passive: false });
    var drag = null;
    svg.addEventListener("mousedown", function (evt) {
      drag = { at: toData(evt, lo, hi), lo: lo, hi: hi };
    });
    window.addEventListener("mouseup", function () { drag = null; });
    svg.addEventListener("mousemove", function (evt) {
      if (!drag) { return; }
      var span = drag.hi - drag.lo;
      var shift = drag.at - toData(evt, drag.lo, drag.hi);
      lo = Math.min(Math.max(lo0, drag.lo + shift), hi0 - span); hi = lo + span;
      draw();
    });
    svg.addEventListener("dblclick", function () { lo = lo0; hi = hi0; draw(); });
    svg.classList.add("zoomable");
    svg.setAttribute("aria-description", "wheel: zoom the steps, drag: pan, double click: all");
  }

  // A section folds away under its heading (click the heading; again to open it).
  document.querySelectorAll("main > section > h2").forEach(function (h) {
    h.classList.add("fold");
    if (h.parentNode.dataset.fold === "closed") {  // reference material: one click away
      h.parentNode.classList.add("folded");
      h.setAttribute("aria-expanded", "false");
    }
    h.setAttribute("title", "fold or open this section");
    h.addEventListener("click", function () {
      var open = !h.parentNode.classList.toggle("folded");
      h.setAttribute("aria-expanded", open ? "true" : "false");
    });
  });
  document.querySelectorAll("main table").forEach(function (t) {
    if (t.tHead) { sortable(t); }
    shorten(t);
  });
  document.querySelectorAll("svg.chart-line[data-p0]").forEach(zoomable);
  document.documentElement.dataset.interactive = "yes";
})();
