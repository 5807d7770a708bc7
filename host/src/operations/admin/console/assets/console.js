// The wakuwaku operator console. Served by the host's admin endpoint
// (host/src/operations/admin/console); no build step.
//
// Rules: every string from the host is written with textContent (through
// `el` and `text`), never as markup, and with every control, bidi or
// invisible character shown as an escape (`shown`); nothing here builds a
// URL from a module's string. Each view polls its JSON while it is shown.
'use strict';

(() => {
  const POLL_MS = 2000;
  const HISTORY_POINTS = 300; // ten minutes at one sample every two seconds
  const HIDDEN = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufffb]/gu;

  const state = {
    csrf: '',
    access: 'read',
    timer: null,
    view: null,
    history: [], // {t, applied, lag, perPartition: {p: lag}, watermark}
    letters: { after: null, pages: [], selected: new Set(), shown: null, filters: {} },
    browser: { topic: null, partition: 0, from: 'end' },
    moduleLog: {}, // module -> the line its page of log lines starts before (none: the newest)
  };

  /** `value` as text with every hidden character written as an escape. */
  function shown(value) {
    return String(value ?? '').replace(HIDDEN, (c) => '\\u{' + c.codePointAt(0).toString(16) + '}');
  }

  /** An element with attributes (never event handlers) and text or element children. */
  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name.startsWith('on') || name === 'href' || name === 'src' || name === 'style') {
        throw new Error('refusing attribute ' + name);
      }
      if (value !== undefined && value !== null && value !== false) node.setAttribute(name, value === true ? '' : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(shown(child)));
    }
    return node;
  }

  function text(node, value) {
    node.textContent = shown(value);
  }

  function notice(message, kind) {
    const box = document.getElementById('notice');
    text(box, message || '');
    box.className = kind || '';
  }

  async function api(path) {
    const response = await fetch('/console/api/' + path, { credentials: 'same-origin', cache: 'no-store' });
    if (response.status === 401) {
      window.location.assign('/console/sign-in');
      throw new Error('signed out');
    }
    if (!response.ok) throw new Error((await response.text()).trim() || response.statusText);
    return response.json();
  }

  async function act(path, body) {
    const response = await fetch('/console/api/' + path, {
      method: 'POST',
      credentials: 'same-origin',
      headers: { 'content-type': 'application/json', 'x-waku-csrf': state.csrf },
      body: JSON.stringify(body),
    });
    if (!response.ok) throw new Error((await response.text()).trim() || response.statusText);
    return response.json();
  }

  const number = (n) => (n === null || n === undefined ? '-' : Number(n).toLocaleString('en-US'));
  const time = (ms) => (ms === null || ms === undefined ? '-' : new Date(Number(ms)).toISOString());
  const callTime = (us) => (us === null || us === undefined ? '-' : us < 1000 ? us + ' µs' : us < 1e6 ? (us / 1000).toFixed(1) + ' ms' : (us / 1e6).toFixed(2) + ' s');
  const bytes = (n) => (n === null || n === undefined ? '-' : n < 1048576 ? (n / 1024).toFixed(0) + ' KiB' : (n / 1048576).toFixed(1) + ' MiB');
  const duration = (ms) => (ms === null || ms === undefined ? '-' : (Number(ms) / 1000).toFixed(1) + ' s');

  function table(headers, rows, attributes) {
    return el('table', attributes, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))), el('tbody', {}, rows));
  }

  function facts(pairs, id) {
    return el('dl', { class: 'facts', id }, pairs.map(([name, value, key]) => [el('dt', {}, name), el('dd', { 'data-fact': key }, value)]));
  }

  // ---- plots (uPlot) ----
  function plot(container, title, names) {
    const width = Math.max(320, Math.min(container.clientWidth || 600, 900));
    const series = [{}].concat(names.map((name, i) => ({ label: name, stroke: ['#2a6fdb', '#d9534f', '#5cb85c', '#f0ad4e', '#7b52ab', '#17a2b8'][i % 6], width: 1.5 })));
    const empty = [[]].concat(names.map(() => []));
    return new window.uPlot({ title, width, height: 200, series, axes: [{}, { size: 60 }] }, empty, container);
  }

  // ---- overview ----
  function sample(overview) {
    const s = overview.status;
    const lag = s.partitions.reduce((sum, p) => sum + p.lag, 0);
    const perPartition = {};
    for (const p of s.partitions) perPartition[p.partition] = p.lag;
    const watermark = (s.event_time || []).reduce((max, t) => Math.max(max, t.watermark_lag_ms || 0), 0);
    state.history.push({ t: overview.now_ms / 1000, applied: s.applied, lag, perPartition, watermark });
    if (state.history.length > HISTORY_POINTS) state.history.shift();
  }

  /** The host's own samples of the last minutes, so the plots start full. */
  async function seedHistory() {
    const h = await api('history');
    state.history = h.samples.slice(-HISTORY_POINTS).map((x) => {
      const perPartition = {};
      for (const [p, lag] of x.partitions) perPartition[p] = lag;
      return { t: x.t_ms / 1000, applied: x.applied, lag: x.lag, perPartition, watermark: x.watermark_lag_ms };
    });
  }

  /**
   * A member's console, when its name ends in ` admin <address>` and the address is a
   * plain `host:port` (an IP address or a host name) or `https://host:port`: its URL,
   * else null. Nothing else of a name (another host's text) ever becomes a link.
   */
  function memberConsole(name) {
    const found = /^(?:.* )?admin (https:\/\/)?((?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})$/.exec(name);
    if (!found || Number(found[3]) < 1 || Number(found[3]) > 65535) return null;
    const url = new URL((found[1] ? 'https://' : 'http://') + found[2] + ':' + found[3] + '/console/');
    return url.protocol === 'http:' || url.protocol === 'https:' ? url.href : null;
  }

  /** The group's members: this host and the others, with their partitions, another's console linked. */
  function membersFact(overview) {
    if (!overview.members || overview.members.length === 0) return 'this host only (its state is its own)';
    return overview.members.flatMap((m, i) => {
      const held = m.partitions.length > 0 ? ': partitions ' + m.partitions.join(', ') : ': no partition now';
      const name = el('span', { class: 'member', 'data-this-host': m.this_host }, (m.this_host ? 'this host, ' : '') + m.name + held);
      const url = m.this_host ? null : memberConsole(m.name);
      if (url) {
        const link = document.createElement('a');
        link.href = url; // checked above: http(s), a host and a port, nothing else
        link.rel = 'noopener noreferrer';
        link.className = 'member-console';
        link.textContent = 'its console';
        name.append(' (', link, ')');
      }
      return i === 0 ? [name] : ['; ', name];
    });
  }

  const micros = (us) => (Number(us) / 1000).toFixed(1) + ' ms';

  /** A partition's last batch in words: its size, what it read, how long it took, when. */
  function batchText(b) {
    if (!b) return 'none on this host yet';
    return number(b.events) + ' events (' + b.kind + ', ' + number(b.applied) + ' applied, ' + number(b.calls) + ' calls) in ' + micros(b.took_us) + ', at ' + time(b.at_ms);
  }

  function phasesText(b) {
    return b ? b.phases.map(([phase, us]) => phase + ' ' + micros(us)).join(', ') : '';
  }

  /** Who holds partition `p`: this host, another member by name, or nobody known. */
  function ownerOf(overview, p) {
    const member = (overview.members || []).find((m) => m.partitions.includes(p.partition));
    if (member) return member.this_host ? 'this host' : member.name;
    return p.end_at_start === null || p.end_at_start === undefined ? 'another host (or not yet taken)' : 'this host';
  }

  function throughputData() {
    const h = state.history;
    const xs = [], rates = [];
    for (let i = 1; i < h.length; i++) {
      const dt = h[i].t - h[i - 1].t;
      xs.push(h[i].t);
      rates.push(dt > 0 ? Math.max(0, (h[i].applied - h[i - 1].applied) / dt) : 0);
    }
    return [xs, rates];
  }

  const views = {};

  views.overview = {
    title: 'Overview',
    render(root) {
      root.append(el('h2', {}, 'Overview'), el('div', { id: 'overview-facts' }), el('div', { class: 'plots' }, el('div', { id: 'plot-throughput' }), el('div', { id: 'plot-lag' })));
      this.throughput = plot(document.getElementById('plot-throughput'), 'Events applied per second', ['applied/s']);
      this.lag = null;
    },
    async refresh() {
      const o = await api('overview');
      sample(o);
      const s = o.status;
      const lag = s.partitions.reduce((sum, p) => sum + p.lag, 0);
      const box = document.getElementById('overview-facts');
      box.replaceChildren(
        facts([
          ['Projection', s.projection, 'projection'],
          ['Topics', [s.topic].concat(s.more_topics || []).join(', '), 'topics'],
          ['Log', o.log, 'log'],
          ['State', o.state, 'state'],
          ['Modules', Object.entries(s.modules).map(([m, v]) => m + ' @ ' + v).join(', ') || 'none', 'modules'],
          ['Caught up', (o.caught_up ? 'yes' : 'no') + ': ' + o.ready, 'caught-up'],
          ['Group members', membersFact(o), 'members'],
          ['Partitions held', s.partitions.filter((p) => p.end_at_start !== null && p.end_at_start !== undefined).map((p) => p.partition).join(', ') || 'none yet', 'held'],
          ['Applied', number(s.applied), 'applied'],
          ['Skipped', number(s.skipped), 'skipped'],
          ['Retrying', number(s.retrying), 'retrying'],
          ['Dead-lettered', number(s.dead_lettered) + ' (' + number(s.redriven) + ' re-driven)', 'dead-lettered'],
          ['Lag', number(lag) + ' events', 'lag'],
          ['Rebuild', s.rebuild ? s.rebuild.phase : 'none', 'rebuild'],
        ], 'overview-list'),
      );
      const rates = throughputData();
      this.throughput.setData(rates);
      document.getElementById('plot-throughput').setAttribute('data-points', rates[0].length);
      document.getElementById('plot-throughput').setAttribute('data-from-ms', state.history.length ? Math.round(state.history[0].t * 1000) : '');
      const partitions = s.partitions.map((p) => p.partition);
      if (!this.lag || this.lagSeries !== partitions.join(',')) {
        const container = document.getElementById('plot-lag');
        container.replaceChildren();
        this.lag = plot(container, 'Lag (events)', ['all'].concat(partitions.map((p) => 'partition ' + p)));
        this.lagSeries = partitions.join(',');
      }
      const h = state.history;
      this.lag.setData([h.map((x) => x.t), h.map((x) => x.lag)].concat(partitions.map((p) => h.map((x) => x.perPartition[p] ?? null))));
    },
  };

  views.partitions = {
    title: 'Partitions',
    render(root) {
      root.append(el('h2', {}, 'Partitions'), el('p', { id: 'partitions-summary' }), el('div', { id: 'partitions-table' }));
    },
    async refresh() {
      const o = await api('overview');
      sample(o);
      const s = o.status;
      text(document.getElementById('partitions-summary'), number(s.retrying) + ' events waiting in retry; ' + number(s.outbox) + ' outbox records not yet appended.');
      const rows = [];
      for (const p of s.partitions) {
        const owner = ownerOf(o, p);
        rows.push(el('tr', { 'data-partition': p.partition },
          el('td', {}, p.partition), el('td', {}, number(p.position)), el('td', {}, number(p.first)), el('td', {}, number(p.end)),
          el('td', { class: 'lag' }, number(p.lag)), el('td', {}, number(p.end_at_start)), el('td', {}, p.caught_up ? 'yes' : 'no'),
          el('td', { class: 'owner' }, owner), el('td', {}, p.stopped ? 'stopped: ' + p.truncated : p.truncated || ''),
          el('td', { class: 'batch' }, batchText(o.batches[p.partition])), el('td', { class: 'phases' }, phasesText(o.batches[p.partition]))));
        for (const t of p.topics || []) {
          rows.push(el('tr', { class: 'sub' }, el('td', {}, '  ' + t.topic), el('td', {}, number(t.position)), el('td', {}, number(t.first)), el('td', {}, number(t.end)), el('td', {}, number(t.lag)), el('td', {}), el('td', {}), el('td', {}), el('td', {}), el('td', {}), el('td', {})));
        }
      }
      document.getElementById('partitions-table').replaceChildren(table(['Partition', 'Position', 'First', 'End', 'Lag', 'End at start', 'Caught up', 'Owner', 'Lost tail', 'Last batch', 'Its phases'], rows, { id: 'partitions' }));
    },
  };

  views['event-time'] = {
    title: 'Event time',
    render(root) {
      root.append(el('h2', {}, 'Event time'), el('div', { id: 'event-time-body' }), el('div', { id: 'plot-watermark' }), el('section', { id: 'late-events' }));
      this.plot = plot(document.getElementById('plot-watermark'), 'Watermark lag (s), the most of any partition', ['watermark lag']);
    },
    async refresh() {
      const o = await api('overview');
      sample(o);
      const timings = o.status.event_time || [];
      const body = document.getElementById('event-time-body');
      if (timings.length === 0) {
        body.replaceChildren(el('p', { id: 'event-time-none' }, 'This projection reads one topic: its events are applied in offset order, with no clock to wait for. ' + number(o.status.order_violations || 0) + ' late events.'));
      } else {
        body.replaceChildren(...timings.map((t) => el('section', { class: 'partition-clock', 'data-partition': t.partition },
          el('h3', {}, 'Partition ' + t.partition),
          el('p', { class: 'waits' }, o.waits[t.partition] || ''),
          facts([
            ['Clock', time(t.clock_ms)], ['Watermark lag', duration(t.watermark_lag_ms)],
            ['Held', number(t.held_events) + ' events, ' + number(t.held_bytes) + ' bytes (peak ' + number(t.peak_held_bytes) + ')'],
            ['Late events', number(t.order_violations)],
          ]),
          table(['Input', 'Position', 'Clock', 'Counts', 'Paused', 'Replaying'], t.inputs.map((i) => el('tr', {},
            el('td', {}, i.topic), el('td', {}, number(i.position)), el('td', {}, time(i.clock_ms)),
            el('td', {}, i.idle ? 'no (reached the end)' : 'yes'), el('td', {}, i.paused ? 'yes' : 'no'), el('td', {}, i.replaying ? 'yes' : 'no')))))));
      }
      const h = state.history;
      this.plot.setData([h.map((x) => x.t), h.map((x) => x.watermark / 1000)]);
      const late = await api('late-events');
      document.getElementById('late-events').replaceChildren(
        el('h3', {}, 'Late events'),
        el('p', { id: 'late-summary' }, number(late.total) + ' late events read since the host started' + (late.total > late.recent.length ? '; the ' + late.recent.length + ' most recent:' : late.total ? ':' : '.')),
        late.recent.length === 0 ? null : table(['Key', 'Topic', 'Partition', 'Offset', 'Event time', 'Late by', 'Read at'], late.recent.map((e) => el('tr', { class: 'late' },
          el('td', { class: 'key' }, e.key), el('td', {}, e.topic), el('td', {}, e.partition), el('td', {}, number(e.offset)),
          el('td', {}, time(e.event_time_ms)), el('td', { class: 'lateness' }, duration(e.lateness_ms)), el('td', {}, time(e.read_at_ms)))), { id: 'late-table' }));
    },
  };

  // ---- dead letters ----
  function letterQuery() {
    const f = state.letters.filters;
    const parts = [];
    for (const [name, value] of Object.entries(f)) if (value) parts.push(encodeURIComponent(name) + '=' + encodeURIComponent(value));
    if (state.letters.after) parts.push('after=' + encodeURIComponent(state.letters.after));
    parts.push('limit=50');
    return parts.join('&');
  }

  views['dead-letters'] = {
    title: 'Dead letters',
    render(root) {
      const field = (name, label, kind) => el('label', {}, label, el('input', { name, id: 'filter-' + name, type: kind || 'text' }));
      const select = (name, label, options) => el('label', {}, label, el('select', { name, id: 'filter-' + name }, options.map(([v, l]) => el('option', { value: v }, l))));
      const form = el('form', { id: 'letter-filters', class: 'filters' },
        select('class', 'Class', [['', 'any'], ['transient', 'transient'], ['retryable', 'retryable'], ['unrecoverable', 'unrecoverable'], ['trap', 'trap'], ['malformed', 'malformed'], ['undeliverable', 'undeliverable']]),
        field('type', 'Event type'), field('key', 'Key (JSON)'), field('topic', 'Topic'), field('version', 'Module version'),
        select('state', 'State', [['', 'any'], ['waiting', 'waiting'], ['redriven', 're-driven']]),
        el('button', { type: 'submit', id: 'apply-filters' }, 'Search'));
      form.addEventListener('submit', (event) => {
        event.preventDefault();
        const data = new FormData(form);
        state.letters.filters = Object.fromEntries([...data.entries()].map(([k, v]) => [k, String(v).trim()]));
        state.letters.after = null;
        state.letters.pages = [];
        this.refresh().catch((e) => notice(e.message, 'error'));
      });
      const actions = el('div', { class: 'actions' },
        el('button', { id: 'redrive-selected', type: 'button', class: 'act' }, 'Re-drive selected'),
        el('button', { id: 'redrive-key', type: 'button', class: 'act' }, 'Re-drive the filtered key'),
        el('button', { id: 'redrive-all', type: 'button', class: 'act' }, 'Re-drive all waiting'),
        el('button', { id: 'letters-first', type: 'button' }, 'First page'),
        el('button', { id: 'letters-prev', type: 'button' }, 'Previous page'),
        el('button', { id: 'letters-next', type: 'button' }, 'Next page'));
      root.append(el('h2', {}, 'Dead letters'), el('div', { id: 'letter-counts' }), form, actions, el('div', { id: 'letters' }), el('section', { id: 'letter-detail' }));
      const redrive = async (body, what) => {
        try {
          const done = await act('redrive', body);
          const others = done.left ? '; left ' + done.left + ' to the hosts of partitions ' + done.others.join(', ') : '';
          notice('Re-drove ' + done.records + ' dead letters (' + done.events + ' events) ' + what + ' into ' + done.retry_topic + (done.already ? ' (' + done.already + ' re-driven before, left alone)' : '') + others + '; the host applies them now.', 'ok');
          state.letters.selected.clear();
          await this.refresh();
        } catch (e) {
          notice('Nothing re-driven: ' + e.message, 'error');
        }
      };
      document.getElementById('redrive-selected').addEventListener('click', () => {
        const records = [...state.letters.selected];
        if (records.length === 0) return notice('Select dead letters first.', 'error');
        redrive({ records, topic: state.letters.filters.topic || undefined }, 'selected');
      });
      document.getElementById('redrive-key').addEventListener('click', () => {
        const key = state.letters.filters.key;
        if (!key) return notice('Filter by a key first.', 'error');
        redrive({ key, topic: state.letters.filters.topic || undefined }, 'of key ' + key);
      });
      document.getElementById('redrive-all').addEventListener('click', () => redrive({ all: true, topic: state.letters.filters.topic || undefined }, 'in all'));
      document.getElementById('letters-next').addEventListener('click', () => {
        if (!this.next) return;
        state.letters.pages.push(state.letters.after);
        state.letters.after = this.next;
        this.refresh();
      });
      document.getElementById('letters-prev').addEventListener('click', () => {
        if (state.letters.pages.length === 0) return;
        state.letters.after = state.letters.pages.pop();
        this.refresh();
      });
      document.getElementById('letters-first').addEventListener('click', () => {
        state.letters.after = null;
        state.letters.pages = [];
        this.refresh();
      });
    },
    async refresh() {
      const page = await api('dead-letters?' + letterQuery());
      this.next = page.next;
      document.getElementById('letter-counts').replaceChildren(facts([
        ['Dead-lettered', number(page.dead_lettered), 'dead-lettered'],
        ['Re-driven', number(page.redriven), 'redriven'],
        ['Applied', number(page.applied), 'applied'],
        ['This page', page.letters.length + ' found in ' + number(page.scanned) + ' read' + (page.next ? '; more follow' : ''), 'page'],
      ], 'letter-facts'));
      const rows = page.letters.map((l) => {
        const box = el('input', { type: 'checkbox', 'data-place': l.place, checked: state.letters.selected.has(l.place), disabled: l.state !== 'waiting' });
        box.addEventListener('change', () => (box.checked ? state.letters.selected.add(l.place) : state.letters.selected.delete(l.place)));
        const row = el('tr', { 'data-place': l.place, class: 'letter' },
          el('td', {}, box), el('td', {}, l.place), el('td', { class: 'key' }, l.key), el('td', {}, l.event_type), el('td', {}, l.class),
          el('td', { class: 'reason' }, l.reason), el('td', {}, l.topic + ' ' + l.origin), el('td', {}, l.attempts), el('td', {}, l.failed_at),
          el('td', {}, l.version ? l.module + ' @ ' + l.version.slice(0, 12) : ''), el('td', { class: 'state' }, l.state));
        row.addEventListener('click', (event) => {
          if (event.target.tagName !== 'INPUT') this.show(l.place);
        });
        return row;
      });
      document.getElementById('letters').replaceChildren(table(['', 'Place', 'Key', 'Type', 'Class', 'Reason', 'Origin', 'Attempts', 'Failed at', 'Module', 'State'], rows, { id: 'letter-table' }));
      if (state.letters.shown) await this.show(state.letters.shown, true);
    },
    async show(place, quiet) {
      state.letters.shown = place;
      const topic = state.letters.filters.topic ? '&topic=' + encodeURIComponent(state.letters.filters.topic) : '';
      try {
        const d = await api('dead-letter?record=' + encodeURIComponent(place) + topic);
        document.getElementById('letter-detail').replaceChildren(
          el('h3', {}, 'Dead letter ' + d.place),
          facts([['Key', d.key, 'key'], ['Type', d.event_type, 'type'], ['Event', d.event, 'event'], ['Class', d.class, 'class'], ['Reason', d.reason, 'reason'],
            ['Origin', d.topic + ' ' + d.origin + ' (' + d.events + ' events)', 'origin'], ['Attempts', d.attempts, 'attempts'], ['Failed at', d.failed_at, 'failed-at'],
            ['Module', d.module + ' @ ' + d.version, 'module'], ['State', d.state, 'state']], 'letter-facts-detail'),
          el('h4', {}, 'Body (' + d.body.kind + ', ' + number(d.body.bytes) + ' bytes' + (d.body.cut ? ', cut' : '') + ')'),
          el('pre', { id: 'letter-body' }, d.body.lines.join('\n')));
      } catch (e) {
        if (!quiet) notice(e.message, 'error');
      }
    },
  };

  // ---- modules ----
  views.modules = {
    title: 'Modules',
    render(root) {
      root.append(el('h2', {}, 'Modules'), el('div', { id: 'module-list' }));
    },
    /** A module's page of log lines, with buttons to page older and back to the newest. */
    async logOf(module) {
      const before = state.moduleLog[module.name];
      const page = await api('module-log?module=' + encodeURIComponent(module.name) + '&limit=20' + (before === undefined ? '' : '&before=' + before));
      const rows = page.lines.map((line) => el('tr', { 'data-seq': line.seq, class: 'level-' + line.level },
        el('td', {}, time(line.at_ms)), el('td', { class: 'level' }, line.level), el('td', { class: 'version' }, line.version),
        el('td', { class: 'key' }, line.key ?? '-'), el('td', { class: 'text' }, line.text)));
      const older = el('button', { type: 'button', class: 'log-older', disabled: page.next === null }, 'Older');
      older.addEventListener('click', () => { state.moduleLog[module.name] = page.next; this.refresh(); });
      const newest = el('button', { type: 'button', class: 'log-newest', disabled: before === undefined }, 'Newest');
      newest.addEventListener('click', () => { delete state.moduleLog[module.name]; this.refresh(); });
      return el('div', { class: 'module-log', 'data-module': module.name },
        el('h4', {}, 'Log lines'),
        el('p', { class: 'log-summary' }, number(page.written) + ' written since the host started; the last ' + number(page.kept_most) + ' kept, each cut at ' + number(page.line_bytes) + ' bytes; newest first'),
        rows.length > 0 ? table(['Time', 'Level', 'Version', 'Key', 'Line'], rows, { class: 'log' }) : el('p', { class: 'log-none' }, 'No line yet.'),
        el('p', {}, older, ' ', newest));
    },
    async refresh() {
      const m = await api('modules');
      const logs = await Promise.all(m.modules.map((module) => (module.usage.length > 0 ? this.logOf(module) : null)));
      const sections = m.modules.map((module, i) => {
        const kept = module.kept.map((version) => {
          const running = version === module.version;
          const button = el('button', { type: 'button', class: 'act run-version', 'data-module': module.name, 'data-version': version, disabled: running || !m.can_roll_back }, running ? 'running' : 'Run this version');
          button.addEventListener('click', async () => {
            try {
              const done = await act('rollback', { module: module.name, version });
              notice('Module ' + done.module + ': ' + done.from + ' → ' + done.to + '; it runs from the next batch.', 'ok');
              await this.refresh();
            } catch (e) {
              notice('Nothing changed: ' + e.message, 'error');
            }
          });
          return el('tr', { class: running ? 'running' : '' }, el('td', { class: 'version' }, version), el('td', {}, button));
        });
        const usage = module.usage.map((u) => {
          const failed = u.errors.filter(([c]) => c !== 'host').reduce((sum, [, n]) => sum + n, 0);
          const errors = u.errors.filter(([, n]) => n > 0).map(([c, n]) => number(n) + ' ' + c).join(', ');
          return el('tr', { 'data-version': u.version },
            el('td', { class: 'version' }, u.version),
            el('td', { class: 'calls' }, number(u.calls)),
            el('td', { class: 'errors', 'data-failed': failed }, errors || 'none'),
            el('td', { class: 'cpu', 'data-longest-us': u.longest_us }, callTime(u.longest_us) + ' longest, ' + callTime(u.p99_us) + ' p99, of ' + callTime(m.limits.call_budget_us)),
            el('td', { class: 'memory', 'data-bytes': u.memory_bytes }, bytes(u.memory_bytes) + ' in ' + number(u.instances) + ' instances'),
            el('td', { class: 'peak', 'data-bytes': u.memory_peak_bytes, 'data-limit': m.limits.memory_bytes }, bytes(u.memory_peak_bytes) + ' of ' + bytes(m.limits.memory_bytes)));
        });
        const usageTable = usage.length > 0
          ? table(['Version (newest loaded first)', 'Calls', 'Failed calls', 'Call time (of the budget)', 'Memory now', 'Most one instance held (of the limit)'], usage, { class: 'usage' })
          : el('p', { class: 'usage-none' }, 'Calls and memory are not measured for a native module.');
        const reload = module.reload ? (module.reload[1] ? 'refused ' + module.reload[0] + ': ' + module.reload[1] : 'loaded ' + module.reload[0]) : 'no reload yet';
        return el('section', { class: 'module', 'data-module': module.name },
          el('h3', {}, module.name),
          facts([['Running', module.version, 'running'], ['Last reload', reload, 'reload'],
            ['Event types', module.event_types.map(([tag, name, algebra]) => name + ' (tag ' + tag + ', ' + algebra + ')').join(', '), 'types']]),
          table(['Kept version (newest first)', ''], kept),
          usageTable,
          logs[i],
          table(['Swapped in (newest first)', 'By', 'At'], module.swaps.map(([version, action, at]) => el('tr', {},
            el('td', { class: 'version' }, version), el('td', { class: 'action' }, action), el('td', {}, time(at)))), { class: 'swaps' }));
      });
      document.getElementById('module-list').replaceChildren(...sections);
    },
  };

  // ---- topics ----
  views.topics = {
    title: 'Topics',
    render(root) {
      const form = el('form', { id: 'browse', class: 'filters' },
        el('label', {}, 'Topic', el('input', { id: 'browse-topic', name: 'topic' })),
        el('label', {}, 'Partition', el('input', { id: 'browse-partition', name: 'partition', type: 'number', min: 0, value: 0 })),
        el('label', {}, 'From offset (empty: the end)', el('input', { id: 'browse-from', name: 'from', type: 'number', min: 0 })),
        el('button', { type: 'submit', id: 'browse-go' }, 'Show'));
      form.addEventListener('submit', (event) => {
        event.preventDefault();
        const from = document.getElementById('browse-from').value.trim();
        state.browser = { topic: document.getElementById('browse-topic').value.trim(), partition: Number(document.getElementById('browse-partition').value || 0), from: from === '' ? 'end' : from };
        this.refresh().catch((e) => notice(e.message, 'error'));
      });
      const older = el('button', { id: 'browse-older', type: 'button' }, 'Older');
      const newer = el('button', { id: 'browse-newer', type: 'button' }, 'Newer');
      older.addEventListener('click', () => {
        if (!this.page) return;
        state.browser.from = String(Math.max(this.page.first, this.page.from - 20));
        this.refresh();
      });
      newer.addEventListener('click', () => {
        if (!this.page || this.page.next === null) return;
        state.browser.from = String(this.page.next);
        this.refresh();
      });
      root.append(el('h2', {}, 'Topics'), el('div', { id: 'topic-list' }), form, el('div', { class: 'actions' }, older, newer), el('div', { id: 'messages' }));
    },
    async refresh() {
      const t = await api('topics?limit=100');
      const rows = t.topics.map((topic) => {
        const count = topic.partitions.reduce((sum, [first, end]) => sum + (end - first), 0);
        const pick = el('button', { type: 'button', class: 'pick-topic', 'data-topic': topic.name }, 'Browse');
        pick.addEventListener('click', () => {
          document.getElementById('browse-topic').value = topic.name;
          state.browser = { topic: topic.name, partition: Number(document.getElementById('browse-partition').value || 0), from: 'end' };
          this.refresh();
        });
        return el('tr', { 'data-topic': topic.name }, el('td', {}, topic.name), el('td', {}, topic.role), el('td', {}, topic.partitions.length + topic.more_partitions), el('td', { class: 'count' }, number(count)), el('td', {}, pick));
      });
      document.getElementById('topic-list').replaceChildren(table(['Topic', 'Role', 'Partitions', 'Messages', ''], rows, { id: 'topic-table' }));
      if (!state.browser.topic) return;
      const b = state.browser;
      const page = await api('messages?topic=' + encodeURIComponent(b.topic) + '&partition=' + b.partition + '&from=' + encodeURIComponent(b.from) + '&limit=20');
      this.page = page;
      const items = page.messages.map((m) => el('article', { class: 'message', 'data-offset': m.offset },
        el('h4', {}, 'Offset ' + m.offset + (m.appended ? ', appended ' + m.appended : '')),
        m.event ? el('p', { class: 'event' }, m.event) : null,
        el('ul', { class: 'headers' }, m.headers.map(([name, value]) => el('li', {}, name + ': ' + value))),
        el('pre', { class: 'body' }, m.body.lines.join('\n'))));
      document.getElementById('messages').replaceChildren(
        el('p', { id: 'messages-range' }, page.topic + ' partition ' + page.partition + ': offsets ' + page.first + ' to ' + page.end + '; showing from ' + page.from),
        ...items);
    },
  };

  // ---- rebuilds ----
  views.rebuilds = {
    title: 'Rebuilds',
    render(root) {
      root.append(el('h2', {}, 'Rebuilds'), el('div', { id: 'rebuild-body' }));
    },
    async refresh() {
      const o = await api('overview');
      const r = o.status.rebuild;
      const body = document.getElementById('rebuild-body');
      if (!r) {
        body.replaceChildren(el('p', { id: 'rebuild-none' }, 'No rebuild has run on this host since it started (waku rebuild starts one).'));
        return;
      }
      body.replaceChildren(
        facts([['Generation', r.generation, 'generation'], ['Phase', r.phase, 'phase'], ['Promotion', r.promote, 'promote'], ['Distance to promotion', number(r.distance) + ' events', 'distance'],
          ['Held back emits', number(r.held_back), 'held-back'], ['Dead-lettered by the shadow', number(r.dead_lettered), 'shadow-dead'], ['Note', r.note || '', 'note'], ['Error', r.error || '', 'error'],
          ['Shadow modules', Object.entries(r.modules).map(([m, v]) => m + ' @ ' + v).join(', '), 'modules']], 'rebuild-facts'),
        table(['Partition', 'Shadow position', 'Live position', 'Progress'], r.partitions.map(([p, shadow, live]) =>
          el('tr', {}, el('td', {}, p), el('td', {}, number(shadow)), el('td', {}, number(live)), el('td', {}, el('progress', { max: Math.max(live, 1), value: Math.min(shadow, live) }))))));
    },
  };

  // ---- the shell ----
  function show(name) {
    const view = views[name] ? name : 'overview';
    if (state.timer) clearInterval(state.timer);
    state.view = view;
    for (const link of document.querySelectorAll('nav a')) link.classList.toggle('current', link.id === 'nav-' + view);
    const root = document.getElementById('view');
    root.replaceChildren();
    root.removeAttribute('data-loaded');
    root.setAttribute('data-view', view);
    views[view].render(root);
    const tick = () => views[view].refresh().then(() => {
      if (state.view !== view) return;
      text(document.getElementById('updated'), new Date().toISOString());
      root.setAttribute('data-loaded', 'true');
    }).catch((e) => notice(e.message, 'error'));
    tick();
    state.timer = setInterval(tick, POLL_MS);
  }

  async function start() {
    const session = await api('session');
    state.csrf = session.csrf;
    state.access = session.access;
    text(document.getElementById('projection'), session.projection);
    text(document.getElementById('access'), session.access === 'full' ? 'signed in: full access' : 'signed in: read only');
    document.body.classList.toggle('read-only', session.access !== 'full');
    document.getElementById('sign-out-form').addEventListener('submit', async (event) => {
      event.preventDefault();
      const response = await fetch('/console/sign-out', { method: 'POST', credentials: 'same-origin', headers: { 'x-waku-csrf': state.csrf } });
      if (!response.ok) return notice('Not signed out: ' + (await response.text()).trim(), 'error');
      window.location.assign('/console/sign-in');
    });
    window.addEventListener('hashchange', () => show(window.location.hash.slice(1)));
    await seedHistory().catch((e) => notice('No history of the host: ' + e.message, 'error'));
    show(window.location.hash.slice(1));
  }

  start().catch((e) => notice(e.message, 'error'));
})();
