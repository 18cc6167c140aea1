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
    INPUT_TOOLKIT: fake,
    ACTIONS_RUNTIME_TOKEN: "runtime-token",
    ACTIONS_RESULTS_URL: "http://results.invalid/",
    ACTIONS_ID_TOKEN_REQUEST_TOKEN: "oidc-token",
    AWS_SECRET_ACCESS_KEY: "aws-secret-key",
    AZURE_STORAGE_ACCOUNT_KEY: "azure-account-key",
    GOOGLE_SERVICE_ACCOUNT_KEY: "gcs-service-account-key",
    AZURE_STORAGE_ACCOUNT_NAME: "devstoreaccount1",  // a setting, not a secret
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
    "Install the fxcache toolkit", "Check what this run was given", "Check the inputs and decide trust",
    "Restore the cache", "Verify hot loads", "Report",
    "Comment on the pull request", "Fail on the verdicts (fail-on)",
  ]);
  for (const line of ["first line of the key", "second line of the key", "ghs_secret_token"]) {
    assert.ok(text.includes(`::add-mask::${line}\n`), line);
  }
  const secrets = ["ghs_secret_token", "line of the key", "hunter2", "runtime-token", "oidc-token",
                   "aws-secret-key", "azure-account-key", "gcs-service-account-key"];
  const seen = {};
  for (const step of ["admit", "setup", "restore", "verify", "report", "comment", "conclude"]) {
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
    admit: ["ghs_secret_token", "line of the key", "hunter2", "oidc-token", "aws-secret-key",
            "azure-account-key", "gcs-service-account-key"],
    setup: ["hunter2"],
    restore: ["line of the key", "hunter2", "runtime-token", "aws-secret-key",
              "azure-account-key", "gcs-service-account-key"],
    verify: ["hunter2"],
    report: [],
    comment: ["ghs_secret_token"],
    conclude: [],
  });
  // The post step gets the loader path main had (none here) in the runner-held state (the
  // real setup keeps the toolkit's path there too: test_action_steps.py).
  const state = js.readFileCommand(box.env.GITHUB_STATE);
  assert.deepEqual(state, { fxcache_kept_LD_LIBRARY_PATH: "" });
});

test("every step gets the object store's settings; only restore sees its credentials", () => {
  const box = sandbox();
  assert.equal(js.main(box.env, box.io), 0);
  for (const step of ["setup", "restore", "verify", "report"]) {
    assert.equal(box.stepEnv(step).AZURE_STORAGE_ACCOUNT_NAME, "devstoreaccount1", step);
  }
});

test("the invalidate sub-action's step gets the bucket's credentials, no other secret", () => {
  const box = sandbox();
  assert.equal(js.subAction("invalidate", box.env, box.io), 0);
  const env = box.stepEnv("invalidate");
  assert.ok(env, "invalidate did not run");
  assert.equal(env.AWS_SECRET_ACCESS_KEY, "aws-secret-key");
  assert.equal(env.AZURE_STORAGE_ACCOUNT_KEY, "azure-account-key");
  assert.equal(env.GOOGLE_SERVICE_ACCOUNT_KEY, "gcs-service-account-key");
  assert.equal(env.ACTIONS_RUNTIME_TOKEN, undefined);
  assert.equal(env.ACTIONS_ID_TOKEN_REQUEST_TOKEN, undefined);
});

test("main stops at the first failing step and fails with its status", () => {
  const box = sandbox();
  box.env.FAIL_AT_STEP_RC = "3";
  assert.equal(js.main(box.env, box.io), 3);
  assert.ok(box.stepEnv("admit"));
  assert.equal(box.stepEnv("setup"), null);
});

test("a toolkit named by the job's environment is never run: only the toolkit input", () => {
  const box = sandbox();
  delete box.env.INPUT_TOOLKIT;
  const planted = path.join(box.dir, "planted-fxcache");
  fs.writeFileSync(planted, `#!/bin/sh\ntouch ${box.dir}/planted-ran\necho "fxcache 0.1.0"\n`,
                   { mode: 0o755 });
  box.env.FXCACHE_TOOLKIT = planted;
  // A PATH with bash but no python3: the install stops at once, having run nothing.
  const bin = path.join(box.dir, "bin");
  fs.mkdirSync(bin);
  fs.symlinkSync("/bin/bash", path.join(bin, "bash"));
  box.env.PATH = bin;
  assert.equal(js.main(box.env, box.io), 2);
  assert.equal(fs.existsSync(path.join(box.dir, "planted-ran")), false);
  assert.match(box.log.join(""), /Install the fxcache toolkit/);
});

