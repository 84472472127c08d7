// Tollgate's dashboard: reads /v1/dashboard every second and draws with uPlot. No framework,
// no network beyond this server. Every name from the server is set as text, never as HTML.
'use strict';

const CHARTED = 6;           // groups charted at once (the busiest)
const NODE_SERIES = ['capacity', 'admitted', 'demand'];
// The target last, dashed, so that it stays visible where the admitted units meet it.
const GROUP_UNITS = ['admitted', 'demand', 'target'];
const GROUP_OTHER = ['throttled', 'clients', 'busy'];
// What each series is called on the page: a group is throttled when it refuses work, and
// limited by saturation when a busy backend holds it below its cap.
const LABELS = { throttled: 'refused/s', busy: 'saturation-limited' };
const COLORS = {
  capacity: '#98a2b3', target: '#b54708', admitted: '#1f5fbf', demand: '#12805c',
  throttled: '#c01048', clients: '#6941c6', busy: 'rgba(192,16,72,0.15)',
};

const state = {
  next: 0,
  window: 900,
  node: empty(['t'].concat(NODE_SERIES)),
  charts: new Map(),   // group name -> { data, units, other, card }
  filter: '',
  page: 0,
  detail: null,        // { name, data, units, other }
  token: sessionStorage.getItem('tollgate-token') || '',
  timer: null,
  unit: 'units',       // what a unit counts, as the server says (its cost model)
};

/// A rate's label in the server's units.
function perSecond() { return state.unit + '/s'; }

function empty(keys) {
  const o = {};
  for (const k of keys) o[k] = [];
  return o;
}

const $ = (id) => document.getElementById(id);

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  if (!Number.isFinite(v)) return 'unlimited';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(2) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(1);
  return v === 0 ? '0' : v.toFixed(2);
}

function ago(s) {
  if (s < 60) return s.toFixed(1) + ' s ago';
  if (s < 3600) return (s / 60).toFixed(1) + ' min ago';
  return (s / 3600).toFixed(1) + ' h ago';
}

