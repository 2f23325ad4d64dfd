// hdsd's fleet page. Plain JavaScript, no dependencies.
//
// Data: GET /api/v1/dataplanes (page by page, following nextPageToken),
// GET /api/v1/fleet/summary (the counts and the services, counted by hdsd
// so they are right whatever the page holds) and /api/v1/sources, then
// GET /api/v1/watch (Server-Sent Events) read with fetch(), so the token
// travels in the Authorization header and never in a URL. Each change event
// names one dataplane: the page fetches that dataplane and updates its row in
// place. Memory stays bounded: one entry per dataplane, no list of events.
// On a global, GET /api/v1/zones every ZONES_EVERY_MS feeds the zones panel
// (its last-seen ages move with time); the watch carries every zone's
// dataplanes too (fetched from /api/v1/zones/{zone}/dataplanes/...), and a
// zone's state change (zone_changed, zone_deleted) reloads the list, whose
// rows show each dataplane's zone state.
// The last hour (GET /api/v1/history every HISTORY_EVERY_MS, and a
// dataplane's .../history while its detail is open) is drawn as inline SVG:
// the fleet's inbounds not ready per bucket, each zone's states, and in the
// detail the band of the dataplane's status changes. hdsd bounds it.
'use strict';

(() => {
  const TOKEN_KEY = 'hdsd.apiToken';
  const MAX_ROWS = 500; // rows in the DOM at once; the filter narrows larger fleets
  const PAGE_SIZE = 5000; // the API's largest page
  // Past one API page of dataplanes the page holds only the rows it shows:
  // MAX_ROWS of them, filtered by hdsd (service, zone, not ready), and the
  // counts from the summary. A 100k fleet is not fetched into the browser.
  const LARGE_FLEET = PAGE_SIZE;
  const SNAPSHOT_PAGE = 1000; // items per snapshot event of the watch
  const BATCH_REFETCH = 25; // more changed dataplanes than this: reload the list
  const SOURCES_EVERY_MS = 2000;
  const ZONES_EVERY_MS = 1000;
  const HISTORY_EVERY_MS = 5000;
  const SVG = 'http://www.w3.org/2000/svg';
  const ZONE_STATE = {
    online: { text: 'Online', kind: 'ok', mark: '●' },
    offline: { text: 'Offline', kind: 'bad', mark: '○' },
    disabled: { text: 'Disabled', kind: 'idle', mark: '–' },
    never_connected: { text: 'Never connected', kind: 'warn', mark: '?' },
  };
  // Reports that change nothing send no event: the list is re-read now and
  // then so "last report" stays true (less often for large fleets).
  const refreshEveryMs = () => Math.max(5000, state.dataplanes.size * 5);
  const SERVICE_TAG = 'kuma.io/service';

  // Severity of each status: ok (ready), wait, warn, bad. Colour and symbol
  // follow it; the status word is always shown too.
  const STATUS = {
    healthy: { kind: 'ok', mark: '✓', rank: 0 },
    not_probed: { kind: 'idle', mark: '–', rank: 1 },
    pending: { kind: 'wait', mark: '…', rank: 2 },
    draining: { kind: 'warn', mark: '!', rank: 3 },
    degraded: { kind: 'warn', mark: '!', rank: 3 },
    unknown: { kind: 'warn', mark: '?', rank: 4 },
    stale: { kind: 'warn', mark: '!', rank: 5 },
    timeout: { kind: 'bad', mark: '✕', rank: 6 },
    unhealthy: { kind: 'bad', mark: '✕', rank: 6 },
    unsupported: { kind: 'bad', mark: '✕', rank: 6 },
  };
  // A dataplane's word in its history: ready, its worst class, or deleted.
  const BAND = {
    ready: { kind: 'ok', text: 'ready' },
    pending: { kind: 'wait', text: 'pending' },
    draining: { kind: 'warn', text: 'draining' },
    stale: { kind: 'warn', text: 'stale' },
    not_ready: { kind: 'warn', text: 'not ready' },
    unhealthy: { kind: 'bad', text: 'unhealthy' },
    unsupported: { kind: 'bad', text: 'unsupported' },
    zone_withdrawn: { kind: 'bad', text: 'zone withdrawn' },
    deleted: { kind: 'idle', text: 'deleted' },
    online: { kind: 'ok', text: 'online' },
    offline: { kind: 'bad', text: 'offline' },
    disabled: { kind: 'idle', text: 'disabled' },
    never_connected: { kind: 'warn', text: 'never connected' },
  };
  // Classes of not ready, stacked worst at the bottom (as hdsd orders them).
  const CLASSES = ['unhealthy', 'unsupported', 'zone_withdrawn', 'stale', 'not_ready', 'draining', 'pending'];
  const SERVICE_STATUS = {
    online: { text: 'Online', kind: 'ok', mark: '✓' },
    partially_degraded: { text: 'Partially degraded', kind: 'warn', mark: '!' },
    offline: { text: 'Offline', kind: 'bad', mark: '✕' },
  };

  const state = {
    config: { tokenRequired: false },
    dataplanes: new Map(), // "mesh/name" -> the API item
    loaded: false, // the list has been fetched once: until then the table says Loading...
    services: [],
    summary: null, // GET /api/v1/fleet/summary: the counts
    zones: [], // GET /api/v1/zones items (a global's)
    zoneFilter: '',
    sort: { key: 'name', dir: 1 },
    filter: '',
    notReadyOnly: false,
    lastEventId: null,
    pending: new Set(), // dataplanes to fetch after change events
    reloadAll: false, // fetch the whole list (after a snapshot)
    inSnapshot: false, // between a snapshot's first page and SYNCED
    large: false, // more dataplanes than LARGE_FLEET: the list is filtered by hdsd
    more: false, // large: more dataplanes match than the rows held
    fetching: false,
    watch: null, // the AbortController of the open stream
    generation: 0, // bumped on every restart (new token): older loops stop
    detailKey: null,
    history: null, // GET /api/v1/history
    detailHistory: null, // {key, history} of the open detail
  };
  const rows = new Map(); // "mesh/name" -> <tr>

  const $ = (id) => document.getElementById(id);
  // A zone's dataplane is keyed by its zone too: "default/web-1" may be in two.
  const key = (item) => (item.zone ? `${item.zone.name}:` : '') + `${item.mesh}/${item.name}`;
  // A watch event names its dataplane's zone by name only.
  const eventKey = (d) => (d.zone ? `${d.zone}:` : '') + `${d.mesh}/${d.name}`;
  /** The API path of the dataplane a key names (zone names hold no ':' or '/'). */
  function pathOf(k) {
    const colon = k.indexOf(':');
    const slash = k.indexOf('/');
    const zone = colon >= 0 && colon < slash ? k.slice(0, colon) : null;
    const rest = zone === null ? k : k.slice(colon + 1);
    const [mesh, ...name] = rest.split('/');
    const tail = `dataplanes/${encodeURIComponent(mesh)}/${encodeURIComponent(name.join('/'))}`;
    return zone === null ? `/api/v1/${tail}` : `/api/v1/zones/${encodeURIComponent(zone)}/${tail}`;
  }
  const zoneOf = (item) => (item.zone ? item.zone.name : 'local');

  // ------------------------------------------------------------ DOM helpers

  /** Creates an element: h('td', {class: 'x'}, child, 'text', ...). */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === false || value === null || value === undefined) continue;
      if (name === 'class') el.className = value;
      else if (name === 'text') el.textContent = value;
      else el.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  /** Creates an SVG element: svg('rect', {x: 1}, child, ...). */
  function svg(tag, attrs, ...children) {
    const el = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === false || value === null || value === undefined) continue;
      if (name === 'class') el.setAttribute('class', value);
      else el.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  }

  const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });

  function setText(el, text) {
    if (el.textContent !== text) el.textContent = text;
  }

  function relative(ts, now) {
    if (!ts) return 'never';
    const s = Math.round((now - Date.parse(ts)) / 1000);
    if (s < -86400) return `in ${Math.floor(-s / 86400)}d ${Math.floor((-s % 86400) / 3600)}h`;
    if (s < -3600) return `in ${Math.floor(-s / 3600)}h ${Math.floor((-s % 3600) / 60)}m`;
    if (s < -60) return `in ${Math.floor(-s / 60)}m`;
    if (s < 1) return 'just now';
    if (s < 60) return `${s}s ago`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s ago`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m ago`;
    return `${Math.floor(s / 86400)}d ago`;
  }

  /** A <time> that the clock keeps relative. */
  function time(ts) {
    if (!ts) return h('span', { class: 'muted' }, 'never');
    return h('time', { datetime: ts, title: new Date(ts).toLocaleString(), 'data-ts': ts },
      relative(ts, Date.now()));
  }

  function statusBadge(status) {
    const s = STATUS[status] || { kind: 'warn', mark: '?', rank: 4 };
    return h('span', { class: `badge k-${s.kind}`, 'data-status': status },
      h('span', { 'aria-hidden': 'true' }, s.mark), ' ', status.replace('_', ' '));
  }

  function service(inbound) {
    return inbound.tags[SERVICE_TAG] || '—';
  }

  function target(inbound) {
    const addr = inbound.serviceAddress.includes(':') ? `[${inbound.serviceAddress}]` : inbound.serviceAddress;
    return `${addr}:${inbound.servicePort}`;
  }

  function isReady(item) {
    return item.inbounds.every((i) => i.health.ready);
  }

  // ------------------------------------------------------------ API access

  class Unauthorized extends Error {}

  async function api(path, options = {}) {
    const headers = new Headers(options.headers || {});
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.set('Authorization', `Bearer ${token}`);
    const response = await fetch(path, { ...options, headers, cache: 'no-store' });
    if (response.status === 401) {
      let message = 'the API refused the token';
      try { message = (await response.json()).error || message; } catch (_) { /* keep */ }
      throw new Unauthorized(message);
    }
    if (!response.ok) {
      let message = `${path}: HTTP ${response.status}`;
      try { message = `${path}: ${(await response.json()).error}`; } catch (_) { /* keep */ }
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return response;
  }

  const json = async (path) => (await api(path)).json();

  // ------------------------------------------------------------ token

  let tokenPrompt = null;

  /** Shows the token dialog; resolves once a token is stored. */
  function askToken(reason) {
    if (tokenPrompt) return tokenPrompt;
    const dialog = $('token-dialog');
    const error = $('token-error');
    error.hidden = !reason;
    error.textContent = reason ? `The token was refused: ${reason}.` : '';
    $('token-input').value = '';
    setLive('token', 'Needs an API token');
    tokenPrompt = new Promise((resolve) => {
      const form = $('token-form');
      const done = (event) => {
        event.preventDefault();
        const value = $('token-input').value.trim();
        if (!value) return;
        sessionStorage.setItem(TOKEN_KEY, value);
        form.removeEventListener('submit', done);
        dialog.close();
        tokenPrompt = null;
        resolve();
      };
      form.addEventListener('submit', done);
    });
    if (!dialog.open) dialog.showModal();
    $('token-input').focus();
    return tokenPrompt;
  }

  async function onUnauthorized(error) {
    sessionStorage.removeItem(TOKEN_KEY);
    stopWatch();
    await askToken(error.message);
    restart();
  }

  // ------------------------------------------------------------ loading

  /**
   * The filters hdsd applies to a large fleet's list: not ready, the zone,
   * and a filter word that is a service's name.
   */
  function serverFilters() {
    const params = [];
    if (state.notReadyOnly) params.push('ready=false');
    if (state.zoneFilter) params.push(`zone=${encodeURIComponent(state.zoneFilter)}`);
    const words = state.filter.trim().split(/\s+/).filter(Boolean);
    const service = words.find((w) => state.services.some((s) => s.name === w));
    if (service) params.push(`service=${encodeURIComponent(service)}`);
    return params;
  }

  async function loadDataplanes() {
    state.large = (state.summary?.dataplanes.total ?? 0) > LARGE_FLEET;
    if (state.large) {
      // One page of the rows shown, filtered by hdsd.
      const query = [`page_size=${MAX_ROWS}`, ...serverFilters()].join('&');
      const page = await json(`/api/v1/dataplanes?${query}`);
      const fresh = new Map();
      for (const item of page.items) fresh.set(key(item), item);
      state.dataplanes = fresh;
      state.more = Boolean(page.nextPageToken);
      state.loaded = true;
      renderAll();
      return;
    }
    state.more = false;
    const fresh = new Map();
    let token = '';
    do {
      const query = `page_size=${PAGE_SIZE}` + (token ? `&page_token=${encodeURIComponent(token)}` : '');
      const page = await json(`/api/v1/dataplanes?${query}`);
      for (const item of page.items) fresh.set(key(item), item);
      token = page.nextPageToken || '';
    } while (token);
    state.dataplanes = fresh;
    state.loaded = true;
    renderAll();
  }

  /** The counts and the services, as hdsd counts them. */
  async function loadServices() {
    const summary = await json('/api/v1/fleet/summary');
    state.summary = summary;
    state.services = summary.services;
    renderCounts();
    renderServices();
  }

  /** `load` once, `ms` after the first of a burst of calls. */
  function coalesced(load, ms) {
    let timer = null;
    return () => {
      if (timer) return;
      timer = setTimeout(() => {
        timer = null;
        load().catch(handleError);
      }, ms);
    };
  }

  const scheduleServices = coalesced(() => loadServices(), 150);

  /** A large fleet's rows again, at most every 500 ms. */
  const scheduleWindow = coalesced(async () => {
    state.reloadAll = true;
    await fetchPending();
  }, 500);

  /** The table at once; a large fleet's rows from hdsd with the new filters. */
  function filtersChanged() {
    renderTable();
    if (state.large) scheduleWindow();
  }

  /**
   * Brings the map up to date: the whole list after a snapshot (or many
   * changes), else each changed dataplane. One batch at a time, so an older
   * answer never overwrites a newer one.
   */
  async function fetchPending() {
    if (state.fetching) return;
    state.fetching = true;
    try {
      while (state.reloadAll || state.pending.size > 0) {
        if (state.reloadAll || state.pending.size > BATCH_REFETCH) {
          state.reloadAll = false;
          state.pending.clear();
          await loadDataplanes();
        } else {
          const keys = [...state.pending];
          state.pending.clear();
          await Promise.all(keys.map(async (k) => {
            try {
              state.dataplanes.set(k, await json(pathOf(k)));
            } catch (e) {
              if (e.status === 404) state.dataplanes.delete(k);
              else throw e;
            }
          }));
          renderAll();
        }
        scheduleServices();
      }
    } catch (e) {
      // Whatever was missed is fetched again once the API answers.
      state.reloadAll = true;
      setTimeout(() => fetchPending().catch(handleError), 1000);
      throw e;
    } finally {
      state.fetching = false;
    }
  }

  async function pollSources(generation) {
    let historyAt = 0;
    while (generation === state.generation) {
      try {
        renderBanner(await json('/api/v1/sources'));
        if (Date.now() - historyAt >= HISTORY_EVERY_MS) {
          historyAt = Date.now();
          await loadHistory();
        }
      } catch (e) {
        if (e instanceof Unauthorized) { onUnauthorized(e); return; }
        // The watch loop reports connection trouble; try again later.
      }
      await sleep(SOURCES_EVERY_MS);
    }
  }

  /** The fleet's last hour, and the open detail's band. */
  async function loadHistory() {
    state.history = await json('/api/v1/history');
    renderTimeline();
    await loadDetailHistory();
  }

  async function loadDetailHistory() {
    const k = state.detailKey;
    if (!k) return;
    let history = null;
    try {
      history = await json(`${pathOf(k)}/history`);
    } catch (e) {
      if (e.status !== 404) throw e;
    }
    if (state.detailKey !== k) return;
    state.detailHistory = { key: k, history };
    renderBand();
  }

  /** On a global: the zones panel, and the list again when a zone moved. */
  async function pollZones(generation) {
    while (generation === state.generation) {
      try {
        const answer = await json('/api/v1/zones');
        state.zones = answer.items || [];
        renderZones();
      } catch (e) {
        if (e instanceof Unauthorized) { onUnauthorized(e); return; }
      }
      await sleep(ZONES_EVERY_MS);
    }
  }

  async function refreshTimes(generation) {
    for (;;) {
      await sleep(refreshEveryMs());
      if (generation !== state.generation) return;
      if (document.body.dataset.live !== 'live') continue;
      state.reloadAll = true;
      fetchPending().catch(handleError);
    }
  }

  // ------------------------------------------------------------ the watch

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  function stopWatch() {
    state.generation += 1;
    if (state.watch) state.watch.abort();
    state.watch = null;
  }

  /** Follows /api/v1/watch until the page's generation changes; reconnects with Last-Event-ID. */
  async function follow(generation) {
    let backoff = 500;
    while (generation === state.generation) {
      const controller = new AbortController();
      state.watch = controller;
      try {
        const headers = { Accept: 'text/event-stream' };
        if (state.lastEventId !== null) headers['Last-Event-ID'] = state.lastEventId;
        // The snapshot in pages: the page reloads its list once per snapshot
        // and never reads a large fleet's whole snapshot as one string.
        const response = await api(`/api/v1/watch?snapshot_page_size=${SNAPSHOT_PAGE}`, { headers, signal: controller.signal });
        await readEvents(response.body, (event) => {
          if (event.kind === 'synced') backoff = 500;
          onEvent(event);
        });
      } catch (e) {
        if (generation !== state.generation) return;
        if (e instanceof Unauthorized) { onUnauthorized(e); return; }
      }
      if (generation !== state.generation) return;
      setLive('reconnecting', 'Reconnecting…');
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 10000);
    }
  }

  /** Parses a text/event-stream body; calls onEvent({kind, id, data}) per event. */
  async function readEvents(body, onEvent) {
    const reader = body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let event = { kind: 'message', id: null, data: '' };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let newline;
      while ((newline = buffer.search(/\r\n|\r|\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith('\r\n', newline) ? 2 : 1));
        if (line === '') {
          if (event.data !== '') onEvent(event);
          event = { kind: 'message', id: null, data: '' };
          continue;
        }
        if (line.startsWith(':')) continue; // keep-alive comment
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        let v = colon < 0 ? '' : line.slice(colon + 1);
        if (v.startsWith(' ')) v = v.slice(1);
        if (field === 'event') event.kind = v;
        else if (field === 'data') event.data += (event.data ? '\n' : '') + v;
        else if (field === 'id') event.id = v;
      }
    }
  }

  function onEvent(event) {
    if (event.id !== null && event.id !== '') state.lastEventId = event.id;
    let data;
    try { data = JSON.parse(event.data); } catch (_) { return; }
    switch (event.kind) {
      case 'snapshot':
        // The stream starts (or starts over): reload the whole list once,
        // on the first of the snapshot's pages.
        if (state.inSnapshot) break;
        state.inSnapshot = true;
        state.reloadAll = true;
        fetchPending().catch(handleError);
        break;
      case 'changed':
        if (state.large && !state.dataplanes.has(eventKey(data.dataplane))) {
          // Outside the rows held: it may match the filters now.
          scheduleWindow();
          break;
        }
        state.pending.add(eventKey(data.dataplane));
        fetchPending().catch(handleError);
        break;
      case 'deleted':
        state.pending.delete(eventKey(data.dataplane));
        state.dataplanes.delete(eventKey(data.dataplane));
        renderAll();
        scheduleServices();
        break;
      case 'zone_changed':
      case 'zone_deleted':
        // Every row of the zone shows its state: reload the list once.
        state.reloadAll = true;
        fetchPending().catch(handleError);
        break;
      case 'synced':
        state.inSnapshot = false;
        setLive('live', 'Live');
        break;
      default:
        state.inSnapshot = false;
        break; // resync: a snapshot follows
    }
  }

  function handleError(e) {
    if (e instanceof Unauthorized) { onUnauthorized(e); return; }
    // A failed fetch during a drop: the watch loop shows "reconnecting" and
    // the events after it bring the rows up to date.
    setLive('reconnecting', 'Reconnecting…');
  }

  function setLive(kind, text) {
    const el = $('live');
    el.className = `live live-${kind}`;
    setText(el, text || el.textContent);
    document.body.dataset.live = kind;
  }

  // ------------------------------------------------------------ rendering

  function renderAll() {
    renderCounts();
    renderTable();
    renderDetail();
  }

  /** The tiles: hdsd's counts (GET /api/v1/fleet/summary) once read. */
  function renderCounts() {
    const summary = state.summary;
    if (!summary) return;
    const total = summary.dataplanes.total;
    const connected = summary.dataplanes.connected;
    const ready = summary.inbounds.ready;
    const notReady = summary.inbounds.notReady;
    const byStatus = new Map(Object.entries(summary.inbounds.byStatus));
    const tiles = [
      ['dataplanes', 'Dataplanes', total, null],
      ['connected', 'Connected', connected, connected < total ? 'warn' : null],
      ['ready', 'Inbounds ready', ready, 'ok'],
      ['not-ready', 'Inbounds not ready', notReady, notReady > 0 ? 'bad' : null],
    ];
    const statuses = [...byStatus.entries()].sort((a, b) => (STATUS[a[0]]?.rank ?? 9) - (STATUS[b[0]]?.rank ?? 9));
    const signature = JSON.stringify([tiles, statuses]);
    const counts = $('counts');
    if (counts.dataset.signature === signature) return;
    counts.dataset.signature = signature;
    counts.replaceChildren(
      h('dl', { class: 'tiles' }, tiles.map(([id, label, n, kind]) =>
        h('div', { class: `tile${kind ? ` k-${kind}` : ''}`, 'data-count': id },
          h('dt', {}, label), h('dd', {}, String(n))))),
      h('p', { class: 'by-status' }, h('span', { class: 'muted' }, 'By status: '),
        statuses.length === 0 ? 'no inbounds' : statuses.map(([status, n]) =>
          h('span', { class: 'by-status-item', 'data-status-count': status }, statusBadge(status), ` ${n}`))),
    );
  }

  function renderZones() {
    const zones = state.zones;
    const global = zones.length > 0;
    $('zones-section').hidden = !global;
    document.body.classList.toggle('has-zones', global);
    const select = $('zone-filter');
    const options = ['', 'local', ...zones.map((z) => z.name)];
    if (select.dataset.options !== options.join(',')) {
      select.dataset.options = options.join(',');
      select.replaceChildren(...options.map((v) =>
        h('option', { value: v }, v === '' ? 'All zones' : v === 'local' ? "This hdsd's own" : v)));
      select.value = options.includes(state.zoneFilter) ? state.zoneFilter : '';
    }
    const now = Date.now();
    $('zones').replaceChildren(...zones.map((z) => {
      const st = ZONE_STATE[z.state] || { text: z.state, kind: 'warn', mark: '?' };
      return h('li', { class: `service zone k-${st.kind}`, 'data-zone': z.name, 'data-zone-state': z.state },
        h('span', { class: 'service-name' }, z.name),
        h('span', { class: 'service-ready' }, `${z.inbounds.ready}/${z.inbounds.total} ready`,
          z.withdrawn ? h('span', { class: 'muted' }, ' (withdrawn)') : null),
        h('span', { class: `badge k-${st.kind}` }, h('span', { 'aria-hidden': 'true' }, st.mark), ' ', st.text),
        z.lastSeen
          ? h('span', { class: 'muted zone-seen' }, 'last seen ', h('time', { datetime: z.lastSeen, 'data-ts': z.lastSeen, title: z.lastSeen }, relative(z.lastSeen, now)))
          : h('span', { class: 'muted zone-seen' }, 'never seen'));
    }));
  }

  function zoneBadge(item) {
    if (!item.zone) return h('span', { class: 'muted' }, 'local');
    const st = ZONE_STATE[item.zone.state] || { text: item.zone.state, kind: 'warn', mark: '?' };
    return h('span', { class: `zone-tag k-${st.kind}`, 'data-zone': item.zone.name },
      item.zone.name, ' ', h('span', { class: `badge k-${st.kind}` }, h('span', { 'aria-hidden': 'true' }, st.mark), ' ', st.text));
  }

  function renderServices() {
    const list = $('services');
    $('services-empty').hidden = state.services.length > 0;
    list.replaceChildren(...state.services.map((s) => {
      const st = SERVICE_STATUS[s.status] || { text: s.status, kind: 'warn', mark: '?' };
      return h('li', { class: `service k-${st.kind}`, 'data-service': s.name },
        h('span', { class: 'service-name' }, s.name, s.mesh !== 'default' ? h('span', { class: 'muted' }, ` (${s.mesh})`) : null),
        h('span', { class: 'service-ready' }, `${s.inboundsReady}/${s.inboundsTotal} ready`),
        h('span', { class: `badge k-${st.kind}` }, h('span', { 'aria-hidden': 'true' }, st.mark), ' ', st.text),
        (s.zones || []).length === 0 ? null : h('ul', { class: 'service-zones muted' }, s.zones.map((z) => {
          const zs = SERVICE_STATUS[z.status] || { text: z.status, kind: 'warn', mark: '?' };
          return h('li', { 'data-service-zone': z.zone, class: `k-${zs.kind}` },
            `${z.zone}: ${z.inboundsReady}/${z.inboundsTotal} ready, ${zs.text.toLowerCase()}`);
        })));
    }));
  }

  /** What the filter box matches against. */
  function haystack(item) {
    const parts = [`${item.mesh}.${item.name}`, item.address, zoneOf(item)];
    for (const i of item.inbounds) {
      parts.push(service(i), target(i), i.health.status, i.health.status.replace('_', ' '), String(i.port));
    }
    return parts.join(' ').toLowerCase();
  }

  function sortValue(item, sortKey) {
    switch (sortKey) {
      case 'connection': return item.connection.connected ? 0 : 1;
      case 'zone': return zoneOf(item);
      case 'service': return item.inbounds.map(service).join(',');
      case 'target': return item.inbounds.map(target).join(',');
      case 'status': return -Math.max(-1, ...item.inbounds.map((i) => STATUS[i.health.status]?.rank ?? 4));
      case 'ready': return isReady(item) ? 1 : 0;
      case 'since': return -Math.max(0, ...item.inbounds.map((i) => Date.parse(i.health.since)));
      case 'report': return -(Date.parse(item.connection.lastReportAt) || 0);
      default: return '';
    }
  }

  function compare(a, b) {
    const { key: sortKey, dir } = state.sort;
    const va = sortValue(a, sortKey);
    const vb = sortValue(b, sortKey);
    let c = 0;
    if (va < vb) c = -1; else if (va > vb) c = 1;
    if (c === 0) c = `${a.mesh}.${a.name}`.localeCompare(`${b.mesh}.${b.name}`);
    return c * dir;
  }

  function renderTable() {
    const words = state.filter.toLowerCase().split(/\s+/).filter(Boolean);
    const all = [...state.dataplanes.values()];
    const matching = all
      .filter((item) => !state.notReadyOnly || !isReady(item))
      .filter((item) => !state.zoneFilter || zoneOf(item) === state.zoneFilter)
      .filter((item) => { const hay = haystack(item); return words.every((w) => hay.includes(w)); })
      .sort(compare);
    const shown = matching.slice(0, MAX_ROWS);
    const tbody = $('dataplanes').tBodies[0];
    const wanted = new Set(shown.map(key));
    for (const [k, tr] of rows) {
      if (!wanted.has(k)) { tr.remove(); rows.delete(k); }
    }
    let previous = null;
    for (const item of shown) {
      const k = key(item);
      let tr = rows.get(k);
      if (!tr) {
        tr = h('tr', { 'data-key': k });
        rows.set(k, tr);
      }
      if (tr.item !== item) { fillRow(tr, item); tr.item = item; }
      const expected = previous ? previous.nextSibling : tbody.firstChild;
      if (expected !== tr) tbody.insertBefore(tr, expected);
      previous = tr;
    }
    const total = state.summary?.dataplanes.total ?? all.length;
    const note = state.large
      ? `Showing ${shown.length} of ${total} dataplanes, filtered by hdsd${state.more ? '; more match: narrow with a service name, the zone or Not ready only' : ''}.`
      : matching.length > shown.length
        ? `Showing ${shown.length} of ${matching.length} matching dataplanes (of ${all.length}); narrow the filter to see the rest.`
        : `Showing ${matching.length} of ${all.length} dataplanes.`;
    setText($('shown'), note);
    const empty = $('empty');
    empty.hidden = state.loaded && matching.length > 0;
    setText(empty, !state.loaded ? 'Loading...'
      : all.length === 0 ? 'No dataplanes are defined yet.' : 'No dataplane matches the filter.');
  }

  function stack(values) {
    return h('ul', { class: 'stack' }, values.map((v) => h('li', {}, v)));
  }

  function fillRow(tr, item) {
    const ready = isReady(item);
    const notReadyCount = item.inbounds.filter((i) => !i.health.ready).length;
    tr.className = ready ? 'ready' : 'not-ready';
    tr.dataset.ready = String(ready);
    tr.replaceChildren(
      h('th', { scope: 'row', 'data-label': 'Dataplane' }, h('div', {},
        h('button', { type: 'button', class: 'link', 'data-open': key(item), 'aria-haspopup': 'dialog' }, `${item.mesh}.${item.name}`),
        h('span', { class: 'muted addr' }, item.address))),
      h('td', { 'data-label': 'Connection' },
        item.connection.connected
          ? h('span', { class: 'conn k-ok' }, h('span', { 'aria-hidden': 'true' }, '● '), connectedText(item.connection))
          : h('span', { class: 'conn k-bad' }, h('span', { 'aria-hidden': 'true' }, '○ '), 'Disconnected'),
        item.connection.problem
          ? h('div', { class: 'problem k-bad', 'data-problem': item.connection.problem.code }, '! ', item.connection.problem.message)
          : null),
      h('td', { 'data-label': 'Service' }, stack(item.inbounds.map(service))),
      h('td', { 'data-label': 'Target' }, stack(item.inbounds.map((i) => [h('code', {}, target(i)),
        i.probe && i.probe.tls ? h('span', { class: 'tls-mark', title: 'probed over TLS', 'data-tls': 'true' }, ' TLS') : null]))),
      h('td', { 'data-label': 'Status' }, stack(item.inbounds.map((i) => statusBadge(i.health.status)))),
      h('td', { 'data-label': 'Ready', class: 'ready-cell' },
        ready
          ? h('span', { class: 'readiness k-ok' }, h('span', { 'aria-hidden': 'true' }, '✓ '), 'Ready')
          : h('span', { class: 'readiness k-bad' }, h('span', { 'aria-hidden': 'true' }, '✕ '),
            item.inbounds.length > 1 ? `Not ready (${notReadyCount}/${item.inbounds.length})` : 'Not ready')),
      h('td', { 'data-label': 'Since' }, stack(item.inbounds.map((i) => time(i.health.since)))),
      h('td', { 'data-label': 'Last report' }, time(item.connection.lastReportAt)),
      h('td', { 'data-label': 'Zone', class: 'zone-col' }, zoneBadge(item)),
    );
  }

  // "Connected", or "Connected (on B)" when another instance holds the stream.
  function connectedText(c) {
    return c.heldBy ? `Connected (on ${c.heldBy})` : 'Connected';
  }

  // What a probe checks, in words.
  function probeWords(p) {
    const kind = { tcp: 'TCP connect', http: 'HTTP GET', grpc: 'gRPC health check' }[p.kind] || 'Check';
    const instead = p.fallback ? ` (run as a ${p.fallback.toUpperCase()} connect: the Envoy is too old for it)` : '';
    return `${kind}${instead}${tlsWords(p.tls)} every ${p.noTrafficInterval} (interval ${p.interval}), timeout ${p.timeout}; `
      + `healthy after ${p.healthyThreshold}, unhealthy after ${p.unhealthyThreshold} in a row`;
  }

  // How a probe's TLS is set up, in words ('' for plaintext). The files are
  // paths on the Envoy's machine.
  function tlsWords(t) {
    if (!t) return '';
    const parts = [t.verify === 'ca'
      ? `certificate verified against ${t.caFile}${t.sni ? ` and must name ${t.sni}` : ''}`
      : 'certificate NOT verified (insecureSkipVerify)'];
    if (t.sni && t.verify !== 'ca') parts.push(`SNI ${t.sni}`);
    if (t.clientCertFile) parts.push(`client certificate ${t.clientCertFile}`);
    if (t.alpn && t.alpn.length) parts.push(`ALPN ${t.alpn.join(', ')}`);
    return ` over TLS (${parts.join('; ')})`;
  }

  function renderBanner(sources) {
    renderNotices(sources);
    const banner = $('banner');
    const broken = sources.files.filter((f) => f.error);
    banner.hidden = broken.length === 0;
    const signature = JSON.stringify(broken);
    if (banner.dataset.signature === signature) return;
    banner.dataset.signature = signature;
    $('banner-list').replaceChildren(...broken.map((f) =>
      h('li', { 'data-file': f.path },
        h('code', {}, f.path), f.error.line ? ` line ${f.error.line}` : '', ': ', f.error.message)));
  }

  // The files' warnings (fields ignored, inbounds in no service): they load.
  function renderNotices(sources) {
    const notices = $('notices');
    const warned = sources.files.flatMap((f) => (f.warnings || []).map((w) => ({ path: f.path, w })));
    notices.hidden = warned.length === 0;
    const signature = JSON.stringify(warned);
    if (notices.dataset.signature === signature) return;
    notices.dataset.signature = signature;
    $('notices-list').replaceChildren(...warned.map(({ path, w }) =>
      h('li', { 'data-file': path },
        h('code', {}, path), w.line ? ` line ${w.line}` : '', ': ', w.message)));
  }

  // ------------------------------------------------------------ the last hour

  const W = 1000; // the charts' width in SVG units (scaled to the page)
  const MIN_SPAN_MS = 10 * 60 * 1000;

  /** Segments of a status band: [{from, to, status}] from the window's start to its end. */
  function segments(history) {
    const from = Date.parse(history.from);
    const to = Date.parse(history.to);
    const out = [];
    let at = from;
    let status = history.before || null; // null: not seen yet
    const dropped = history.droppedUntil ? Date.parse(history.droppedUntil) : null;
    if (dropped && dropped > at) {
      out.push({ from: at, to: dropped, status: 'dropped' });
      at = dropped;
    }
    for (const c of history.changes) {
      const t = Math.max(from, Math.min(to, Date.parse(c.at)));
      if (t > at) out.push({ from: at, to: t, status });
      at = Math.max(at, t);
      status = c.status;
    }
    if (to > at) out.push({ from: at, to, status });
    return out;
  }

  function bandWords(status) {
    if (status === null) return 'not seen yet';
    if (status === 'dropped') return 'changes dropped (over the history\'s cap)';
    return (BAND[status] || { text: status }).text;
  }

  /** One band (a dataplane's or a zone's) as an SVG group of rects. */
  function band(history, y, height, x, attrs) {
    return segments(history).map((seg) => {
      const kind = seg.status === null || seg.status === 'dropped' ? 'none' : (BAND[seg.status] || { kind: 'warn' }).kind;
      return svg('rect', {
        class: `seg k-${kind}`, x: x(seg.from), y, width: Math.max(0.5, x(seg.to) - x(seg.from)), height,
        'data-status': seg.status === null ? 'unseen' : seg.status,
        'data-from': new Date(seg.from).toISOString(), 'data-to': new Date(seg.to).toISOString(), ...attrs,
      }, svg('title', {}, `${clock(seg.from)} – ${clock(seg.to)}: ${bandWords(seg.status)}`));
    });
  }

  /** The fleet's timeline: inbounds not ready per bucket, stacked by class, and a band per zone. */
  function renderTimeline() {
    const hist = state.history;
    const box = $('timeline');
    if (!hist) return;
    const from = Date.parse(hist.from);
    const to = Date.parse(hist.to);
    // The hour, or (while hdsd is younger) since it started, at least MIN_SPAN_MS.
    const start = Math.max(to - hist.spanSeconds * 1000, Math.min(from, to - MIN_SPAN_MS));
    const x = (t) => ((Math.max(start, t) - start) / (to - start)) * W;
    const bucket = hist.bucketSeconds * 1000;
    const samples = hist.samples.filter((s) => Date.parse(s.at) + bucket > from);
    const peak = Math.max(1, ...samples.map((s) => s.notReadyMax));
    const chartH = 80;
    const zoneH = 14;
    const zones = hist.zones || [];
    const height = chartH + zones.length * (zoneH + 4) + 2;
    const parts = [];
    // Before hdsd started: nothing is known.
    if (from > start) parts.push(svg('rect', { class: 'unknown', x: 0, y: 0, width: x(from), height: chartH },
      svg('title', {}, `before ${clock(from)}: hdsd was not running (its history is kept in memory)`)));
    // Runs of buckets with any inbound not ready: the intervals.
    let run = null;
    const runs = [];
    for (const s of samples) {
      const t = Date.parse(s.at);
      if (s.notReadyMax > 0) {
        if (run && run.to === t) { run.to = t + bucket; run.max = Math.max(run.max, s.notReadyMax); }
        else { run = { from: t, to: t + bucket, max: s.notReadyMax }; runs.push(run); }
      }
    }
    for (const r of runs) {
      const end = Math.min(r.to, to);
      parts.push(svg('rect', {
        class: 'nr-interval', x: x(Math.max(r.from, from)), y: 0, width: Math.max(1, x(end) - x(Math.max(r.from, from))), height: chartH,
        'data-from': new Date(r.from).toISOString(), 'data-to': new Date(end).toISOString(), 'data-max': r.max,
      }, svg('title', {}, `${clock(r.from)} – ${clock(end)}: up to ${r.max} inbound${r.max === 1 ? '' : 's'} not ready`)));
    }
    for (const s of samples) {
      const t = Date.parse(s.at);
      const bx = x(Math.max(t, from)); // nothing is known before hdsd started
      const bw = Math.max(1, x(Math.min(t + bucket, to)) - bx);
      let y = chartH;
      const by = s.notReadyMaxByClass || {};
      const words = CLASSES.filter((c) => by[c]).map((c) => `${by[c]} ${c.replace('_', ' ')}`).join(', ');
      for (const c of CLASSES) {
        if (!by[c]) continue;
        const bh = (by[c] / peak) * (chartH - 4);
        y -= bh;
        parts.push(svg('rect', { class: `bar k-${(BAND[c] || { kind: 'warn' }).kind}`, x: bx, y, width: bw, height: bh, 'data-class': c, 'data-at': s.at },
          svg('title', {}, `${clock(t)} – ${clock(t + bucket)}: at most ${s.notReadyMax} not ready (${words}); ${s.ready}/${s.inbounds} ready at its end`)));
      }
    }
    parts.push(svg('line', { class: 'baseline', x1: 0, x2: W, y1: chartH, y2: chartH }));
    zones.forEach((z, i) => {
      const y = chartH + 4 + i * (zoneH + 4);
      parts.push(svg('g', { 'data-zone': z.zone }, band({ ...z, from: hist.from, to: hist.to }, y, zoneH, x, { 'data-zone': z.zone })));
    });
    const notReadyNow = samples.length ? samples[samples.length - 1].notReady : 0;
    const total = samples.filter((s) => s.notReadyMax > 0).length;
    const chart = svg('svg', {
      class: 'timeline-chart', viewBox: `0 0 ${W} ${height}`, preserveAspectRatio: 'none', role: 'img',
      'aria-label': `Inbounds not ready over the last hour: ${runs.length} interval${runs.length === 1 ? '' : 's'} with some not ready, peak ${runs.length ? peak : 0}; ${notReadyNow} not ready now.`,
      'data-peak': runs.length ? peak : 0, 'data-buckets-not-ready': total, 'data-not-ready-now': notReadyNow,
    }, parts);
    box.replaceChildren(
      chart,
      h('div', { class: 'timeline-axis muted', 'aria-hidden': 'true' },
        h('span', {}, clock(start)), h('span', {}, clock(start + (to - start) / 2)), h('span', {}, `${clock(to)} (now)`)),
      h('p', { class: 'legend muted' },
        from > start ? `Grey: before ${clock(from)}, when this hdsd started (it keeps the history in memory). ` : '',
        runs.length ? `Peak: ${peak} inbound${peak === 1 ? '' : 's'} not ready (full height). ` : 'No inbound was not ready. ',
        `Bars: the most inbounds not ready within each ${hist.bucketSeconds} s, by why: `,
        CLASSES.flatMap((c) => [h('span', { class: `legend-item k-${BAND[c].kind}` }, h('span', { class: 'swatch', 'aria-hidden': 'true' }), ` ${BAND[c].text}`), ' ']),
        zones.length ? ` Rows below the bars, top to bottom: zones ${zones.map((z) => z.zone).join(', ')} (green online, red offline, grey disabled).` : ''),
    );
  }

  /** The open detail's band of status changes. */
  function renderBand() {
    const box = document.getElementById('detail-band');
    const d = state.detailHistory;
    if (!box || !d || d.key !== state.detailKey) return;
    const hist = d.history;
    if (!hist) {
      box.replaceChildren(h('p', { class: 'muted' }, 'No history of this dataplane here.'));
      return;
    }
    const from = Date.parse(hist.from);
    const to = Date.parse(hist.to);
    const x = (t) => ((t - from) / Math.max(1, to - from)) * W;
    const changes = hist.changes.filter((c) => Date.parse(c.at) >= from);
    box.replaceChildren(
      svg('svg', { class: 'band', viewBox: `0 0 ${W} 20`, preserveAspectRatio: 'none', role: 'img',
        'aria-label': `Status over the last ${Math.round((to - from) / 60000)} minutes: ${changes.length} change${changes.length === 1 ? '' : 's'}` },
      band(hist, 0, 20, x, {})),
      h('div', { class: 'timeline-axis muted', 'aria-hidden': 'true' },
        h('span', {}, clock(from)), h('span', {}, `${clock(to)} (now)`)),
      changes.length === 0 ? h('p', { class: 'muted' }, `No change since ${clock(from)}.`)
        : h('ol', { class: 'changes band-changes', reversed: true }, [...changes].reverse().map((c) => {
          const b = BAND[c.status] || { kind: 'warn', text: c.status };
          return h('li', { 'data-status': c.status },
            h('span', { class: `badge k-${b.kind}` }, b.text),
            c.inbounds > 1 ? ` (${c.notReady}/${c.inbounds} not ready)` : '', ' at ',
            h('time', { datetime: c.at, title: new Date(c.at).toLocaleString() }, clock(Date.parse(c.at))));
        })));
  }

  // ------------------------------------------------------------ detail

  function openDetail(k) {
    state.detailKey = k;
    state.detailHistory = null;
    renderDetail();
    loadDetailHistory().catch(handleError);
    const dialog = $('detail');
    if (!dialog.open) dialog.showModal();
  }

  function renderDetail() {
    if (!state.detailKey) return;
    const item = state.dataplanes.get(state.detailKey);
    const body = $('detail-body');
    if (!item) {
      setText($('detail-title'), state.detailKey.replace('/', '.'));
      body.replaceChildren(h('p', {}, 'This dataplane no longer exists.'));
      return;
    }
    if (body.item === item) return;
    body.item = item;
    setText($('detail-title'), `${item.mesh}.${item.name}`);
    const c = item.connection;
    body.replaceChildren(
      h('dl', { class: 'facts' },
        h('dt', {}, 'Address'), h('dd', {}, item.address),
        h('dt', {}, 'Connection'), h('dd', {}, c.connected ? connectedText(c) : 'Disconnected',
          c.connectedAt ? [' (since ', time(c.connectedAt), ')'] : ''),
        h('dt', {}, 'Envoy'), h('dd', {}, c.envoyVersion || 'version not reported'),
        c.problem ? [h('dt', {}, 'Problem'), h('dd', { 'data-problem': c.problem.code }, c.problem.message)] : null,
        c.tokenExpiresAt ? [h('dt', {}, 'Token expires'), h('dd', { 'data-token-expires': c.tokenExpiresAt }, time(c.tokenExpiresAt))] : null,
        h('dt', {}, 'Last report'), h('dd', {}, time(c.lastReportAt)),
        h('dt', {}, 'Ready'), h('dd', {}, isReady(item) ? 'Yes: every inbound is ready' : 'No')),
      h('section', { class: 'history', 'aria-labelledby': 'detail-band-title' },
        h('h3', { id: 'detail-band-title' }, 'Last hour'),
        h('div', { id: 'detail-band' }, h('p', { class: 'muted' }, 'Loading…'))),
      ...item.inbounds.map((i) => inboundDetail(i)),
    );
    renderBand();
    scheduleDetailHistory();
  }

  // A changed dataplane: its band again, soon (one request per burst).
  const scheduleDetailHistory = coalesced(() => loadDetailHistory(), 300);

  function inboundDetail(i) {
    const p = i.probe;
    const tags = Object.entries(i.tags).map(([k, v]) => `${k}=${v}`).join(', ') || 'none';
    return h('section', { class: 'inbound' },
      h('h3', {}, `Inbound ${i.port}: ${service(i)} `, statusBadge(i.health.status)),
      h('dl', { class: 'facts' },
        h('dt', {}, 'Tags'), h('dd', {}, tags),
        h('dt', {}, 'Status'), h('dd', {}, `${i.health.status.replace('_', ' ')} (${i.health.ready ? 'ready' : 'not ready'}), since `, time(i.health.since)),
        h('dt', {}, 'Last report'), h('dd', {}, time(i.health.lastReportAt),
          i.health.failingReports ? `, ${i.health.failingReports} failing in a row` : '',
          i.health.lastHealthyAt ? [', last healthy ', time(i.health.lastHealthyAt)] : ''),
        i.health.reason ? [h('dt', {}, 'Why'), h('dd', { 'data-reason': i.health.reason.code }, i.health.reason.message)] : null,
        h('dt', {}, 'Specifier target'), h('dd', {}, p ? [h('code', {}, p.target), ' in cluster ', h('code', {}, p.cluster)] : 'not probed (no serviceProbe and hds.probe_all_inbounds = false)'),
        p ? [h('dt', {}, 'Probe'), h('dd', {}, probeWords(p))] : null),
      h('h4', {}, 'Recent status changes'),
      (i.health.changes || []).length === 0
        ? h('p', { class: 'muted' }, 'None since hdsd started.')
        : h('ol', { class: 'changes', reversed: true }, [...i.health.changes].reverse().map((ch) =>
          h('li', {}, statusBadge(ch.from), h('span', { 'aria-label': 'to' }, ' → '), statusBadge(ch.to), ' ', time(ch.at)))));
  }

  // ------------------------------------------------------------ wiring

  function tick() {
    const now = Date.now();
    for (const el of document.querySelectorAll('time[data-ts]')) {
      setText(el, relative(el.dataset.ts, now));
    }
  }

  function wire() {
    $('filter').addEventListener('input', (e) => { state.filter = e.target.value; filtersChanged(); });
    $('not-ready').addEventListener('change', (e) => { state.notReadyOnly = e.target.checked; filtersChanged(); });
    $('zone-filter').addEventListener('change', (e) => { state.zoneFilter = e.target.value; filtersChanged(); });
    for (const th of document.querySelectorAll('th[data-sort]')) {
      th.querySelector('button').addEventListener('click', () => {
        const sortKey = th.dataset.sort;
        state.sort = { key: sortKey, dir: state.sort.key === sortKey ? -state.sort.dir : 1 };
        for (const other of document.querySelectorAll('th[data-sort]')) other.removeAttribute('aria-sort');
        th.setAttribute('aria-sort', state.sort.dir === 1 ? 'ascending' : 'descending');
        renderTable();
      });
    }
    const tbody = $('dataplanes').tBodies[0];
    tbody.addEventListener('click', (e) => {
      if (window.getSelection && String(window.getSelection()).length > 0) return; // selecting text
      const tr = e.target.closest('tr[data-key]');
      if (tr) openDetail(tr.dataset.key);
    });
    $('detail-close').addEventListener('click', () => $('detail').close());
    $('detail').addEventListener('close', () => {
      const k = state.detailKey;
      state.detailKey = null;
      state.detailHistory = null;
      $('detail-body').item = null;
      const opener = k && document.querySelector(`button[data-open="${CSS.escape(k)}"]`);
      if (opener) opener.focus();
    });
    $('token-button').addEventListener('click', () => {
      sessionStorage.removeItem(TOKEN_KEY);
      stopWatch();
      askToken(null).then(restart);
    });
    setInterval(tick, 1000);
  }

  /** (Re)loads everything and follows the watch. */
  async function restart() {
    stopWatch();
    const generation = state.generation;
    state.lastEventId = null;
    setLive('connecting', 'Connecting…');
    try {
      // The dataplanes come with the watch's first snapshot.
      await loadServices();
    } catch (e) {
      if (e instanceof Unauthorized) { onUnauthorized(e); return; }
      setLive('reconnecting', 'Reconnecting…');
    }
    if (generation !== state.generation) return;
    pollSources(generation);
    pollZones(generation);
    refreshTimes(generation);
    follow(generation);
  }

  async function main() {
    wire();
    try {
      const r = await fetch('/ui/config.json', { cache: 'no-store' });
      if (r.ok) state.config = await r.json();
    } catch (_) { /* an older hdsd: ask when the API says 401 */ }
    $('token-button').hidden = !state.config.tokenRequired;
    if (state.config.tokenRequired && !sessionStorage.getItem(TOKEN_KEY)) await askToken(null);
    restart();
  }

  main();
})();
