// The demo page in Debian's Chromium, headless, with WebGPU on SwiftShader (no GPU needed):
// the page's own check must pass for several shapes, the numbers it shows must agree with an
// attention computed here in float64 from the tensors the page used, and the page must say so
// clearly when there is no WebGPU. Screenshots go to web-demo/artifacts/.
//
// Run by web-demo/test.sh, which builds web-demo/dist first; `node --test test/` alone works
// once dist/ exists.

import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const artifacts = join(root, 'artifacts');
// SwiftShader runs the kernels on the CPU's two cores: a few seconds a run, more for f16/bf16.
const RUN_TIMEOUT_MS = 120_000;

let server;
let baseUrl;
let browser;

before(async () => {
  mkdirSync(artifacts, { recursive: true });
  ({ server, baseUrl } = await serve(join(root, 'dist')));
  browser = await chromium.launch({
    // Debian's package; never a browser that Playwright downloads.
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    // Playwright starts Chromium with a fresh temporary --user-data-dir of its own.
    args: [
      '--enable-unsafe-webgpu', // WebGPU on Linux, where it is not yet on by default
      '--no-sandbox', // running as root
      // Nothing outside localhost is reachable here: no background connections to refuse.
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
  });
});

after(async () => {
  await browser?.close();
  server?.kill();
});

/** python3's http.server on a free port of 127.0.0.1 (it serves .wasm as application/wasm). */
function serve(directory) {
  return new Promise((resolve, reject) => {
    const child = spawn('python3', ['-u', '-m', 'http.server', '--bind', '127.0.0.1', '--directory', directory, '0'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`http.server exited with ${code}`)));
    child.stdout.on('data', (chunk) => {
      const port = /port (\d+)/.exec(String(chunk))?.[1];
      if (port) resolve({ server: child, baseUrl: `http://127.0.0.1:${port}/` });
    });
  });
}

/** The page's status element, parsed. */
const readStatus = async (page) => JSON.parse(await page.textContent('#status'));

/** Opens the page with `query` and waits until it has settled: ready, done or failed. */
async function open(query, { initScript } = {}) {
  const page = await browser.newPage({ viewport: { width: 1280, height: 1000 } });
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  if (initScript) await page.addInitScript(initScript);
  await page.goto(baseUrl + query);
  await page.waitForFunction(
    () => {
      const { state } = JSON.parse(document.getElementById('status').textContent);
      return state !== 'loading' && state !== 'running' && !(state === 'ready' && location.search.includes('run=1'));
    },
    null,
    { timeout: RUN_TIMEOUT_MS, polling: 250 },
  );
  return { page, status: await readStatus(page), errors };
}

/** Fills the form as a person would, presses Run and waits for that run to finish. */
async function runFromForm(page, settings) {
  const runs = (await readStatus(page)).runs ?? 0;
  for (const [name, value] of Object.entries(settings)) {
    const field = `#form [name=${name}]`;
    if (name === 'causal') await page.setChecked(field, value);
    else if (await page.$eval(field, (e) => e.tagName === 'SELECT')) await page.selectOption(field, String(value));
    else await page.fill(field, String(value));
  }
  await page.click('#run');
  await page.waitForFunction(
    (runs) => {
      const status = JSON.parse(document.getElementById('status').textContent);
      return status.runs > runs && status.state !== 'running';
    },
    runs,
    { timeout: RUN_TIMEOUT_MS, polling: 250 },
  );
  return readStatus(page);
}

const query = (s) => '?' + new URLSearchParams({ ...s, causal: s.causal ? '1' : '0', run: '1' });

// Shapes: causal and not, multi-head, grouped- and multi-query, sequence lengths that are not
// multiples of any tile (1, 77, 130, 200), every element type, a head dim that needs padding (80).
// Small, because SwiftShader is slow and the naive kernel slower (seconds per call here).
const CASES = [
  { name: 'mha-f32', batch: 1, num_heads: 4, num_kv_heads: 4, seq: 128, head_dim: 64, dtype: 'f32', causal: false },
  { name: 'gqa-causal-f32', batch: 2, num_heads: 4, num_kv_heads: 2, seq: 200, head_dim: 64, dtype: 'f32', causal: true },
  { name: 'mqa-causal-f16', batch: 1, num_heads: 4, num_kv_heads: 1, seq: 77, head_dim: 80, dtype: 'f16', causal: true },
  { name: 'gqa-bf16', batch: 1, num_heads: 6, num_kv_heads: 2, seq: 130, head_dim: 128, dtype: 'bf16', causal: false },
  { name: 'one-token', batch: 3, num_heads: 2, num_kv_heads: 1, seq: 1, head_dim: 32, dtype: 'f32', causal: true },
  // Decode: two new tokens against a longer cache (bottom-right causal, GQA): the decode
  // kernel with its keys in two pieces, several blocks each.
  { name: 'decode-gqa-f16', batch: 2, num_heads: 8, num_kv_heads: 2, seq: 2, seq_kv: 700, head_dim: 64, dtype: 'f16', causal: true },
];

