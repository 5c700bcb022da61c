// The page: finds WebGPU, opens the library (compiled to wasm), runs the problem the form
// describes, and shows timings, errors and one head's attention pattern. Everything it learns
// also goes into <pre id="status"> as JSON, which the browser test reads.

import init, { Demo } from './pkg/wgpu_flash_attn_web_demo.js';

const $ = (id) => document.getElementById(id);
const form = $('form');
const INTEGER_FIELDS = ['batch', 'num_heads', 'num_kv_heads', 'seq', 'head_dim', 'reps', 'seed', 'head'];

const status = { state: 'loading' };
// What a run reports, cleared when the next one starts.
const NO_RESULT = {
  pass: null, kernel: null, max_abs_error: null, rel_l2_error: null, flash_ms: null, naive_ms: null, speedup: null,
  report: null, error: null, message: null,
};
function setStatus(fields) {
  Object.assign(status, fields);
  $('status').textContent = JSON.stringify(status, null, 2);
}

// ---------------------------------------------------------------- settings <-> form <-> URL

function readForm() {
  const settings = { dtype: form.dtype.value, causal: form.causal.checked };
  for (const name of INTEGER_FIELDS) settings[name] = Number(form[name].value);
  // Empty means the cache is as long as the queries; set, the new tokens attend to a longer cache.
  if (form.seq_kv.value !== '') settings.seq_kv = Number(form.seq_kv.value);
  const splits = new URLSearchParams(location.search).get('decode_splits');
  if (splits) settings.decode_splits = Number(splits);
  // Absent means automatic selection.
  if (form.plan.value !== '') settings.plan = Number(form.plan.value);
  return settings;
}

// A link such as ?seq=1000&causal=1&run=1 fills the form (and runs it), so a result can be shared.
function applyUrl() {
  const params = new URLSearchParams(location.search);
  for (const name of INTEGER_FIELDS) if (params.has(name)) form[name].value = params.get(name);
  form.seq_kv.value = params.get('seq_kv') ?? '';
  if (params.has('dtype')) form.dtype.value = params.get('dtype');
  if (params.has('causal')) form.causal.checked = params.get('causal') === '1';
  if (params.has('plan')) form.plan.dataset.wanted = params.get('plan'); // the options come later
  return params.get('run') === '1';
}

function recordInUrl(settings) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(settings)) params.set(name, typeof value === 'boolean' ? Number(value) : value);
  params.set('run', '1');
  history.replaceState(null, '', `?${params}`);
}

// ---------------------------------------------------------------- formatting

const ms = (x) => (x >= 100 ? x.toFixed(0) : x >= 10 ? x.toFixed(1) : x.toFixed(2)) + ' ms';
const sci = (x) => (x === null || x === undefined ? 'NaN' : x === 0 ? '0' : x.toExponential(1));
const mib = (bytes) => (bytes / 2 ** 20).toFixed(bytes < 2 ** 20 ? 2 : 1) + ' MiB';
const kib = (bytes) => (bytes / 1024).toFixed(1) + ' KiB';
// 4·B·H·Sq·Skv·D (halved when causal), in the unit that leaves a few significant digits.
const flopText = (x) => (x >= 1e9 ? `${(x / 1e9).toFixed(2)} G` : `${(x / 1e6).toFixed(x >= 1e7 ? 0 : 1)} M`) + 'FLOP';
const rate = (flops, millis) => flopText(flops / (millis / 1e3)) + '/s';

function errors(e) {
  const bad = e.non_finite ? `, <strong>${e.non_finite} non-finite</strong>` : '';
  return `max |Δ| ${sci(e.max_abs)}, rel L2 ${sci(e.rel_l2)}${bad}`;
}

function fact(list, term, description) {
  const dt = document.createElement('dt');
  const dd = document.createElement('dd');
  dt.textContent = term;
  dd.innerHTML = description;
  list.append(dt, dd);
}

// ---------------------------------------------------------------- start-up

function unavailable(kind, title, text) {
  $('unavailable-title').textContent = title;
  $('unavailable-text').innerHTML = text;
  $('unavailable').hidden = false;
  $('device').innerHTML = '';
  fact($('device'), 'Status', title);
  setStatus({ state: 'error', error: kind, message: $('unavailable-text').textContent });
}

