// Live refresh for the dashboard's pages, allowed by the CSP as a same-origin
// script (no inline code). Every few seconds it fetches the page again and
// swaps in the elements marked data-live (counts, charts, tables), never the
// forms being typed in. Pausable; the choice is kept in localStorage.
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
