// The asyncq console's one script: live regions by server-sent events with a polling fallback, the selection of
// jobs for a bulk action, and nothing else. A live region holds no field the operator types in, so an update never
// loses what they are typing; the boxes they ticked are ticked again after an update. Nor does an update replace a
// region under the operator's hand: while a pointer is pressed in it the newest update waits for the release (a
// press and a release on two different buttons make no click, and the operator would have to click again).
(function () {
  "use strict";

  function ticked(region) {
    var found = {};
    region.querySelectorAll("input[type=checkbox][data-pick]").forEach(function (box) {
      if (box.checked) { found[box.value] = true; }
    });
    return found;
  }

  function swap(region, html) {
    if (region.dataset.held === "yes") {
      held.set(region, html);
      region.dataset.pending = "yes";
      return;
    }
    if (region.innerHTML === html) { return; }
    var keep = ticked(region);
    region.innerHTML = html;
    region.querySelectorAll("input[type=checkbox][data-pick]").forEach(function (box) {
      if (keep[box.value]) { box.checked = true; }
    });
    region.dataset.updates = String(Number(region.dataset.updates || "0") + 1);
    wirePicks(region);
  }

  function poll(region) {
    var every = Number(region.dataset.every || "5000");
    document.body.dataset.live = "poll";
    function tick() {
      fetch(region.dataset.fragment, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (answer) { return answer.ok ? answer.text() : null; })
        .then(function (html) { if (html !== null) { swap(region, html); } })
        .catch(function () { /* the next tick tries again */ })
        .finally(function () { setTimeout(tick, every); });
    }
    setTimeout(tick, every);
  }

  function listen(region) {
    if (!window.EventSource || region.dataset.transport === "poll") { poll(region); return; }
    var source = new EventSource(region.dataset.events, { withCredentials: true });
    var opened = false;
    source.addEventListener("open", function () { opened = true; document.body.dataset.live = "sse"; });
    source.addEventListener("update", function (event) { swap(region, event.data); });
    source.addEventListener("error", function () {
      // A stream that never opened (a proxy that buffers, a server that refuses it): poll instead.
      if (!opened || source.readyState === EventSource.CLOSED) { source.close(); poll(region); }
    });
  }

  var held = new Map();  // region -> the newest update that waited for a pointer's release

  function guard(region) {
    region.addEventListener("pointerdown", function () { region.dataset.held = "yes"; });
    function release() {
      if (region.dataset.held !== "yes") { return; }
      setTimeout(function () {  // after the click this release makes, on the button that was pressed
        region.dataset.held = "";
        delete region.dataset.pending;
        if (held.has(region)) {
          var html = held.get(region);
          held.delete(region);
          swap(region, html);
        }
      }, 0);
    }
    document.addEventListener("pointerup", release);
    document.addEventListener("pointercancel", release);
  }

  function wirePicks(scope) {
    var all = scope.querySelector("input[data-pick-all]");
    if (all) {
      all.addEventListener("change", function () {
        document.querySelectorAll("input[type=checkbox][data-pick]").forEach(function (box) { box.checked = all.checked; });
      });
    }
  }

  // A bulk form previews the ticked jobs (queues, schedules) when asked to, else everything its filter finds.
  function wireBulk(form) {
    form.addEventListener("submit", function (event) {
      var target = form.querySelector("[name=ids], [name=queues], [name=schedules]");
      var scope = form.querySelector("input[name=scope]:checked");
      if (!target || (scope && scope.value !== "picked")) { return; }
      var picked = Object.keys(ticked(document));
      if (picked.length === 0) {
        event.preventDefault();
        var say = form.querySelector(".say");
        if (say) { say.textContent = "tick some first"; }
        return;
      }
      target.value = picked.join(" ");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-live]").forEach(function (region) {
      guard(region);
      listen(region);
      wirePicks(region);
    });
    document.querySelectorAll("form[data-bulk]").forEach(wireBulk);
    document.body.dataset.ready = "yes";
  });
})();
