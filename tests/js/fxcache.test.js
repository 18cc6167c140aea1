// node --test for js/fxcache.js (run by tests/test_action_js.py). A stand-in `fxcache`
// answers `--version` and `action describe` through the real toolkit (REAL_FXCACHE) and
// records, for every other step, the environment it was given.
"use strict";
const assert = require("node:assert/strict");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const test = require("node:test");

const js = require("../../js/fxcache.js");

function sandbox() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "fxcache-js-"));
  const fake = path.join(dir, "fxcache");
  const version = /__version__ = "(.*)"/.exec(
    fs.readFileSync(path.join(js.ACTION_ROOT, "ci_fxcache", "__init__.py"), "utf8"))[1];
  fs.writeFileSync(fake, `#!/bin/bash
if [ "$1" = --version ]; then echo "fxcache ${version}"; exit 0; fi
if [ "$2" = describe ]; then exec $REAL_FXCACHE action describe "$3"; fi
env -0 > "${dir}/env-$2"
exit "\${FAIL_AT_STEP_RC:-0}"
`, { mode: 0o755 });
  const state = path.join(dir, "state");
  fs.writeFileSync(state, "");
  const env = {
    PATH: process.env.PATH,
    HOME: process.env.HOME || dir,
    REAL_FXCACHE: process.env.REAL_FXCACHE,
    RUNNER_TEMP: dir,
    GITHUB_ACTIONS: "true",
    GITHUB_STATE: state,
    GITHUB_ENV: path.join(dir, "github-env"),
    GITHUB_OUTPUT: path.join(dir, "github-output"),
    FXCACHE_TOOLKIT: fake,
    ACTIONS_RUNTIME_TOKEN: "runtime-token",
    ACTIONS_RESULTS_URL: "http://results.invalid/",
    ACTIONS_ID_TOKEN_REQUEST_TOKEN: "oidc-token",
    AWS_SECRET_ACCESS_KEY: "aws-secret-key",
    "INPUT_PYTHON": "python3",
    "INPUT_STORE": "local",
    "INPUT_GITHUB-TOKEN": "ghs_secret_token",
    "INPUT_SIGNING-KEY": "first line of the key\nsecond line of the key",
    "INPUT_REDIS-URL": "redis://:hunter2@cache.internal:6379/0",
  };
  const log = [];
  const io = { write: (s) => log.push(s) };
  const stepEnv = (step) => {
    const file = path.join(dir, `env-${step}`);
    if (!fs.existsSync(file)) return null;
    const out = {};
    for (const pair of fs.readFileSync(file, "utf8").split("\0")) {
      const at = pair.indexOf("=");
      if (at > 0) out[pair.slice(0, at)] = pair.slice(at + 1);
    }
    return out;
  };
  return { dir, fake, env, log, io, stepEnv };
}

test("every line of a secret is masked, one command per line", () => {
  const out = [];
  js.maskLines("line one\r\nline two\n\n", (s) => out.push(s));
  assert.deepEqual(out, ["::add-mask::line one\n", "::add-mask::line two\n"]);
});

test("main runs the steps in order, each in its own group, with only its secrets", () => {
  const box = sandbox();
  assert.equal(js.main(box.env, box.io), 0);
  const text = box.log.join("");
  const groups = [...text.matchAll(/::group::(.*)\n/g)].map((m) => m[1]);
  assert.deepEqual(groups, [
    "Install the fxcache toolkit", "Check the inputs and decide trust",
    "Restore from the GitHub cache", "Restore the cache", "Verify hot loads", "Report",
    "Comment on the pull request", "Fail on the verdicts (fail-on)",
  ]);
  for (const line of ["first line of the key", "second line of the key", "ghs_secret_token"]) {
    assert.ok(text.includes(`::add-mask::${line}\n`), line);
  }
  const secrets = ["ghs_secret_token", "line of the key", "hunter2", "runtime-token", "oidc-token",
                   "aws-secret-key"];
  const seen = {};
  for (const step of ["setup", "gha-restore", "restore", "verify", "report", "comment", "conclude"]) {
    const env = box.stepEnv(step);
    assert.ok(env, `${step} did not run`);
    assert.equal(Object.keys(env).filter((k) => k.startsWith("INPUT_")).length, 0, step);
    const inputs = JSON.parse(env.FXCACHE_INPUTS);
    assert.equal(inputs.store, "local");
    const all = JSON.stringify(env);
    seen[step] = secrets.filter((s) => all.includes(s));
    assert.equal("GITHUB_STATE" in env, step === "setup", step);
  }
  assert.deepEqual(seen, {
    setup: ["hunter2"],
    "gha-restore": ["runtime-token"],
    restore: ["line of the key", "hunter2", "aws-secret-key"],
    verify: ["hunter2"],
    report: [],
    comment: ["ghs_secret_token"],
    conclude: [],
  });
  // The post step will run this toolkit, kept in the runner-held state.
  assert.match(fs.readFileSync(box.env.GITHUB_STATE, "utf8"), /^fxcache_toolkit<<(.+)\n.*\/fxcache\n\1\n$/);
});