class AuthError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function get(path) {
  const headers = {};
  if (state.token) headers.Authorization = 'Bearer ' + state.token;
  const r = await fetch(path, { headers, cache: 'no-store' });
  if (r.status === 401 || r.status === 403) {
    let message = r.statusText;
    try { message = (await r.json()).error || message; } catch (_) { /* not JSON */ }
    throw new AuthError(r.status, message);
  }
  if (!r.ok) {
    let message = r.status + ' ' + r.statusText;
    try { message = (await r.json()).error || message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  return r.json();
}

// Appends the samples of `series` (from the server) to `into`, keeping only points newer than
// the last one held and at most a window of them.
function append(into, series, names) {
  if (!series) return;
  const last = into.t.length ? into.t[into.t.length - 1] : -Infinity;
  for (let i = 0; i < series.t.length; i++) {
    if (series.t[i] <= last) continue;
    into.t.push(series.t[i]);
    for (const n of names) into[n].push(series[n][i]);
  }
  trim(into);
}

// Without a history on the server (too many groups), the page charts what it sees itself.
function appendNow(into, row, names) {
  const t = Date.now() / 1000;
  into.t.push(t);
  for (const n of names) {
    const v = row[n];
    into[n].push(typeof v === 'boolean' ? (v ? 1 : 0) : (v === undefined ? null : v));
  }
  trim(into);
}

function trim(into) {
  const extra = into.t.length - state.window;
  if (extra > 0) for (const k of Object.keys(into)) into[k].splice(0, extra);
}

function columns(data, names) {
  return [data.t].concat(names.map((n) => data[n]));
}

// The time every chart ends at (the newest sample the page holds) and how far back they reach:
// all charts share one time axis, so that a moment lines up from one to the next.
function timeRange() {
  const t = state.node.t;
  const end = t.length ? t[t.length - 1] : Date.now() / 1000;
  const start = t.length ? t[0] : end;
  return [Math.min(start, end - 60), end];
}

function clock(t, seconds) {
  const d = new Date(t * 1000);
  const two = (n) => String(n).padStart(2, '0');
  return two(d.getHours()) + ':' + two(d.getMinutes()) + (seconds ? ':' + two(d.getSeconds()) : '');
}

// The last value a series holds, for its legend while the pointer is elsewhere.
function lastValue(data) {
  for (let i = data.length - 1; i >= 0; i--) if (data[i] !== null && data[i] !== undefined) return data[i];
  return null;
}

// Shows each series' newest value in the legend unless the pointer is on the chart.
function showLatest(u) {
  const n = u.data[0].length;
  if (n && (u.cursor.idx === null || u.cursor.idx === undefined || u.cursor.left < 0)) u.setLegend({ idx: n - 1 });
}

function plot(el, names, height, opts) {
  const series = [{ value: (u, v) => (v === null || v === undefined ? '–' : clock(v, true)) }].concat(names.map((n) => {
    // Points only while there are few samples to draw a line through.
    const s = {
      label: LABELS[n] || n, stroke: COLORS[n], width: 1.5,
      value: (u, v, si) => fmt(v === null || v === undefined ? lastValue(u.data[si]) : v),
      points: { show: (u, si, i0, i1) => i1 - i0 < 3 },
    };
    if (n === 'capacity' || n === 'target') s.dash = [6, 4];
    if (n === 'target') s.width = 2;
    if (n === 'busy') {
      s.scale = 'busy'; s.fill = COLORS.busy; s.stroke = 'rgba(192,16,72,0.5)'; s.width = 1;
      s.paths = uPlot.paths.stepped({ align: 1 }); s.value = (u, v) => (v ? 'yes' : (v === 0 ? 'no' : '–'));
    }
    if (n === 'clients') s.scale = 'n';
    return s;
  }));
  const axes = [
    {
      stroke: '#667085', grid: { stroke: '#eef0f3' }, space: 70,
      values: (u, ticks) => { const [a, b] = timeRange(); return ticks.map((t) => clock(t, b - a <= 180)); },
    },
    { stroke: '#667085', grid: { stroke: '#eef0f3' }, size: 56, label: opts.label, values: (u, ticks) => ticks.map(fmt) },
  ];
  // At least a minute across, so that the time axis ticks at round seconds from the start.
  const scales = { x: { time: true, range: () => timeRange() }, y: { range: (u, min, max) => [0, max > 0 ? max * 1.1 : 1] } };
  if (names.includes('clients')) {
    axes.push({ scale: 'n', side: 1, size: 40, label: 'clients', grid: { show: false }, values: (u, ticks) => ticks.map(fmt) });
    scales.n = { range: (u, min, max) => [0, max > 0 ? Math.ceil(max * 1.1) : 1] };
  }
  if (names.includes('busy')) scales.busy = { range: [0, 1] };
  const width = Math.max(240, el.clientWidth || 300);
  // One pointer across the charts: hovering a moment on one shows it on all.
  const cursor = { sync: { key: 'tollgate' } };
  return new uPlot({ width, height, series, axes, scales, cursor, legend: { live: true } }, [[]].concat(names.map(() => [])), el);
}

// New data for a chart, its legend showing the newest values.
function draw(u, data, names) {
  u.setData(columns(data, names));
  showLatest(u);
}

function resizeAll() {
  const fit = (u) => { if (u) u.setSize({ width: Math.max(240, u.root.parentElement.clientWidth), height: u.height }); };
  fit(state.nodePlot);
  for (const c of state.charts.values()) { fit(c.units); fit(c.other); }
  if (state.detail) { fit(state.detail.units); fit(state.detail.other); }
}

function td(text, cls) {
  const cell = document.createElement('td');
  cell.textContent = text;
  if (cls) cell.className = cls;
  return cell;
}

function fill(tbody, rows) {
  tbody.replaceChildren(...rows);
}

function renderNode(d) {
  const n = d.node;
  if (n.unit) state.unit = n.unit;
  $('node-unit').textContent = perSecond();
  const warnings = $('warnings');
  warnings.replaceChildren(...(n.warnings || []).map((w) => { const li = document.createElement('li'); li.textContent = 'warning: ' + w; return li; }));
  warnings.hidden = !(n.warnings && n.warnings.length);
  $('role').textContent = (n.role === 'standalone' ? '' : n.role + (n.leader ? ' · leader ' + n.leader : ''))
    + (n.region ? ' · region ' + n.region : '');
  $('capacity').textContent = n.capacity === null ? 'none' : fmt(n.capacity) + ' ' + perSecond();
  const used = n.admitted;
  if (n.capacity) {
    const pct = (100 * used) / n.capacity;
    $('use').textContent = fmt(used) + '/s used (' + pct.toFixed(0) + ' %), ' + fmt(n.demand) + '/s asked';
    $('use-bar').style.width = Math.min(100, pct).toFixed(1) + '%';
    $('use-bar').className = pct >= 95 ? 'hot' : '';
  } else {
    $('use').textContent = fmt(used) + '/s used, ' + fmt(n.demand) + '/s asked';
    $('use-bar').style.width = '0';
  }
  $('groups').textContent = String(n.groups);
  $('busy').textContent = d.busiest.length + ' in traffic · ' + n.exchanges + ' exchanges';
  const diag = d.diagnostics;
  $('clients').textContent = String(n.clients);
  $('lapsed').textContent = diag.clients_lapsed + ' lapsed (safe mode)' + (n.learning ? ' · learning' : '');
  // The one switch and node-wide shadow mode: nothing is refused while either holds.
  const mode = $('node-mode');
  mode.textContent = n.throttling === false ? 'throttling off' : (n.shadow ? 'shadow mode: nothing refused' : '');
  mode.hidden = !mode.textContent;
  $('backends').textContent = String(n.backends);
  $('limiting').textContent = diag.backends.filter((b) => b.limiting).length + ' saturated';

  append(state.node, d.series, NODE_SERIES);
  if (!state.nodePlot) state.nodePlot = plot($('node-chart'), NODE_SERIES, 220, { label: perSecond() });
  draw(state.nodePlot, state.node, NODE_SERIES);
}

// The groups table's head, in the server's units.
function groupHead() {
  const rate = perSecond();
  const names = ['group', 'reserved ' + rate, 'limit ' + rate, 'target ' + rate, 'admitted ' + rate, 'demand ' + rate,
    'refused/s', 'clients', 'in flight', 'largest request/1m', 'throttled', 'saturation'];
  const tr = document.createElement('tr');
  tr.append(...names.map((n) => { const th = document.createElement('th'); th.textContent = n; return th; }));
  return tr;
}

function renderGroups(d) {
  const head = $('group-table').tHead;
  if (head.dataset.unit !== state.unit) { head.replaceChildren(groupHead()); head.dataset.unit = state.unit; }
  // By name, so that a row stays where it is from one refresh to the next.
  const rows = d.groups.map((g) => {
    const tr = document.createElement('tr');
    const refusing = g.throttled > 0;
    // In shadow mode nothing is refused; what would have been is counted.
    const shadow = g.shadow || d.node.shadow;
    const throttled = shadow ? 'shadow: would refuse ' + g.would_refuse_total : (refusing ? 'refusing' : 'no');
    // Requests held in flight out of the group's in-flight quota, where it has one.
    const inFlight = g.max_in_flight === null ? '–' : (g.in_flight === null ? 0 : g.in_flight) + ' of ' + g.max_in_flight;
    tr.append(td(g.name), td(g.reserved === null ? '–' : fmt(g.reserved)),
      td(g.limit === null ? '–' : (g.limit === 'unlimited' ? 'unlimited' : fmt(g.limit))),
      td(fmt(g.target)), td(fmt(g.admitted)), td(fmt(g.demand)), td(fmt(g.throttled)), td(String(g.clients)),
      td(inFlight, g.max_in_flight !== null && g.in_flight >= g.max_in_flight ? 'yes' : ''),
      td(g.largest_last_minute > 0 ? fmt(g.largest_last_minute) : '–'),
      td(throttled, refusing || (shadow && g.would_refuse_total > 0) ? 'yes' : ''),
      td(g.busy ? 'limited' : 'no', g.busy ? 'yes' : ''));
    tr.dataset.group = g.name;
    tr.addEventListener('click', () => openDetail(g.name));
    return tr;
  });
  fill($('group-table').tBodies[0], rows);
  const shown = d.groups.length;
  const first = d.page * d.page_size;
  $('groups-note').textContent = d.groups_matching > shown
    ? 'Groups ' + (first + 1) + ' to ' + (first + shown) + ' of ' + d.groups_matching + (state.filter ? ' matching the filter' : '') + ', by name.'
    : (shown ? '' : 'No groups' + (state.filter ? ' match the filter.' : ' yet.'));
  $('page-prev').hidden = d.page === 0;
  $('page-next').hidden = first + shown >= d.groups_matching;
}

function chartCard(name) {
  const card = document.createElement('div');
  card.className = 'group-card';
  const h = document.createElement('h3');
  h.textContent = name;
  h.addEventListener('click', () => openDetail(name));
  const a = document.createElement('div');
  a.className = 'chart';
  const b = document.createElement('div');
  b.className = 'chart';
  card.append(h, a, b);
  $('group-charts').append(card);
  return { card, units: plot(a, GROUP_UNITS, 160, { label: perSecond() }), other: plot(b, GROUP_OTHER, 150, { label: 'refused/s' }) };
}

function renderCharts(d) {
  for (const [name, c] of state.charts) {
    const got = d.charts[name];
    if (!got) continue;
    if (got.series) append(c.data, got.series, GROUP_UNITS.concat(GROUP_OTHER));
    else appendNow(c.data, got.now, GROUP_UNITS.concat(GROUP_OTHER));
    draw(c.units, c.data, GROUP_UNITS);
    draw(c.other, c.data, GROUP_OTHER);
  }
  // The busiest groups in traffic (an idle group is never among them). A group charted stays
  // charted while it is among them, and a new one takes a place only when one frees: the
  // charts keep their places from one refresh to the next.
  const wanted = [...state.charts.keys()].filter((n) => d.busiest.includes(n));
  for (const n of d.busiest) if (wanted.length < CHARTED && !wanted.includes(n)) wanted.push(n);
  for (const [name, c] of state.charts) {
    if (!wanted.includes(name)) {
      c.units.destroy(); c.other.destroy(); c.card.remove();
      state.charts.delete(name);
    }
  }
  for (const name of wanted) {
    if (!state.charts.has(name)) {
      const c = chartCard(name);
      c.data = empty(['t'].concat(GROUP_UNITS, GROUP_OTHER));
      state.charts.set(name, c);
      const got = d.charts[name];
      if (!got) loadHistory(name, c);
    }
  }
}

// A group newly charted: its whole history once, then what each refresh brings.
async function loadHistory(name, c) {
  try {
    const g = await get('/v1/dashboard/groups/' + encodeURIComponent(name));
    if (state.charts.get(name) !== c) return;
    if (g.series) append(c.data, g.series, GROUP_UNITS.concat(GROUP_OTHER));
    draw(c.units, c.data, GROUP_UNITS);
    draw(c.other, c.data, GROUP_OTHER);
  } catch (e) {
    if (!(e instanceof AuthError)) console.warn('history of ' + name + ': ' + e.message);
  }
}

function renderBackends(diag) {
  fill($('backend-table').tBodies[0], diag.backends.map((b) => {
    const tr = document.createElement('tr');
    tr.append(td(b.name), td(b.zone), td(b.utilisation.toFixed(2), b.limiting ? 'yes' : ''), td(b.limiting ? 'yes' : 'no', b.limiting ? 'yes' : ''),
      td(fmt(b.load) + '/s'), td(ago(b.seen_s)), td(b.top_groups.map((g) => g.group + ' ' + fmt(g.load)).join(', ')));
    return tr;
  }));
  $('backends-note').textContent = diag.backends_total > diag.backends.length
    ? 'The ' + diag.backends.length + ' most utilised of ' + diag.backends_total + ' backends.'
    : (diag.backends_total ? '' : 'No backend reports its health.');
}

function renderClients(diag) {
  fill($('client-table').tBodies[0], diag.clients.map((c) => {
    const tr = document.createElement('tr');
    tr.append(td(c.client_id), td(c.lapsed ? 'lapsed: safe mode' : 'live', c.lapsed ? 'yes' : ''), td(String(c.groups)),
      td(fmt(c.granted) + '/s'), td(ago(c.seen_s)), td(c.top_grants.map((g) => g.group + ' ' + fmt(g.rate)).join(', ')));
    return tr;
  }));
  $('clients-note').textContent = diag.clients_total > diag.clients.length
    ? (diag.clients_total - diag.clients.length) + ' more clients hold ' + fmt(diag.others_granted) + ' ' + perSecond() + '.'
    : (diag.clients_total ? '' : 'No client has exchanged yet.');
}

// The client tokens' marks (with authentication), the most consumed first.
function renderTokens(tokens) {
  const marks = (m) => (m === null ? '–' : fmt(m.low) + ' / ' + fmt(m.average) + ' / ' + fmt(m.high));
  fill($('token-table').tBodies[0], tokens.map((t) => {
    const tr = document.createElement('tr');
    tr.append(td(t.label), td(fmt(t.consumed_total)), td(marks(t.last_minute)),
      td(t.largest_last_minute > 0 ? fmt(t.largest_last_minute) : '–'),
      td(t.largest_last_hour > 0 ? fmt(t.largest_last_hour) : '–'),
      td(String(t.throttled_total), t.throttled_total > 0 ? 'yes' : ''));
    tr.dataset.token = t.id;
    return tr;
  }));
  $('tokens-note').textContent = tokens.length ? '' : 'No client token has exchanged with this server (tokens are counted with --auth).';
}

// A group's own address: #/groups/NAME.
function groupHash(name) { return '#/groups/' + encodeURIComponent(name); }

async function openDetail(name) {
  if (location.hash !== groupHash(name)) { location.hash = groupHash(name); return; }  // route() opens it
  closeDetail(true);
  const el = { units: $('detail-chart'), other: $('detail-chart2') };
  const detail = {
    name, data: empty(['t'].concat(GROUP_UNITS, GROUP_OTHER)), next: 0,
    units: plot(el.units, GROUP_UNITS, 200, { label: perSecond() }), other: plot(el.other, GROUP_OTHER, 170, { label: 'refused/s' }),
  };
  state.detail = detail;
  $('detail-name').textContent = name;
  $('detail').hidden = false;
  await refreshDetail(detail);
  $('detail').scrollIntoView({ behavior: 'smooth', block: 'nearest' });
}

function closeDetail(keepHash) {
  if (!keepHash && location.hash.startsWith('#/groups/')) history.pushState(null, '', location.pathname + location.search);
  if (!state.detail) return;
  state.detail.units.destroy();
  state.detail.other.destroy();
  state.detail = null;
  $('detail').hidden = true;
}

// Follows the address: #/groups/NAME shows that group, anything else none.
function route() {
  const m = location.hash.match(/^#\/groups\/(.+)$/);
  if (!m) { closeDetail(true); return; }
  let name;
  try { name = decodeURIComponent(m[1]); } catch (_) { closeDetail(true); return; }
  if (!state.detail || state.detail.name !== name) openDetail(name);
}

async function refreshDetail(detail) {
  let g;
  try {
    g = await get('/v1/dashboard/groups/' + encodeURIComponent(detail.name) + '?since=' + detail.next);
  } catch (e) {
    if (e instanceof AuthError) throw e;
    $('detail-settings').tBodies[0].replaceChildren(kv('error', e.message));
    return;
  }
  if (state.detail !== detail) return;
  detail.next = g.next;
  if (g.series) append(detail.data, g.series, GROUP_UNITS.concat(GROUP_OTHER));
  else appendNow(detail.data, g.now, GROUP_UNITS.concat(GROUP_OTHER));
  draw(detail.units, detail.data, GROUP_UNITS);
  draw(detail.other, detail.data, GROUP_OTHER);
  const rows = [kv('state', g.now.busy ? 'busy: saturation limits it' : 'not limited by saturation'),
    kv('target', fmt(g.now.target)), kv('granted', fmt(g.granted)), kv('consumed in all', fmt(g.consumed_total))];
  if (g.settings) {
    for (const [k, v] of Object.entries(g.settings)) {
      rows.push(kv(k, v === null ? '–' : (typeof v === 'object' ? JSON.stringify(v) : String(v))));
    }
  } else {
    rows.push(kv('settings', 'none: seen through traffic, the default group\'s apply'));
  }
  $('detail-settings').tBodies[0].replaceChildren(...rows);
}

function kv(k, v) {
  const tr = document.createElement('tr');
  const th = document.createElement('th');
  th.textContent = k;
  tr.append(th, td(v));
  return tr;
}

function setState(text, ok) {
  $('state').textContent = text;
  $('state').className = 'pill ' + (ok ? 'ok' : 'bad');
}

async function refresh() {
  const q = new URLSearchParams({ since: String(state.next) });
  if (state.charts.size) q.set('charts', [...state.charts.keys()].join(','));
  if (state.filter) q.set('filter', state.filter);
  if (state.page) q.set('page', String(state.page));
  try {
    const d = await get('/v1/dashboard?' + q.toString());
    state.window = d.window;
    state.next = d.next;
    renderNode(d);
    renderGroups(d);
    renderCharts(d);
    renderBackends(d.diagnostics);
    renderClients(d.diagnostics);
    renderTokens(d.tokens);
    if (state.detail) await refreshDetail(state.detail);
    setState('live', true);
  } catch (e) {
    if (e instanceof AuthError) {
      showLogin(e.status === 403 ? 'This token may not read the dashboard: ' + e.message : (state.token ? 'The token was refused: ' + e.message : ''));
      return;
    }
    setState('unreachable: ' + e.message, false);
  }
  state.timer = setTimeout(refresh, 1000);
}

function showLogin(message) {
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = message || '';
  setState('token needed', false);
}

$('login').addEventListener('submit', (ev) => {
  ev.preventDefault();
  state.token = $('token').value.trim();
  sessionStorage.setItem('tollgate-token', state.token);
  $('login').hidden = true;
  $('main').hidden = false;
  refresh();
});

$('filter').addEventListener('input', () => {
  state.filter = $('filter').value;
  state.page = 0;
});
$('page-prev').addEventListener('click', () => { state.page = Math.max(0, state.page - 1); });
$('page-next').addEventListener('click', () => { state.page += 1; });

$('detail-close').addEventListener('click', () => closeDetail(false));
window.addEventListener('resize', resizeAll);
window.addEventListener('hashchange', route);
window.addEventListener('popstate', route);
route();
refresh();
