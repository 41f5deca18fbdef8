// The official E2B JS SDK (npm `e2b`, exactly the version in package.json, installed by
// `npm ci` from the committed lock) in normal mode against `sandbox serve`'s E2B API.
//
// Environment: E2B_API_KEY (a tenant's token), E2B_API_URL and E2B_SANDBOX_URL (both the E2B
// listener), SANDBOX_E2B_JS_DIR (the directory `npm ci` installed into: the SDK is imported from
// its node_modules, never from the repository). Each step asserts the SDK's result; a failed
// step is reported and the others still run (all but the first, which makes the sandbox they
// use); every sandbox made is killed at the end. The last line is `scenario: N passed, M failed`.

import { randomBytes, createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const SDK_VERSION = '2.51.0';
const USER = 'user';
const HOME = `/home/${USER}`;
const RUN = randomBytes(4).toString('hex');
const WORK = `${HOME}/js-scenario-${RUN}`;
const METADATA = { 'scenario-js': RUN };

function need(name) {
  const value = process.env[name];
  if (!value) throw new Error(`${name} must be set`);
  return value;
}

// The SDK from the install directory: its package.json names the ES module entry.
async function loadSdk() {
  const root = join(need('SANDBOX_E2B_JS_DIR'), 'node_modules', 'e2b');
  const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  if (pkg.version !== SDK_VERSION) {
    throw new Error(`the installed e2b is ${pkg.version}, not ${SDK_VERSION}`);
  }
  if (!pkg.module) throw new Error('the installed e2b names no ES module entry');
  return import(pathToFileURL(join(root, pkg.module)).href);
}

function assert(cond, what) {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}

function eq(got, want, what) {
  const g = JSON.stringify(got);
  const w = JSON.stringify(want);
  if (g !== w) throw new Error(`${what}: got ${g}, want ${w}`);
}

// Runs `fn`, which must throw an instance of `type`; the error.
async function raises(type, fn, what) {
  let result;
  try {
    result = await fn();
  } catch (e) {
    if (e instanceof type) return e;
    throw new Error(`${what}: threw ${e?.constructor?.name}: ${e?.message}, want ${type.name}`);
  }
  throw new Error(`${what}: returned ${JSON.stringify(result)}, want ${type.name}`);
}

const sha256 = (bytes) => createHash('sha256').update(bytes).digest('hex');

async function main() {
  if (process.env.E2B_DEBUG) throw new Error('the scenario runs the SDK in normal mode: E2B_DEBUG must be unset');
  for (const name of ['E2B_API_KEY', 'E2B_API_URL', 'E2B_SANDBOX_URL']) need(name);
  const { Sandbox, CommandExitError, AuthenticationError, SandboxNotFoundError, NotFoundError } = await loadSdk();

  const made = [];
  const ctx = {};
  const steps = [];
  const step = (name, fn) => steps.push({ name, fn });

  step('commands_run_reports_the_exit_code', async () => {
    const ok = await ctx.sbx.commands.run('echo out-$((6*7)); echo err >&2; id -un; pwd');
    eq(ok.exitCode, 0, 'exit code of a command that succeeds');
    eq(ok.stdout, `out-42\n${USER}\n${HOME}\n`, 'its stdout');
    eq(ok.stderr, 'err\n', 'its stderr');
    const failed = await raises(CommandExitError, () => ctx.sbx.commands.run('echo before-exit; exit 7'), 'a command exiting 7');
    eq(failed.exitCode, 7, 'the CommandExitError exit code');
    eq(failed.stdout, 'before-exit\n', 'the failed command stdout');
    const env = await ctx.sbx.commands.run('printf %s "$SCENARIO_ENV"', { envs: { SCENARIO_ENV: 'from-js' }, cwd: '/tmp' });
    eq(env.stdout, 'from-js', 'an env var of the command');
  });

  step('files_write_and_read_bytes', async () => {
    // Every byte value, 0x00 and 0xff included, then random bytes: binary-safe both ways.
    const every = Uint8Array.from({ length: 256 }, (_, i) => i);
    const data = new Uint8Array(1024 * 1024 + 256 + 5);
    data.set(every, 0);
    data.set(randomBytes(data.length - 256), 256);
    data[data.length - 1] = 0xff;
    data[data.length - 2] = 0x00;
    const path = `${WORK}/bytes.bin`;
    const info = await ctx.sbx.files.write(path, data.buffer);
    eq(info.path, path, 'the written path');
    const inside = await ctx.sbx.commands.run(`sha256sum ${path}`);
    eq(inside.stdout.split(/\s+/)[0], sha256(data), 'the sandbox copy digest');
    const back = await ctx.sbx.files.read(path, { format: 'bytes' });
    assert(back instanceof Uint8Array, `read as bytes gives a ${back?.constructor?.name}`);
    eq(back.length, data.length, 'bytes read back');
    eq(sha256(back), sha256(data), 'the digest of the bytes read back');
    eq(Array.from(back.subarray(0, 4)), [0, 1, 2, 3], 'the first bytes');
    eq(back[255], 0xff, 'byte 255');
    await ctx.sbx.files.write(`${WORK}/text.txt`, 'plain text');
    eq(await ctx.sbx.files.read(`${WORK}/text.txt`), 'plain text', 'a text file read back');
    await raises(NotFoundError, () => ctx.sbx.files.read(`${WORK}/no-such-file`), 'reading a missing file');
  });

  step('files_list', async () => {
    await ctx.sbx.files.makeDir(`${WORK}/listed/sub`);
    await ctx.sbx.files.write(`${WORK}/listed/one.txt`, '1');
    const entries = await ctx.sbx.files.list(`${WORK}/listed`);
    eq(entries.map((e) => e.name).sort(), ['one.txt', 'sub'], 'the listed names');
    const sub = entries.find((e) => e.name === 'sub');
    eq(sub.type, 'dir', 'the directory entry type');
    eq(sub.path, `${WORK}/listed/sub`, 'the directory entry path');
  });

  step('sandbox_list_by_metadata', async () => {
    const items = await Sandbox.list({ query: { metadata: METADATA } }).nextItems();
    eq(items.map((s) => s.sandboxId), [ctx.sbx.sandboxId], 'the sandboxes listed with the run metadata');
    eq(items[0].metadata, METADATA, 'the listed metadata');
    eq(items[0].state, 'running', 'the listed state');
    const info = await ctx.sbx.getInfo();
    eq(info.templateId, 'base', 'the template of the sandbox');
  });

  step('wrong_api_key_raises_authentication', async () => {
    const apiKey = `e2b_${randomBytes(16).toString('hex')}`;
    await raises(AuthenticationError, () => Sandbox.create({ apiKey, timeoutMs: 60_000 }), 'create with a wrong key');
    await raises(AuthenticationError, () => Sandbox.list({ apiKey }).nextItems(), 'list with a wrong key');
    await raises(AuthenticationError, () => Sandbox.getInfo(ctx.sbx.sandboxId, { apiKey }), 'getInfo with a wrong key');
  });

  step('kill_then_not_found', async () => {
    const id = ctx.sbx.sandboxId;
    await ctx.sbx.kill();
    eq(await Sandbox.kill(id), false, 'a second kill');
    await raises(SandboxNotFoundError, () => Sandbox.connect(id), 'connect after kill');
    await raises(SandboxNotFoundError, () => Sandbox.getInfo(id), 'getInfo after kill');
    const items = await Sandbox.list({ query: { metadata: METADATA } }).nextItems();
    eq(items, [], 'the listing after kill');
    eq(await ctx.sbx.isRunning(), false, 'isRunning after kill');
  });

  let passed = 0;
  let failed = 0;
  const run = async (name, fn) => {
    const start = performance.now();
    try {
      await fn();
    } catch (e) {
      failed += 1;
      console.log(`FAIL ${name}: ${e?.constructor?.name}: ${e?.message}`);
      return false;
    }
    passed += 1;
    console.log(`ok   ${name} (${Math.round(performance.now() - start)} ms)`);
    return true;
  };
  try {
    const created = await run('create_with_metadata', async () => {
      ctx.sbx = await Sandbox.create('base', { metadata: METADATA, timeoutMs: 300_000 });
      made.push(ctx.sbx.sandboxId);
      assert(/^[a-z0-9]+$/.test(ctx.sbx.sandboxId), `sandbox id ${ctx.sbx.sandboxId}`);
      await ctx.sbx.files.makeDir(WORK);
    });
    if (created) {
      for (const { name, fn } of steps) await run(name, fn);
    }
  } finally {
    for (const id of made) {
      try {
        await Sandbox.kill(id);
      } catch (e) {
        console.log(`cleanup: kill ${id}: ${e?.constructor?.name}: ${e?.message}`);
      }
    }
  }
  console.log(`scenario: ${passed} passed, ${failed} failed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.log(`scenario: setup failed: ${e?.stack ?? e}`);
    process.exit(2);
  },
);