describe('demo page on WebGPU (SwiftShader)', () => {
  // One page for the form cases, as a person would use it: one device, pipelines cached.
  let page;
  let pageErrors;
  before(async () => {
    let status;
    ({ page, status, errors: pageErrors } = await open(''));
    assert.equal(status.state, 'ready', `the page did not find a GPU: ${status.message}`);
  });
  after(() => page?.close());

  for (const c of CASES) {
    test(c.name, async () => {
      const { name, ...settings } = c;
      const status = await runFromForm(page, { seq_kv: '', ...settings, reps: 2, plan: '' });
      await page.screenshot({ path: join(artifacts, `${name}.png`), fullPage: true });
      assert.equal(status.state, 'done', `the run failed: ${status.message}`);
      assert.deepEqual(pageErrors, []);
      const r = status.report;
      assert.ok(status.pass, `the page's own check failed: ${r.check.failures.join('; ')}`);

      // The browser backend: no subgroups reach the kernels, whatever the browser offers; the
      // limits respected are the browser's.
      assert.equal(status.device.backend, 'BrowserWebGpu');
      assert.equal(status.device.subgroups, false);
      // A few query rows per K/V head go to the decode kernel, the rest to the tiled one.
      const decode = c.seq <= 16 && (c.num_heads / c.num_kv_heads) * c.seq <= 64;
      assert.match(status.kernel, decode ? /^flash_decode_\w+_wg_/ : /^flash_fwd_\w+_wg_f32_/);
      assert.ok(r.kernel.workgroup_size <= status.device.max_invocations_per_workgroup);
      assert.ok(r.kernel.workgroup_bytes <= status.device.max_workgroup_storage_bytes);

      // What the page shows is what it measured.
      assert.deepEqual(
        [r.problem.batch, r.problem.num_heads, r.problem.num_kv_heads, r.problem.seq_q, r.problem.head_dim, r.problem.dtype, r.problem.causal],
        [c.batch, c.num_heads, c.num_kv_heads, c.seq, c.head_dim, c.dtype, c.causal],
      );
      assert.equal(r.problem.seq_kv, c.seq_kv ?? c.seq);
      assert.ok(true
      );
      assert.ok(r.naive, `the naive kernel did not run: ${r.naive_skipped}`);
      assert.ok(status.flash_ms > 0 && status.naive_ms > 0);
      assert.ok(Math.abs(status.speedup - status.naive_ms / status.flash_ms) < 1e-9 * status.speedup);
      assert.equal(await page.textContent('#verdict'), 'pass');
      assert.match(await page.textContent('#summary'), new RegExp(r.kernel.name));
      assert.ok(r.check.reference_rows >= Math.min(32, r.check.total_rows));
      assert.ok(r.pattern.max_row_sum_error < 1e-3, `pattern rows sum to 1 ± ${r.pattern.max_row_sum_error}`);

      // An independent float64 attention from the page's own tensors: the error the page
      // reports must be the error there is.
      const t = await page.evaluate(() => {
        const tensors = window.flashDemo.lastRunTensors();
        if (!tensors) return null;
        // A wasm-bindgen object: its fields are getters, the arrays Float32Arrays.
        const fields = ['batch', 'seq', 'seq_kv', 'num_heads', 'num_kv_heads', 'head_dim', 'causal', 'scale', 'q', 'k', 'v', 'out', 'lse'];
        return Object.fromEntries(fields.map((f) => [f, ArrayBuffer.isView(tensors[f]) ? Array.from(tensors[f]) : tensors[f]]));
      });
      assert.ok(t, 'the page kept the tensors of this small run');
      const want = attention(t);
      const outError = maxAbs(t.out, want.out);
      const lseError = maxAbs(t.lse, want.lse);
      const tol = r.check.tolerance;
      assert.ok(outError <= tol.out_max_abs, `output max |Δ| ${outError} against this test's reference`);
      assert.ok(lseError <= tol.lse_max_abs, `LSE max |Δ| ${lseError} against this test's reference`);
      // Both compare the same numbers with a float64 reference, which differ only in how their
      // sums round (far below an f32 output's own rounding). The page may check a sample of
      // the rows, whose largest error is at most the largest of all.
      const slack = 1e-9 + 1e-6 * outError;
      const sampled = r.check.reference_rows < r.check.total_rows;
      assert.ok(sampled ? status.max_abs_error <= outError + slack : Math.abs(status.max_abs_error - outError) <= slack,
        `page says max |Δ| ${status.max_abs_error} over ${r.check.reference_rows} rows, this test finds ${outError}`);
    });
  }

  test('a link runs its problem; a long one is checked on sampled rows and drawn in blocks of keys', async () => {
    const { page, status } = await open(query({ batch: 1, num_heads: 2, num_kv_heads: 2, seq: 1030, head_dim: 32, dtype: 'f32', causal: true, reps: 1 }));
    await page.screenshot({ path: join(artifacts, 'long-f32.png'), fullPage: true });
    await page.close();
    assert.equal(status.state, 'done', status.message);
    assert.ok(status.pass, status.report.check.failures.join('; '));
    const { check, pattern } = status.report;
    assert.ok(check.reference_rows < check.total_rows && check.reference_rows >= 32);
    assert.equal(pattern.rows.length, 128);
    assert.ok(pattern.keys_per_column > 1);
    assert.ok(pattern.max_row_sum_error < 1e-3);
  });

  test('an invalid problem is reported, not thrown', async () => {
    const { page, status } = await open(query({ batch: 1, num_heads: 6, num_kv_heads: 4, seq: 16, head_dim: 64, dtype: 'f32', causal: false }));
    const text = await page.textContent('#failures');
    await page.close();
    assert.equal(status.state, 'error');
    assert.match(status.message, /num_kv_heads|heads/);
    assert.match(text, /heads/);
  });
});