async function start() {
  const autorun = applyUrl();
  if (!navigator.gpu) {
    unavailable('no-webgpu', 'This browser has no WebGPU',
      '<code>navigator.gpu</code> is missing. WebGPU needs a secure context (https or localhost) and a ' +
      'browser that ships it: Chrome or Edge 113+, Safari 26+, Firefox 141+ on Windows. On Linux, ' +
      'Chromium needs <code>--enable-unsafe-webgpu</code>.');
    return;
  }
  // The page asks for an adapter itself only to say what the browser offers; the library opens
  // its own below.
  const adapter = await navigator.gpu.requestAdapter().catch(() => null);
  if (!adapter) {
    unavailable('no-adapter', 'WebGPU gave no adapter',
      'The browser has WebGPU but <code>requestAdapter()</code> returned nothing: the GPU may be ' +
      'blocklisted or WebGPU disabled. On Linux, start Chromium with <code>--enable-unsafe-webgpu</code>.');
    return;
  }

  await init();
  let demo;
  try {
    demo = await Demo.open();
  } catch (e) {
    unavailable('no-device', 'The library could not open the GPU', String(e.message ?? e));
    return;
  }
  const device = demo.device();
  showDevice(device, adapter);
  demo.plans().forEach((plan, i) => form.plan.add(new Option(plan, String(i))));
  form.plan.value = form.plan.dataset.wanted ?? '';
  setStatus({ state: 'ready', device, browser_features: [...adapter.features].sort() });

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    run(demo);
  });
  $('run').disabled = false;
  // For checking the page from outside: the browser test recomputes the last run's attention.
  window.flashDemo = { lastRunTensors: () => demo.last_run_tensors() };
  if (autorun) run(demo);
}

function showDevice(device, adapter) {
  const list = $('device');
  list.innerHTML = '';
  const info = adapter.info ?? {};
  const name = device.adapter || info.description || [info.vendor, info.architecture].filter(Boolean).join(' ');
  fact(list, 'Adapter', `${name || 'unnamed'} <span class="muted">(${device.backend}, ${device.device_type})</span>`);
  const offered = [...adapter.features].filter((f) => f === 'subgroups' || f === 'shader-f16');
  const used = [device.subgroups && 'subgroups', device.shader_f16 && 'shader-f16'].filter(Boolean);
  fact(list, 'Features', `browser offers ${offered.join(', ') || 'neither subgroups nor shader-f16'}; ` +
    `the kernels use ${used.join(', ') || 'neither'}` +
    (offered.includes('subgroups') && !device.subgroups
      ? ' <span class="muted">(wgpu 30 does not pass subgroups through to the browser, so rows are reduced in workgroup memory)</span>'
      : ''));
  fact(list, 'Limits', `${device.max_invocations_per_workgroup} invocations and ` +
    `${kib(device.max_workgroup_storage_bytes)} of workgroup memory per workgroup, ` +
    `${mib(device.max_storage_binding_bytes)} per storage binding`);
}

// ---------------------------------------------------------------- a run

async function run(demo) {
  const settings = readForm();
  recordInUrl(settings);
  $('run').disabled = true;
  $('progress').textContent = 'running…';
  // `runs` tells a watcher (the browser test) that this is a new run, not the last one's result.
  setStatus({ state: 'running', runs: (status.runs ?? 0) + 1, settings, ...NO_RESULT });
  try {
    const report = await demo.run(settings);
    showReport(report);
    drawPattern(report.pattern, report.problem);
    const { check, flash, naive } = report;
    // The pattern's cells are left out: the test does not need 16k numbers.
    const { mass, ...pattern } = report.pattern;
    setStatus({
      state: 'done',
      pass: check.pass,
      kernel: report.kernel.name,
      max_abs_error: check.flash_vs_reference.max_abs,
      rel_l2_error: check.flash_vs_reference.rel_l2,
      flash_ms: flash.median_ms,
      naive_ms: naive ? naive.median_ms : null,
      speedup: report.speedup ?? null,
      report: { ...report, pattern },
    });
  } catch (e) {
    $('results').hidden = false;
    $('pattern-card').hidden = true;
    $('verdict').textContent = 'error';
    $('verdict').className = 'badge fail';
    $('summary').innerHTML = '';
    $('failures').innerHTML = '';
    const item = document.createElement('li');
    item.textContent = String(e.message ?? e);
    $('failures').append(item);
    setStatus({ state: 'error', error: 'run', message: String(e.message ?? e), pass: false });
  } finally {
    $('run').disabled = false;
    $('progress').textContent = '';
  }
}

