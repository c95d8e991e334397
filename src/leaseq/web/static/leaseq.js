// leaseq dashboard: live refresh of the parts marked data-leaseq-refresh="SECONDS".
// Each such element carries hx-get/hx-trigger="leaseq:refresh"; we fire that event
// on a timer, only while the tab is visible (a hidden tab costs the database nothing),
// and once at once when the tab becomes visible again. No eval, no inline code.
(function () {
  "use strict";
  var TICK_MS = 1000;
  var last = new WeakMap();

  function due(element, now) {
    var seconds = parseFloat(element.getAttribute("data-leaseq-refresh")) || 5;
    var previous = last.get(element);
    if (previous === undefined) {
      last.set(element, now);
      return false;
    }
    return now - previous >= seconds * 1000;
  }

  function refresh(force) {
    if (document.visibilityState !== "visible" || typeof htmx === "undefined") {
      return;
    }
    var now = Date.now();
    document.querySelectorAll("[data-leaseq-refresh]").forEach(function (element) {
      if (force || due(element, now)) {
        last.set(element, now);
        htmx.trigger(element, "leaseq:refresh");
      }
    });
  }

  document.addEventListener("visibilitychange", function () {
    if (document.visibilityState === "visible") {
      refresh(true);
    }
  });
  // A payload that is long starts folded; short ones stay open.
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("details.payload").forEach(function (details) {
      var pre = details.querySelector("pre");
      if (pre && pre.textContent.split("\n").length > 40) {
        details.open = false;
      }
    });
  });
  window.setInterval(function () { refresh(false); }, TICK_MS);
})();