describe('without WebGPU', () => {
  test('a browser without navigator.gpu is told so', async () => {
    const { page, status } = await open('', {
      initScript: () => Object.defineProperty(Navigator.prototype, 'gpu', { get: () => undefined }),
    });
    await page.screenshot({ path: join(artifacts, 'no-webgpu.png') });
    const shown = await page.isVisible('#unavailable');
    await page.close();
    assert.equal(status.error, 'no-webgpu');
    assert.ok(shown);
  });

  test('a browser whose WebGPU gives no adapter is told so', async () => {
    const { page, status } = await open('', {
      initScript: () => { GPU.prototype.requestAdapter = async () => null; },
    });
    const text = await page.textContent('#unavailable');
    await page.close();
    assert.equal(status.error, 'no-adapter');
    assert.match(text, /no adapter/);
  });
});

// ---------------------------------------------------------------- float64 reference

/** Attention in float64, [batch, seq, heads, head_dim] layout, bottom-right causal mask. */
function attention({ batch, seq, seq_kv, num_heads, num_kv_heads, head_dim, causal, scale, q, k, v }) {
  const out = new Float64Array(q.length);
  const lse = new Float64Array(batch * num_heads * seq);
  // [batch, rows, heads, head_dim]; causal is aligned to the bottom-right corner.
  const at = (b, s, h, heads, rows) => ((b * rows + s) * heads + h) * head_dim;
  for (let b = 0; b < batch; b++) {
    for (let h = 0; h < num_heads; h++) {
      const g = Math.floor(h / (num_heads / num_kv_heads));
      for (let i = 0; i < seq; i++) {
        const visible = causal ? Math.max(0, Math.min(seq_kv, i + 1 + seq_kv - seq)) : seq_kv;
        const qi = at(b, i, h, num_heads, seq);
        const scores = new Float64Array(visible);
        let max = -Infinity;
        for (let j = 0; j < visible; j++) {
          const kj = at(b, j, g, num_kv_heads, seq_kv);
          let dot = 0;
          for (let d = 0; d < head_dim; d++) dot += q[qi + d] * k[kj + d];
          scores[j] = scale * dot;
          max = Math.max(max, scores[j]);
        }
        let sum = 0;
        for (let j = 0; j < visible; j++) sum += (scores[j] = Math.exp(scores[j] - max));
        for (let j = 0; j < visible; j++) {
          const vj = at(b, j, g, num_kv_heads, seq_kv);
          for (let d = 0; d < head_dim; d++) out[qi + d] += (scores[j] / sum) * v[vj + d];
        }
        lse[(b * num_heads + h) * seq + i] = max + Math.log(sum);
      }
    }
  }
  return { out, lse };
}

function maxAbs(got, want) {
  let max = 0;
  for (let n = 0; n < want.length; n++) {
    const d = Math.abs(got[n] - want[n]);
    if (Number.isNaN(d)) return NaN;
    max = Math.max(max, d);
  }
  return max;
}
