// Sorts a table by the clicked column: numbers by data-v (raw value), text otherwise.
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var desc = th.classList.contains("asc");
      table.querySelectorAll("th").forEach(function (h) { h.classList.remove("asc", "desc"); });
      th.classList.add(desc ? "desc" : "asc");
      function key(row) {
        var cell = row.cells[col], v = cell.getAttribute("data-v");
        if (v === null) { v = cell.textContent; }
        var f = parseFloat(v);
        return (v !== "" && isFinite(v)) ? f : v.toLowerCase();
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), r;
        if (typeof x === typeof y) { r = x < y ? -1 : x > y ? 1 : 0; }
        else { r = typeof x === "number" ? -1 : 1; }
        return desc ? -r : r;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