function showReport(r) {
  const { problem: p, kernel, flash, naive, check } = r;
  const rows = [
    ['Problem', `batch ${p.batch}, ${p.num_heads} heads (${p.num_kv_heads} KV), ` +
      (p.seq_kv === p.seq_q ? `sequence ${p.seq_q}` : `${p.seq_q} new tokens against a cache of ${p.seq_kv}`) + `, head dim ${p.head_dim}, ` +
      `${p.dtype}${p.causal ? ', causal' : ''} · ${flopText(p.flops)}`],
    ['Kernel', `<code>${kernel.name}</code><br><span class="muted">${kernel.workgroup_size} invocations, ` +
      `${kib(kernel.workgroup_bytes)} workgroup memory; pipeline built in ${ms(kernel.build_ms)}</span>`],
    ['Flash', `<strong>${ms(flash.median_ms)}</strong> · ${rate(p.flops, flash.median_ms)} ` +
      `<span class="muted">median of ${flash.runs_ms.length}; first call ${ms(flash.first_ms)}; ${mib(flash.device_bytes)} on the GPU</span>`],
    ['Naive', naive
      ? `<strong>${ms(naive.median_ms)}</strong> · ${rate(p.flops, naive.median_ms)} ` +
        `<span class="muted">median of ${naive.runs_ms.length}; first call ${ms(naive.first_ms)}; ${mib(naive.device_bytes)} on the GPU, score matrices included</span>`
      : `not run: ${r.naive_skipped}`],
    ['Speed-up', r.speedup ? `<strong>${r.speedup.toFixed(2)}×</strong> <span class="muted">(wall time of the awaited calls: upload, dispatch, read-back)</span>` : '—'],
    ['vs float64', `flash ${errors(check.flash_vs_reference)}; LSE max |Δ| ${sci(check.lse_vs_reference.max_abs)}` +
      (check.naive_vs_reference ? `<br>naive ${errors(check.naive_vs_reference)}` : '') +
      `<br><span class="muted">${check.reference_rows === check.total_rows ? 'every' : `${check.reference_rows} evenly spaced of`} ` +
      `${check.total_rows} query rows, ${ms(check.reference_ms)} on the CPU</span>`],
    ['Flash vs naive', check.flash_vs_naive ? `${errors(check.flash_vs_naive)} <span class="muted">over all ${check.flash_vs_naive.count} outputs</span>` : '—'],
    ['Bounds', `rel L2 ≤ ${sci(check.tolerance.out_rel_l2)}, max |Δ| ≤ ${sci(check.tolerance.out_max_abs)}, ` +
      `LSE ≤ ${sci(check.tolerance.lse_max_abs)} <span class="muted">(twice these between the kernels)</span>`],
  ];
  $('summary').innerHTML = rows.map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join('');
  $('verdict').textContent = check.pass ? 'pass' : 'fail';
  $('verdict').className = `badge ${check.pass ? 'pass' : 'fail'}`;
  $('failures').innerHTML = '';
  for (const failure of check.failures) {
    const item = document.createElement('li');
    item.textContent = failure;
    $('failures').append(item);
  }
  $('results').hidden = false;
}

// ---------------------------------------------------------------- the pattern

// Viridis at nine stops: perceptually even, and readable in grey.
const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
  [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
const MASKED = [226, 230, 236];

function colour(t) {
  const x = Math.min(Math.max(t, 0), 1) * (VIRIDIS.length - 1);
  const i = Math.min(Math.floor(x), VIRIDIS.length - 2);
  const f = x - i;
  return VIRIDIS[i].map((c, k) => Math.round(c + f * (VIRIDIS[i + 1][k] - c)));
}

function drawPattern(pattern, problem) {
  const { rows, columns, mass } = pattern;
  const max = mass.reduce((m, x) => Math.max(m, x), 0) || 1;
  // One pixel per cell, then scaled up without smoothing.
  const cells = new ImageData(columns, rows.length);
  mass.forEach((x, n) => {
    // A square root spreads the small masses of long rows over the colours.
    const rgb = x < 0 ? MASKED : colour(Math.sqrt(x / max));
    cells.data.set([...rgb, 255], 4 * n);
  });
  const scratch = new OffscreenCanvas(columns, rows.length);
  scratch.getContext('2d').putImageData(cells, 0, 0);
  const canvas = $('pattern');
  const ctx = canvas.getContext('2d');
  ctx.imageSmoothingEnabled = false;
  ctx.fillStyle = '#fff';
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.drawImage(scratch, 0, 0, canvas.width, canvas.height);

  const legend = $('legend').getContext('2d');
  for (let y = 0; y < 256; y++) {
    legend.fillStyle = `rgb(${colour(1 - y / 255)})`;
    legend.fillRect(0, y, 16, 1);
  }
  $('legend-max').textContent = max.toPrecision(2);

  const kvHead = Math.floor(pattern.head / (problem.num_heads / problem.num_kv_heads));
  const queries = rows.length < problem.seq_q ? `${rows.length} evenly spaced queries of ${problem.seq_q}` : 'every query';
  $('pattern-caption').innerHTML =
    `Batch 0, query head ${pattern.head} (K/V head ${kvHead}). ` +
    `Rows: ${queries}; columns: keys` +
    `${pattern.keys_per_column > 1 ? ` in blocks of ${pattern.keys_per_column}, each cell the sum over its block` : ''}; ` +
    `colour: √ of the probability, grey where the causal mask hides the keys. ` +
    `The kernel never forms these: they are <code>exp(scale·q·k − lse)</code> from Q, K and the LSE it returned, ` +
    `and each row sums to 1 within ${sci(pattern.max_row_sum_error)}.`;
  $('pattern-card').hidden = false;
}

start().catch((e) => {
  unavailable('start', 'The page failed to start', String(e.message ?? e));
});
