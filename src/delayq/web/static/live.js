// The dashboard's one script, allowed by the CSP as a same-origin script (no
// inline code), loaded by every page.
//
// Live refresh: every few seconds it fetches the page again and swaps in the
// elements marked data-live (counts, charts, tables), never the forms being
// typed in. Pausable; the choice is kept in localStorage.
//
// Times: the server writes every time as UTC (<time data-epoch>); the header's
// button shows them in this browser's zone instead, and back (kept too).
(function () {
  "use strict";
  var KEY = "delayq.live";
  var every = Number(document.body.getAttribute("data-refresh") || "0") * 1000;
  var button = document.getElementById("live-toggle");
  var status = document.getElementById("live-status");
  if (!every || !button || !status) {
    return;
  }
  var paused = window.localStorage.getItem(KEY) === "paused";
  var busy = false;

  function show() {
    button.textContent = paused ? "Resume live refresh" : "Pause live refresh";
    button.setAttribute("aria-pressed", paused ? "true" : "false");
    if (paused) {
      status.textContent = "paused";
    }
  }

  function tick() {
    if (paused || busy || document.hidden) {
      return;
    }
    busy = true;
    window.fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-live]").forEach(function (old) {
          var next = fresh.getElementById(old.id);
          if (next) {
            old.replaceWith(document.importNode(next, true));
          }
        });
        document.dispatchEvent(new Event("delayq:refreshed"));
        status.textContent = "live, updated " + new Date().toLocaleTimeString();
        status.setAttribute("data-updated", String(Date.now()));
      })
      .catch(function (error) {
        status.textContent = "refresh failed (" + error.message + "), retrying";
      })
      .finally(function () {
        busy = false;
      });
  }

  button.hidden = false;
  button.addEventListener("click", function () {
    paused = !paused;
    window.localStorage.setItem(KEY, paused ? "paused" : "live");
    show();
    tick();
  });
  show();
  if (!paused) {
    status.textContent = "live, every " + every / 1000 + " s";
  }
  window.setInterval(tick, every);
})();

(function () {
  "use strict";
  var KEY = "delayq.times";
  var button = document.getElementById("times-toggle");
  if (!button) {
    return;
  }
  var zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "local";

  function two(n) {
    return (n < 10 ? "0" : "") + n;
  }

  function localText(epoch) {
    var d = new Date(epoch * 1000);
    return d.getFullYear() + "-" + two(d.getMonth() + 1) + "-" + two(d.getDate()) + " " +
      two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds()) + " " + zone;
  }

  function apply() {
    var local = window.localStorage.getItem(KEY) === "local";
    document.querySelectorAll("time[data-epoch]").forEach(function (el) {
      if (!el.hasAttribute("data-utc")) {
        el.setAttribute("data-utc", el.textContent);
      }
      el.textContent = local ? localText(Number(el.getAttribute("data-epoch")))
        : el.getAttribute("data-utc");
    });
    button.textContent = local ? "Times: " + zone : "Times: UTC";
    button.setAttribute("aria-pressed", local ? "true" : "false");
    button.title = local ? "Show times in UTC" : "Show times in " + zone;
  }

  button.hidden = false;
  button.addEventListener("click", function () {
    var local = window.localStorage.getItem(KEY) === "local";
    window.localStorage.setItem(KEY, local ? "utc" : "local");
    apply();
  });
  document.addEventListener("delayq:refreshed", apply);
  apply();
})();
