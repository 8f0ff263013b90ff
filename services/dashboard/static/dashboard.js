// refold's live dashboard: polls the monitor API and draws its figures as SVG.
//
// Data (all same-origin, "query" scope when the service runs with API keys):
//   GET /v1/processors               processors, their generations (live/building/retired)
//   GET /v1/processors/{p}/lag       lag per partition of the live generation (records, seconds)
//   GET /v1/processors/{p}/stats     processing stats per generation (events, dead letters...)
//   GET /v1/replays                  building generations: progress, rate, ETA
// Throughput is derived here from successive `events` counts of the stats.
//
// The API key comes from the URL fragment (/dashboard#key=...), which browsers never send to
// the server; it is kept in sessionStorage (this tab only), removed from the address bar and
// sent as `Authorization: Bearer`. Every figure carries data-* attributes with its raw numbers
// (tests read those, people read the text).
"use strict";

(() => {
  const REFRESH_MS = 2000; // how often the page polls (the stats move once per micro-batch)
  const HISTORY = 90; // throughput samples kept per generation: 3 minutes at 2 s
  const SPARK_MIN = 30; // the sparkline's x scale spans at least 30 samples (1 minute)
  const RATE_SPAN = 5; // the displayed rate spans the last 5 samples (~10 s), smoothing batches
  const KEY_STORAGE = "refold.dashboard.key";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const KEY_HINT = "open /dashboard#key=<a query key>; make one with `refold keys add --scope query`";

  const root = document.getElementById("dashboard");
  const history = new Map(); // "<processor>/g<generation>" -> [{t, events}]
  let refreshes = 0;
  let timer = null;
  let running = false;

  // -- the API key --------------------------------------------------------------------------

  function takeKeyFromFragment() {
    const params = new URLSearchParams(window.location.hash.slice(1));
    if (params.has("key")) {
      const key = params.get("key").trim();
      if (key) {
        sessionStorage.setItem(KEY_STORAGE, key);
      } else {
        sessionStorage.removeItem(KEY_STORAGE);
      }
      // Out of the address bar, the history and any screenshot of the page.
      window.history.replaceState(null, "", window.location.pathname + window.location.search);
    }
  }

  function apiKey() {
    return sessionStorage.getItem(KEY_STORAGE);
  }

  class AuthError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  async function getJson(path) {
    const headers = { Accept: "application/json" };
    const key = apiKey();
    if (key) headers.Authorization = `Bearer ${key}`;
    const response = await fetch(path, { headers, cache: "no-store", credentials: "omit" });
    let body = null;
    try {
      body = await response.json();
    } catch (_err) {
      body = null;
    }
    if (response.status === 401 || response.status === 403) {
      const message = (body && body.error && body.error.message) || response.statusText;
      throw new AuthError(response.status, message);
    }
    if (!response.ok) {
      const error = (body && body.error) || {};
      throw new Error(`${path}: ${response.status} ${error.code || ""} ${error.message || ""}`.trim());
    }
    return body;
  }

  // -- small helpers ------------------------------------------------------------------------

  function el(tag, attrs = {}, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  function svg(tag, attrs = {}, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  function setAttrs(node, attrs) {
    for (const [name, value] of Object.entries(attrs)) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "text") node.textContent = String(value);
      else node.setAttribute(name, String(value));
    }
  }

  const integer = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
  const decimal = new Intl.NumberFormat("en", { maximumFractionDigits: 1 });

  function fmtCount(n) {
    return n === null || n === undefined ? "–" : integer.format(n);
  }

  function fmtRate(r) {
    if (r === null || r === undefined) return "–";
    return r >= 100 ? integer.format(r) : decimal.format(r);
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 60) return `${decimal.format(s)} s`;
    if (s < 3600) return `${decimal.format(s / 60)} min`;
    if (s < 86400) return `${decimal.format(s / 3600)} h`;
    return `${decimal.format(s / 86400)} d`;
  }

  function fmtTime(ms) {
    return ms ? new Date(ms).toLocaleTimeString() : "–";
  }

  function lagClass(seconds, records) {
    if (!records) return "ok";
    if (seconds === null || seconds === undefined) return "warn";
    return seconds < 10 ? "ok" : seconds < 120 ? "warn" : "bad";
  }

  // -- the stats of one generation, normalised ----------------------------------------------

  // Stats of `generation` out of a /v1/processors/{p}/stats body:
  // {events, batches, duplicates, effects, dead: {reason: n}, last_batch_at, watermark_ms}.
  function generationStats(body, generation) {
    if (!body) return null;
    let entry = null;
    const gens = body.generations;
    if (Array.isArray(gens)) entry = gens.find((g) => Number(g.generation) === generation) || null;
    else if (gens && typeof gens === "object") entry = gens[String(generation)] || null;
    else if (Number(body.generation) === generation) entry = body;
    if (!entry) return null;
    const dead = {};
    const rawDead = entry.dead_letters || entry.dead || {};
    for (const [reason, n] of Object.entries(rawDead)) dead[reason] = Number(n);
    for (const [field, n] of Object.entries(entry)) {
      if (field.startsWith("dead:")) dead[field.slice(5)] = Number(n);
    }
    const num = (v) => (v === null || v === undefined ? null : Number(v));
    const duration = entry.duration || {};
    return {
      meanDurationMs: num(duration.mean_ms),
      events: num(entry.events) ?? 0,
      batches: num(entry.batches) ?? 0,
      duplicates: num(entry.duplicates) ?? 0,
      effects: num(entry.effects) ?? 0,
      dead,
      lastBatchAt: num(entry.last_batch_at),
      watermarkMs: num(entry.watermark_ms),
    };
  }

  // Record a sample; return {rate: events/s over the last samples, rates: per interval}.
  function sampleThroughput(id, events, now) {
    let samples = history.get(id) || [];
    const last = samples[samples.length - 1];
    if (last && events < last.events) samples = []; // the counters were reset
    samples.push({ t: now, events });
    if (samples.length > HISTORY + 1) samples = samples.slice(samples.length - HISTORY - 1);
    history.set(id, samples);
    const rates = [];
    for (let i = 1; i < samples.length; i += 1) {
      const dt = (samples[i].t - samples[i - 1].t) / 1000;
      rates.push(dt > 0 ? (samples[i].events - samples[i - 1].events) / dt : 0);
    }
    let rate = null;
    if (samples.length > 1) {
      const from = samples[Math.max(0, samples.length - 1 - RATE_SPAN)];
      const dt = (now - from.t) / 1000;
      rate = dt > 0 ? (events - from.events) / dt : 0;
    }
    return { rate, rates };
  }

  // -- SVG figures ----------------------------------------------------------------------------

  function sparkline(rates, attrs) {
    const width = 240;
    const height = 44;
    const pad = 2;
    const chart = svg("svg", {
      class: "sparkline",
      viewBox: `0 0 ${width} ${height}`,
      width,
      height,
      role: "img",
      "aria-label": "events per second",
      ...attrs,
    });
    chart.append(svg("rect", { class: "frame", x: 0, y: 0, width, height }));
    if (rates.length === 0) {
      chart.append(svg("text", { class: "axis", x: width / 2, y: height / 2 + 4, "text-anchor": "middle", text: "collecting…" }));
      return chart;
    }
    const max = Math.max(1, ...rates);
    // Grows from the right until SPARK_MIN samples, then compresses up to HISTORY of them.
    const step = (width - 2 * pad) / Math.max(1, Math.max(rates.length, SPARK_MIN) - 1);
    const x0 = width - pad - step * (rates.length - 1);
    const points = rates.map((r, i) => [x0 + i * step, height - pad - (r / max) * (height - 2 * pad)]);
    const line = points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" ");
    const area = `M${x0.toFixed(1)},${height - pad} L${line.replaceAll(" ", " L")} L${points[points.length - 1][0].toFixed(1)},${height - pad} Z`;
    chart.append(svg("path", { class: "area", d: area }));
    chart.append(svg("polyline", { class: "line", points: line }));
    chart.append(svg("text", { class: "axis", x: pad + 2, y: 11, text: `max ${fmtRate(max)}/s` }));
    chart.append(svg("title", { text: `events/s over the last ${rates.length * (REFRESH_MS / 1000)} s` }));
    return chart;
  }

  function bar(value, max, cls, attrs = {}, width = 160) {
    const height = 12;
    const filled = max > 0 ? Math.max(value > 0 ? 2 : 0, (value / max) * width) : 0;
    return svg(
      "svg",
      { class: `bar ${cls}`, viewBox: `0 0 ${width} ${height}`, width, height, role: "img", ...attrs },
      svg("rect", { class: "track", x: 0, y: 0, width, height, rx: 2 }),
      svg("rect", { class: "fill", x: 0, y: 0, width: filled.toFixed(1), height, rx: 2 }),
    );
  }

  // -- sections -------------------------------------------------------------------------------

  function renderGenerations(proc) {
    const list = el("ul", { class: "generations" });
    const gens = [...(proc.generations || [])].sort((a, b) => b.generation - a.generation);
    for (const g of gens) {
      const lag = g.lag_records === null || g.lag_records === undefined ? null : g.lag_records;
      list.append(
        el(
          "li",
          {
            class: `generation ${g.status}${g.running ? " running" : ""}`,
            "data-generation": g.generation,
            "data-status": g.status,
            "data-running": g.running ? "true" : "false",
            "data-applied": g.applied,
            "data-lag-records": lag ?? "",
            "data-runner": g.runner,
            title: `code ${g.code_fingerprint || "?"}; created ${g.created_at ? new Date(g.created_at).toLocaleString() : "?"}; ${g.runner}`,
          },
          el("span", { class: "gen-name", text: `g${g.generation}` }),
          el("span", { class: "gen-status", text: g.status }),
          el("span", { class: "gen-figures", text: `${fmtCount(g.applied)} applied${lag === null ? "" : ` · lag ${fmtCount(lag)}`}` }),
          // Nobody folds a generation readers see (or one being built): say so, and why.
          g.status !== "retired" && !g.running ? el("span", { class: "gen-runner", text: g.runner }) : null,
        ),
      );
    }
    if (gens.length === 0) list.append(el("li", { class: "empty", text: "no generation yet" }));
    return list;
  }

  function renderLag(lag) {
    if (!lag) return el("p", { class: "empty", text: "no live generation" });
    if (lag.error) return el("p", { class: "error", text: `lag unavailable: ${lag.error}` });
    const parts = lag.partitions || [];
    const max = Math.max(0, ...parts.map((p) => p.lag_records || 0));
    const table = el(
      "table",
      { class: "lag", "data-generation": lag.generation },
      el("thead", {}, el("tr", {}, ...["partition", "lag", "records", "seconds", "position / end"].map((h) => el("th", { text: h })))),
    );
    const body = el("tbody");
    for (const p of parts) {
      const cls = lagClass(p.lag_seconds, p.lag_records);
      body.append(
        el(
          "tr",
          {
            class: `partition ${cls}`,
            "data-topic": p.topic,
            "data-partition": p.partition,
            "data-position": p.position ?? "",
            "data-end": p.end ?? "",
            "data-lag-records": p.lag_records ?? "",
            "data-lag-seconds": p.lag_seconds ?? "",
          },
          el("td", { class: "name", text: `${p.topic}/${p.partition}` }),
          el("td", {}, bar(p.lag_records || 0, max, cls, { "aria-label": `lag ${p.lag_records} records` })),
          el("td", { class: "num", text: fmtCount(p.lag_records) }),
          el("td", { class: "num", text: fmtSeconds(p.lag_seconds) }),
          el("td", { class: "num dim", text: `${fmtCount(p.position)} / ${fmtCount(p.end)}` }),
        ),
      );
    }
    if (parts.length === 0) body.append(el("tr", {}, el("td", { colspan: 5, class: "empty", text: "no partitions" })));
    table.append(body);
    return table;
  }

  function renderProcessor(proc, detail, now) {
    const live = proc.live_generation;
    if ((live === null || live === undefined) && (proc.generations || []).length === 0) {
      // Registered but never run: a compact chip (the description in its tooltip).
      const chip = el(
        "article",
        {
          class: "processor idle",
          "data-processor": proc.name,
          "data-live-generation": "",
          title: [proc.description, (proc.topics || []).join(", ")].filter(Boolean).join("\n"),
        },
        el("span", { class: "name", text: proc.name }),
      );
      return { card: chip, idle: true, rate: null, lagRecords: null, dead: {}, live };
    }
    const lag = detail.lag;
    const stats = detail.stats;
    let throughput = { rate: null, rates: [] };
    if (stats && live !== null && live !== undefined) {
      throughput = sampleThroughput(`${proc.name}/g${live}`, stats.events, now);
    }
    const lagRecords = lag && !lag.error ? lag.lag_records : null;
    const lagSeconds = lag && !lag.error ? lag.lag_seconds : null;
    const deadTotal = stats ? Object.values(stats.dead).reduce((a, b) => a + b, 0) : null;
    const watermarkDelay = stats && stats.watermarkMs ? Math.max(0, (now - stats.watermarkMs) / 1000) : null;
    const card = el("article", {
      class: `processor ${lagClass(lagSeconds, lagRecords)}`,
      "data-processor": proc.name,
      "data-live-generation": live ?? "",
      "data-lag-records": lagRecords ?? "",
      "data-lag-seconds": lagSeconds ?? "",
      "data-throughput": throughput.rate === null ? "" : throughput.rate.toFixed(3),
      "data-events": stats ? stats.events : "",
      "data-dead-letters": deadTotal ?? "",
    });
    card.append(
      el(
        "header",
        {},
        el("h3", { text: proc.name }),
        live === null || live === undefined
          ? el("span", { class: "live-gen none", text: "no live generation yet" })
          : el("span", { class: "live-gen", text: `live g${live}` }),
        el("p", { class: "desc", text: proc.description || "" }),
        el("p", { class: "topics dim", text: (proc.topics || []).join(", ") }),
      ),
      renderGenerations(proc),
    );
    const figures = el("div", { class: "figures" });
    figures.append(
      el(
        "div",
        { class: "throughput" },
        el("span", { class: "label", text: "events / s" }),
        el("span", { class: "value", "data-figure": "throughput", text: fmtRate(throughput.rate) }),
        sparkline(throughput.rates, { "data-chart": "throughput", "data-processor": proc.name }),
      ),
      el(
        "dl",
        { class: "stats" },
        ...(stats
          ? [
              ["applied", fmtCount(stats.events)],
              ["batches", fmtCount(stats.batches)],
              ["duplicates", fmtCount(stats.duplicates)],
              ["effects", fmtCount(stats.effects)],
              ["dead letters", fmtCount(deadTotal)],
              ["batch time (mean)", stats.meanDurationMs === null ? "–" : `${integer.format(stats.meanDurationMs)} ms`],
              ["watermark delay", fmtSeconds(watermarkDelay)],
              ["last batch", fmtTime(stats.lastBatchAt)],
            ]
          : [["stats", detail.statsError ? `unavailable: ${detail.statsError}` : "none yet"]]
        ).flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]),
      ),
    );
    if (live === null || live === undefined) {
      // Generations but none live yet (a first build): no figures of a live generation.
      return { card, idle: false, rate: null, lagRecords: null, dead: {}, live };
    }
    card.append(
      figures,
      el("h4", { text: `lag per partition${lagRecords === null ? "" : `: ${fmtCount(lagRecords)} records, ${fmtSeconds(lagSeconds)}`}` }),
      renderLag(lag),
    );
    return { card, idle: false, rate: throughput.rate, lagRecords, dead: stats ? stats.dead : {}, live };
  }

  function renderReplays(replays) {
    const box = document.getElementById("replays");
    box.replaceChildren();
    if (replays.length === 0) {
      box.append(el("p", { class: "empty", text: "no replay running" }));
      return;
    }
    for (const r of replays) {
      const percent = r.percent === null || r.percent === undefined ? null : Number(r.percent);
      box.append(
        el(
          "div",
          {
            class: "replay",
            "data-replay-processor": r.processor,
            "data-replay-generation": r.generation,
            "data-replay-done": r.done ?? "",
            "data-replay-total": r.total ?? "",
            "data-replay-percent": percent ?? "",
            "data-replay-eta-s": r.eta_s ?? "",
          },
          el("span", { class: "name", text: `${r.processor} g${r.generation}` }),
          bar(percent ?? 0, 100, "progress", { "aria-label": `replay ${percent ?? "?"}%` }, 320),
          el("span", { class: "num", text: `${percent === null ? "–" : decimal.format(percent)} %` }),
          el("span", { class: "dim", text: `${fmtCount(r.done)} / ${fmtCount(r.total)} records` }),
          el("span", { class: "dim", text: `${fmtRate(r.rate)} rec/s` }),
          el("span", { class: "eta", text: `ETA ${r.eta_s === null || r.eta_s === undefined ? "–" : fmtSeconds(r.eta_s)}` }),
          el("span", { class: "dim", text: `started ${fmtTime(r.started_at)}` }),
        ),
      );
    }
  }

  function renderDeadLetters(rows) {
    const box = document.getElementById("dead-letters");
    box.replaceChildren();
    const nonzero = rows.filter((r) => r.count > 0);
    if (nonzero.length === 0) {
      box.append(el("p", { class: "empty", text: "none" }));
      return;
    }
    const max = Math.max(...nonzero.map((r) => r.count));
    const table = el(
      "table",
      { class: "dead" },
      el("thead", {}, el("tr", {}, ...["processor", "generation", "reason", "", "count"].map((h) => el("th", { text: h })))),
    );
    const body = el("tbody");
    for (const r of nonzero.sort((a, b) => b.count - a.count)) {
      body.append(
        el(
          "tr",
          {
            "data-dead-processor": r.processor,
            "data-dead-generation": r.generation,
            "data-dead-reason": r.reason,
            "data-dead-count": r.count,
          },
          el("td", { text: r.processor }),
          el("td", { text: `g${r.generation}` }),
          el("td", { class: "reason", text: r.reason }),
          el("td", {}, bar(r.count, max, "dead", { "aria-label": `${r.count} dead letters` })),
          el("td", { class: "num", text: fmtCount(r.count) }),
        ),
      );
    }
    table.append(body);
    box.append(table);
  }

  // -- one refresh ---------------------------------------------------------------------------

  async function loadDetail(proc) {
    const live = proc.live_generation;
    if (live === null || live === undefined) return { lag: null, stats: null };
    const name = encodeURIComponent(proc.name);
    const [lag, stats] = await Promise.allSettled([
      getJson(`/v1/processors/${name}/lag`),
      getJson(`/v1/processors/${name}/stats`),
    ]);
    for (const result of [lag, stats]) {
      if (result.status === "rejected" && result.reason instanceof AuthError) throw result.reason;
    }
    return {
      lag: lag.status === "fulfilled" ? lag.value : { error: String(lag.reason.message || lag.reason) },
      stats: stats.status === "fulfilled" ? generationStats(stats.value, live) : null,
      statsError: stats.status === "rejected" ? String(stats.reason.message || stats.reason) : null,
    };
  }

  async function refresh() {
    const [listing, replayBody] = await Promise.all([getJson("/v1/processors"), getJson("/v1/replays")]);
    // Processors with a live generation first, each group by name.
    const processors = [...(listing.processors || [])].sort(
      (a, b) =>
        Number(a.live_generation === null || a.live_generation === undefined) -
          Number(b.live_generation === null || b.live_generation === undefined) ||
        a.name.localeCompare(b.name),
    );
    const details = await Promise.all(processors.map(loadDetail));
    const now = Date.now();

    const cards = [];
    const idle = [];
    const dead = [];
    let totalRate = null;
    let totalLag = 0;
    for (const [i, proc] of processors.entries()) {
      const view = renderProcessor(proc, details[i], now);
      (view.idle ? idle : cards).push(view.card);
      if (view.rate !== null) totalRate = (totalRate || 0) + view.rate;
      totalLag += view.lagRecords || 0;
      for (const [reason, count] of Object.entries(view.dead)) {
        dead.push({ processor: proc.name, generation: view.live, reason, count });
      }
    }
    const box = document.getElementById("processors");
    box.replaceChildren(...cards);
    if (processors.length === 0) box.append(el("p", { class: "empty", text: "no processor registered" }));
    const idleBox = document.getElementById("idle-processors");
    idleBox.replaceChildren(el("span", { class: "label", text: "not run yet:" }), ...idle);
    idleBox.hidden = idle.length === 0;

    const replays = replayBody.replays || [];
    renderReplays(replays);
    renderDeadLetters(dead);
    const deadTotal = dead.reduce((a, r) => a + r.count, 0);
    setSummary("summary-processors", processors.length, fmtCount(processors.length));
    setSummary("summary-throughput", totalRate === null ? "" : totalRate.toFixed(3), fmtRate(totalRate));
    setSummary("summary-lag", totalLag, fmtCount(totalLag));
    setSummary("summary-replays", replays.length, fmtCount(replays.length));
    setSummary("summary-dead", deadTotal, fmtCount(deadTotal));
  }

  function setSummary(id, raw, text) {
    const node = document.getElementById(id);
    node.textContent = text;
    node.dataset.value = String(raw);
  }

  function showState(state, text) {
    root.dataset.state = state;
    document.getElementById("status").textContent = text;
    document.getElementById("auth-message").hidden = state !== "auth";
    const errorBox = document.getElementById("error-message");
    errorBox.hidden = state !== "error";
    if (state !== "error") errorBox.textContent = "";
  }

  async function tick() {
    timer = null;
    if (document.visibilityState === "hidden") {
      schedule();
      return;
    }
    running = true;
    try {
      await refresh();
      refreshes += 1;
      root.dataset.refreshes = String(refreshes);
      root.dataset.updatedAt = String(Date.now());
      showState("ok", `updated ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      if (err instanceof AuthError) {
        const why = err.status === 403 ? "This API key may not read the monitor API (it needs the query scope)" : apiKey() ? "This API key was refused" : "No API key given";
        document.getElementById("auth-detail").textContent = `${why}: ${err.status} ${err.message}`;
        showState("auth", `${err.status}: ${KEY_HINT}`);
      } else {
        showState("error", "refresh failed; retrying");
        document.getElementById("error-message").textContent = `Refresh failed: ${err.message || err}. Showing the last figures; retrying every ${REFRESH_MS / 1000} s.`;
      }
    } finally {
      running = false;
    }
    schedule();
  }

  function schedule() {
    if (timer === null) timer = window.setTimeout(tick, REFRESH_MS);
  }

  function refreshNow() {
    if (running) return; // the refresh under way schedules the next one
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
    tick();
  }

  takeKeyFromFragment();
  window.addEventListener("hashchange", () => {
    takeKeyFromFragment();
    refreshNow();
  });
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible") refreshNow();
  });
  document.getElementById("interval").textContent = String(REFRESH_MS / 1000);
  refreshNow();
})();