test("a fake bash first on PATH never runs the install", () => {
  const box = sandbox();
  const bin = path.join(box.dir, "bin");
  fs.mkdirSync(bin);
  fs.writeFileSync(path.join(bin, "bash"), `#!/bin/sh\ntouch ${box.dir}/fake-bash-ran\nexit 1\n`,
                   { mode: 0o755 });
  box.env.PATH = `${bin}:${box.env.PATH}`;
  assert.equal(js.main(box.env, box.io), 0);
  assert.equal(fs.existsSync(path.join(box.dir, "fake-bash-ran")), false);
  assert.ok(box.stepEnv("conclude"), "the steps ran with the real toolkit");
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

test("post gets no loader variable of the job, only the library path main had", () => {
  const box = sandbox();
  box.env.LD_LIBRARY_PATH = "/main/lib";
  assert.equal(js.main(box.env, box.io), 0);
  const state = js.readFileCommand(box.env.GITHUB_STATE);
  const post = sandbox();
  for (const [k, v] of Object.entries(state)) post.env[`STATE_${k}`] = v;
  post.env.STATE_fxcache_toolkit = post.fake;
  post.env.STATE_fxcache_settings = "/x/settings.json";
  post.env.LD_PRELOAD = "/tmp/evil.so";  // appended to $GITHUB_ENV by a later step
  post.env.LD_AUDIT = "/tmp/evil-audit.so";
  post.env.LD_LIBRARY_PATH = "/tmp/evil-libs";
  assert.equal(js.post(post.env, post.io), 0);
  const env = post.stepEnv("post-save");
  assert.ok(env, "post-save did not run");
  assert.equal(env.LD_PRELOAD, undefined);
  assert.equal(env.LD_AUDIT, undefined);
  assert.equal(env.LD_LIBRARY_PATH, "/main/lib");
});

test("the save sub-action gets no preloaded library of the job", () => {
  const box = sandbox();
  box.env.LD_PRELOAD = "/tmp/evil.so";
  box.env.LD_AUDIT = "/tmp/evil-audit.so";
  box.env.LD_LIBRARY_PATH = "/opt/python/lib";  // its interpreter may need it to start
  assert.equal(js.subAction("save", box.env, box.io), 0);
  const env = box.stepEnv("save");
  assert.ok(env, "save did not run");
  assert.equal(env.LD_PRELOAD, undefined);
  assert.equal(env.LD_AUDIT, undefined);
  assert.equal(env.LD_LIBRARY_PATH, "/opt/python/lib");
  assert.equal(env.ACTIONS_RUNTIME_TOKEN, "runtime-token");
});

test("masks are escaped as the runner reads them back", () => {
  const out = [];
  js.maskLines("100%25 key\rwith a CR", (s) => out.push(s));
  assert.deepEqual(out, ["::add-mask::100%2525 key%0Dwith a CR\n"]);
});

test("readFileCommand reads both forms, a later value wins", () => {
  const box = sandbox();
  const file = path.join(box.dir, "out");
  fs.writeFileSync(file, "a=1\n");
  js.appendFileCommand(file, "b", "two\nlines");
  js.appendFileCommand(file, "a", "3");
  assert.deepEqual(js.readFileCommand(file), { a: "3", b: "two\nlines" });
});

test("only the names a step declares reach the later steps: never GITHUB_*, LD_*, PATH", () => {
  const box = sandbox();
  fs.writeFileSync(box.env.GITHUB_ENV, "EARLIER=kept\n");
  // The stand-in's setup exports the settings (declared) and something else (not declared);
  // its verify, as a workload would, appends the runner's own names.
  const real = fs.readFileSync(box.fake, "utf8");
  fs.writeFileSync(box.fake, real.replace("env -0 >", [
    'if [ "$2" = setup ]; then printf "FXCACHE_ACTION_SETTINGS<<EOF\\n/s.json\\nEOF\\nFROM_SETUP=x\\n" >>"$GITHUB_ENV"; fi',
    'if [ "$2" = verify ]; then printf "GITHUB_API_URL=http://attacker\\nLD_PRELOAD=/e.so\\nPATH=/evil\\nFXCACHE_ACTION_SETTINGS=/evil.json\\n" >>"$GITHUB_ENV"; fi',
    "env -0 >"].join("\n")));
  assert.equal(js.main(box.env, box.io), 0);
  assert.equal(box.stepEnv("setup").FXCACHE_ACTION_SETTINGS, undefined);
  const restore = box.stepEnv("restore");
  assert.equal(restore.FXCACHE_ACTION_SETTINGS, "/s.json");
  assert.equal(restore.FROM_SETUP, undefined);
  assert.equal(restore.EARLIER, undefined);
  const comment = box.stepEnv("comment");
  assert.equal(comment.FXCACHE_ACTION_SETTINGS, "/s.json");
  assert.equal(comment.GITHUB_API_URL, undefined);
  assert.equal(comment.LD_PRELOAD, undefined);
  assert.equal(comment.PATH, box.env.PATH);
});
