// soldonce console: polls /api/figures once a second with the operator
// token and draws the figures; the console samples the rates itself.
"use strict";
(function () {
  const KEY = "soldonce-console-token";
  const OUTCOMES = ["placed", "confirmed", "payment_failed", "expired", "cancelled", "refunded"];
  const COLORS = ["#2c6fbb", "#1e8449", "#c0392b", "#d68910", "#7f8c8d", "#8e44ad"];
  const $ = (id) => document.getElementById(id);

  // The token: from the URL fragment (never sent to the server), else the form.
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) {
    sessionStorage.setItem(KEY, hash.get("token"));
    history.replaceState(null, "", location.pathname);
  }
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("login").classList.add("hidden");
    poll();
  });

  const chart = new uPlot({
    width: Math.max(400, $("rates").clientWidth),
    height: 220,
    series: [{}].concat(OUTCOMES.map((name, i) => ({ label: name.replace("_", " "), stroke: COLORS[i], width: 2 }))),
    axes: [{}, { label: "orders/s" }],
    scales: { x: { time: true } },
  }, [[]].concat(OUTCOMES.map(() => [])), $("rates"));
  window.addEventListener("resize", () => chart.setSize({ width: Math.max(400, $("rates").clientWidth), height: 220 }));

  const fmt = (n) => Number(n).toLocaleString("en-US");
  const age = (s) => s < 1 ? "0 s" : s < 120 ? `${Math.round(s)} s` : s < 7200 ? `${Math.round(s / 60)} min` : `${Math.round(s / 3600)} h`;
  const ago = (iso) => iso ? `${age((Date.now() - Date.parse(iso)) / 1000)} ago` : "never";
  const set = (name, text, bad) => {
    document.querySelectorAll(`[data-figure="${name}"]`).forEach((el) => {
      el.textContent = text;
      el.classList.toggle("bad", !!bad);
    });
  };
  const rows = (id, list) => {
    $(id).innerHTML = "";
    for (const cells of list) {
      const tr = document.createElement("tr");
      cells.forEach(([text, attrs]) => {
        const td = document.createElement("td");
        td.textContent = text;
        for (const [k, v] of Object.entries(attrs || {})) td.setAttribute(k, v);
        tr.appendChild(td);
      });
      $(id).appendChild(tr);
    }
  };

  function draw(f) {
    for (const [state, n] of Object.entries(f.orders)) set(`orders.${state}`, fmt(n));
    // The rates come sampled by the console once a second (the last five
    // minutes), so a page opened now shows what just happened.
    const samples = f.rates || [];
    const data = [samples.map((r) => Date.parse(r.at) / 1000)].concat(
      OUTCOMES.map((o) => samples.map((r) => r.per_second[`order.${o}`] || 0)));
    chart.setData(data);
    rows("ages", f.reservations_by_age.map(([band, n]) => [[band], [fmt(n), { "data-figure": `reservations.${band}` }]]));
    rows("skus", f.hot_skus.map((s) => [
      [s.sku],
      [fmt(s.available), { "data-figure": `stock.${s.sku}.available` }],
      [fmt(s.reserved), { "data-figure": `stock.${s.sku}.reserved` }],
      [fmt(s.sold), { "data-figure": `stock.${s.sku}.sold` }],
    ]));
    set("outbox.rows", fmt(f.outbox_rows), f.outbox_oldest_seconds > 30);
    set("outbox.oldest", age(f.outbox_oldest_seconds), f.outbox_oldest_seconds > 30);
    set("outbox.parked", fmt(f.outbox_parked), f.outbox_parked > 0);
    const dead = Object.values(f.dead_letters).reduce((a, b) => a + b, 0);
    set("dead_letters.total", fmt(dead), dead > 0);
    $("consumers").innerHTML = "";
    for (const [name, lag] of Object.entries(f.consumers || {})) {
      const dt = document.createElement("dt");
      dt.textContent = `${name} lag`;
      const dd = document.createElement("dd");
      dd.textContent = fmt(lag.pending + lag.ack_pending);
      dd.setAttribute("data-figure", `consumers.${name}`);
      $("consumers").append(dt, dd);
    }
    set("refunds.owed", fmt(f.refunds_owed), f.refunds_oldest_seconds > 900);
    set("refunds.oldest", f.refunds_owed ? age(f.refunds_oldest_seconds) : "–");
    set("reconcile.at", ago(f.reconciliation.at));
    const unresolved = Object.values(f.reconciliation.unresolved).reduce((a, b) => a + b, 0);
    set("reconcile.unresolved", fmt(unresolved), unresolved > 0);
    set("audit.at", f.audit ? `${ago(f.audit.at)} (${f.audit.kind})` : "not yet");
    set("audit.violations", f.audit ? fmt(f.audit.violations) : "–", f.audit && f.audit.violations > 0);
    $("audit-checks").textContent = f.audit && f.audit.violations
      ? Object.entries(f.audit.checks).map(([c, n]) => `${c}: ${n}`).join(", ") : "";
    $("status").textContent = `updated ${new Date(f.at).toLocaleTimeString()}`;
    document.body.dataset.updated = f.at;
  }

  async function poll() {
    const token = sessionStorage.getItem(KEY);
    if (!token) { $("login").classList.remove("hidden"); $("status").textContent = "token needed"; return; }
    try {
      const r = await fetch("/api/figures", { headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
      if (r.status === 401) {
        sessionStorage.removeItem(KEY);
        $("login-error").textContent = "That token was refused.";
        $("login").classList.remove("hidden");
        $("status").textContent = "token refused";
        return;
      }
      if (r.ok) draw(await r.json()); else $("status").textContent = `figures unavailable (${r.status}); retrying`;
    } catch (e) {
      $("status").textContent = "console unreachable; retrying";
    }
    setTimeout(poll, 1000);
  }
  poll();
})();