test("main stops at the first failing step and fails with its status", () => {
  const box = sandbox();
  box.env.FAIL_AT_STEP_RC = "3";
  assert.equal(js.main(box.env, box.io), 3);
  assert.ok(box.stepEnv("setup"));
  assert.equal(box.stepEnv("restore"), null);
});

test("post runs only the toolkit main installed, never one a file names", () => {
  const box = sandbox();
  assert.equal(js.post(box.env, box.io), 0);
  assert.match(box.log.join(""), /did not install its toolkit; nothing to save/);
  assert.equal(box.stepEnv("post-save"), null);
  const other = sandbox();
  const settings = path.join(other.dir, "settings.json");
  fs.writeFileSync(settings, JSON.stringify({ fxcache: "/bin/false" }));
  other.env.FXCACHE_ACTION_SETTINGS = settings;
  other.env.STATE_fxcache_toolkit = other.fake;
  other.env.STATE_fxcache_settings = settings;
  other.env.STATE_fxcache_settings_sha256 = "ab".repeat(32);
  assert.equal(js.post(other.env, other.io), 0);
  const env = other.stepEnv("post-save");
  assert.ok(env, "post-save did not run with the kept toolkit");
  assert.equal(env.STATE_fxcache_settings, settings);
  assert.equal(env.ACTIONS_RUNTIME_TOKEN, "runtime-token");
  assert.equal(env.AWS_SECRET_ACCESS_KEY, "aws-secret-key");
  assert.equal(JSON.parse(env.FXCACHE_INPUTS)["github-token"], "");
  assert.equal(JSON.parse(env.FXCACHE_INPUTS)["signing-key"], "first line of the key\nsecond line of the key");
  assert.equal(env.STATE_fxcache_toolkit, undefined);
});

test("readFileCommand reads both forms, a later value wins", () => {
  const box = sandbox();
  const file = path.join(box.dir, "out");
  fs.writeFileSync(file, "a=1\n");
  js.appendFileCommand(file, "b", "two\nlines");
  js.appendFileCommand(file, "a", "3");
  assert.deepEqual(js.readFileCommand(file), { a: "3", b: "two\nlines" });
});

test("what a step exports through GITHUB_ENV reaches the later steps of the run", () => {
  const box = sandbox();
  fs.writeFileSync(box.env.GITHUB_ENV, "EARLIER=kept\n");
  // The stand-in's setup exports a variable, as the real one exports FXCACHE_ACTION_SETTINGS.
  fs.appendFileSync(box.fake, "");
  const real = fs.readFileSync(box.fake, "utf8");
  fs.writeFileSync(box.fake, real.replace("env -0 >",
    'if [ "$2" = setup ]; then printf "FROM_SETUP<<EOF\\nset up\\nEOF\\n" >>"$GITHUB_ENV"; fi\nenv -0 >'));
  assert.equal(js.main(box.env, box.io), 0);
  assert.equal(box.stepEnv("setup").FROM_SETUP, undefined);
  assert.equal(box.stepEnv("restore").FROM_SETUP, "set up");
  assert.equal(box.stepEnv("restore").EARLIER, undefined);
});
