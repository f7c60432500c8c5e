// The console's own script: it keeps the live tables (lanes, events)
// current through server-sent events. Every page works without it.
(function () {
  "use strict";
  function live(table) {
    var url = table.getAttribute("data-stream");
    var body = table.tBodies[0];
    var status = document.getElementById("live");
    if (!url || !body || !window.EventSource) return;
    var es = new EventSource(url);
    function parseRow(html) {
      var t = document.createElement("tbody");
      t.innerHTML = html;
      return t.firstElementChild;
    }
    var count = status && status.querySelector("[data-count]");
    function recount() { if (count) count.textContent = String(body.rows.length); }
    es.addEventListener("row", function (e) {
      var row = parseRow(e.data);
      if (!row) return;
      var old = document.getElementById(row.id);
      if (old) {
        if (old.outerHTML !== row.outerHTML) old.replaceWith(row);
      } else {
        body.insertBefore(row, body.firstChild);
        recount();
      }
    });
    es.addEventListener("remove", function (e) {
      var old = document.getElementById(e.data);
      if (old) old.remove();
      recount();
    });
    es.addEventListener("event", function (e) {
      var row = parseRow(e.data);
      if (!row) return;
      body.insertBefore(row, body.firstChild);
      while (body.rows.length > 200) body.deleteRow(body.rows.length - 1);
    });
    es.onopen = function () {
      table.setAttribute("data-live", "on");
      if (status) status.classList.remove("stale");
    };
    es.onerror = function () {
      table.setAttribute("data-live", "off");
      if (status) status.classList.add("stale");
    };
  }
  document.addEventListener("DOMContentLoaded", function () {
    var tables = document.querySelectorAll("table[data-stream]");
    for (var i = 0; i < tables.length; i++) live(tables[i]);
    // Filters apply as soon as they change.
    var selects = document.querySelectorAll("form.filters select");
    for (var j = 0; j < selects.length; j++) {
      selects[j].addEventListener("change", function (e) { e.target.form.submit(); });
    }
  });
})();
