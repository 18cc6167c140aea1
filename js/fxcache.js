// The one JavaScript module of the fxcache actions (node's own modules only). It holds no
// decision: it installs the toolkit with scripts/install-toolkit.sh, asks the toolkit which
// steps to run (`fxcache action describe <run>`: each step's log group title, the secret
// inputs it may see, the private variables it gets, the job variables it never gets and the
// names it hands on to the later steps), and runs each step as its own process with exactly
// that environment. Inputs reach the toolkit as one JSON object (FXCACHE_INPUTS); every
// secret input is masked line by line first. Programs it starts are named by absolute path.
"use strict";
const crypto = require("crypto");
const fs = require("fs");
const os = require("os");
const path = require("path");
const { spawnSync } = require("child_process");

const ACTION_ROOT = path.resolve(__dirname, "..");
const TOOLKIT_STATE = "fxcache_toolkit";  // written by setup (settings.TOOLKIT_STATE)
// The job's value of a variable when main started, for the post step (runner-held state).
const KEPT_STATE = "fxcache_kept_";
// Never looked up on PATH: a program planted first on it must not run the install.
const BASH = "/bin/bash";

// The runner's INPUT_<NAME> variable of an input (actions/toolkit's getInput rule).
function inputVariable(name) {
  return `INPUT_${name.replace(/ /g, "_").toUpperCase()}`;
}

function input(env, name) {
  return (env[inputVariable(name)] || "").trim();
}

// Append NAME<<DELIMITER blocks to an Actions file command ($GITHUB_STATE, ...).
function appendFileCommand(file, name, value) {
  if (!file) return false;
  const delimiter = `fxcache_${crypto.randomBytes(16).toString("hex")}`;
  fs.appendFileSync(file, `${name}<<${delimiter}\n${value}\n${delimiter}\n`);
  return true;
}

// Values of NAME<<DELIMITER and NAME=VALUE lines of an Actions file command.
function readFileCommand(file) {
  return parseFileCommand(fs.existsSync(file) ? fs.readFileSync(file, "utf8") : "");
}

function parseFileCommand(text) {
  const values = {};
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const heredoc = /^([^=<]+)<<(.+)$/.exec(lines[i]);
    if (heredoc) {
      const end = lines.indexOf(heredoc[2], i + 1);
      if (end < 0) break;
      values[heredoc[1]] = lines.slice(i + 1, end).join("\n");
      i = end;
    } else if (lines[i].includes("=")) {
      const at = lines[i].indexOf("=");
      values[lines[i].slice(0, at)] = lines[i].slice(at + 1);
    }
  }
  return values;
}

// A workflow command's data as the runner reads it back ('%', CR and LF escaped).
function escapeData(text) {
  return text.replace(/%/g, "%25").replace(/\r/g, "%0D").replace(/\n/g, "%0A");
}

// ::add-mask:: for every non-empty line of a secret (one command per line: a line break in
// the value would end the command and print the rest in clear), escaped as the runner
// expects, so that it masks the line exactly (a '%25' in a key stays '%25').
function maskLines(value, write) {
  for (const line of String(value).split(/\r?\n/)) {
    if (line.trim()) write(`::add-mask::${escapeData(line)}\n`);
  }
}

// The environment of a step: the job's, without any INPUT_* / STATE_* variable, any name the
// toolkit lists as private or any variable it withholds from this run, plus the variables
// the toolkit lists for that step.
function childEnv(env, plan, step, extra) {
  const out = {};
  const hidden = new Set(plan.private_env);
  const withheld = plan.withheld_prefixes || [];
  for (const [k, v] of Object.entries(env)) {
    if (k.startsWith("INPUT_") || k.startsWith("STATE_") || hidden.has(k)) continue;
    if (withheld.some((prefix) => k.startsWith(prefix))) continue;
    out[k] = v;
  }
  for (const k of step.env) if (k in env) out[k] = env[k];
  for (const k of plan.from_main || []) {
    const kept = env[`STATE_${KEPT_STATE}${k}`];
    if (kept) out[k] = kept;
  }
  return Object.assign(out, extra || {});
}

// The inputs a step sees, as the JSON object FXCACHE_INPUTS: secrets it does not need blank.
function stepInputs(env, describe, step) {
  const secrets = new Set(describe.secret_inputs);
  const allowed = new Set(step.secrets);
  const values = {};
  for (const name of describe.inputs) {
    values[name] = secrets.has(name) && !allowed.has(name) ? "" : input(env, name);
  }
  return JSON.stringify(values);
}

function run(command, args, env, io) {
  if (!path.isAbsolute(command)) {
    io.write(`::error::fxcache: not running ${command}: only programs named by absolute path\n`);
    return 1;
  }
  const result = spawnSync(command, args, { stdio: ["ignore", "inherit", "inherit"], env });
  if (result.error) {
    io.write(`::error::fxcache: could not run ${command}: ${result.error.message}\n`);
    return 1;
  }
  return result.status === null ? 1 : result.status;
}

// The environment of the install and of `describe`, which run before the toolkit can say
// what a step may see: no input, no state, no runner token, store credential or file
// command of any kind, and no toolkit but the one the action's own input names.
function bareEnv(env, extra) {
  const out = {};
  for (const [k, v] of Object.entries(env)) {
    if (/^(INPUT_|STATE_|ACTIONS_|AWS_)/.test(k)) continue;
    if (["GITHUB_STATE", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY",
         "FXCACHE_TOOLKIT"].includes(k)) continue;
    out[k] = v;
  }
  return Object.assign(out, extra || {});
}

// scripts/install-toolkit.sh; the path of the installed fxcache, or null.
function installToolkit(env, io, store) {
  const scratch = fs.mkdtempSync(path.join(env.RUNNER_TEMP || os.tmpdir(), "fxcache-install-"));
  const output = path.join(scratch, "output");
  fs.writeFileSync(output, "");
  const childenv = bareEnv(env, {
    FXCACHE_ACTION_ROOT: ACTION_ROOT,
    FXCACHE_BASE_PYTHON: input(env, "python"),
    FXCACHE_STORE: store,
    FXCACHE_TOOLKIT: input(env, "toolkit"),
    FXCACHE_RUN_EVENT: input(env, "run-event"),
    GITHUB_OUTPUT: output,
  });
  io.write("::group::Install the fxcache toolkit\n");
  const rc = run(BASH, [path.join(ACTION_ROOT, "scripts", "install-toolkit.sh")], childenv, io);
  io.write("::endgroup::\n");
  const fxcache = readFileCommand(output).fxcache;
  fs.rmSync(scratch, { recursive: true, force: true });
  return rc === 0 && fxcache && path.isAbsolute(fxcache) ? fxcache : null;
}

// `fxcache action describe <run>`: the steps to run and what each may see.
function describe(fxcache, runName, env, io) {
  const result = spawnSync(fxcache, ["action", "describe", runName], {
    env: bareEnv(env),
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  if (result.error || result.status !== 0) {
    io.write(`::error::fxcache: ${fxcache} action describe ${runName} failed\n`);
    return null;
  }
  return JSON.parse(result.stdout);
}

// The bytes of `file` from `offset` on (what a step appended to a file command).
function appended(file, offset) {
  if (!file || !fs.existsSync(file)) return "";
  return fs.readFileSync(file).subarray(offset).toString("utf8");
}

function size(file) {
  return file && fs.existsSync(file) ? fs.statSync(file).size : 0;
}

// Run the steps of `runName` in order, each in its own log group; stop at the first that
// fails and return its exit status. Of what a step (or any process it started) appends to
// $GITHUB_ENV, only the names the toolkit lists for that step (`passes`) reach the later
// steps of the same run; the runner applies the file to the job's later steps by its own
// rules after this whole step.
function runSteps(fxcache, runName, env, io) {
  const plan = describe(fxcache, runName, env, io);
  if (plan === null) return 1;
  for (const name of plan.secret_inputs) maskLines(input(env, name), (s) => io.write(s));
  for (const name of plan.keep_for_post || []) {
    appendFileCommand(env.GITHUB_STATE, `${KEPT_STATE}${name}`, env[name] || "");
  }
  const current = Object.assign({}, env);
  for (const step of plan.steps) {
    const childenv = childEnv(current, plan, step, {
      FXCACHE_INPUTS: stepInputs(env, plan, step),
    });
    const before = size(env.GITHUB_ENV);
    io.write(`::group::${step.title}\n`);
    const rc = run(fxcache, ["action", step.step], childenv, io);
    io.write("::endgroup::\n");
    if (rc !== 0) return rc;
    const exported = parseFileCommand(appended(env.GITHUB_ENV, before));
    for (const name of step.passes) if (name in exported) current[name] = exported[name];
  }
  return 0;
}

const stdout = { write: (s) => process.stdout.write(s) };

// The root action's main: install, then the main steps. Setup keeps the toolkit's path for
// the post step (runner-held state), which runs that toolkit and no other; a run refused
// before setup leaves the post step nothing to do.
function main(env = process.env, io = stdout) {
  const fxcache = installToolkit(env, io, input(env, "store"));
  if (fxcache === null) return 2;
  return runSteps(fxcache, "main", env, io);
}

// The root action's post step (post-if: always()): the end-of-job save.
function post(env = process.env, io = stdout) {
  const fxcache = env[`STATE_${TOOLKIT_STATE}`];
  if (!fxcache) {
    io.write("fxcache: end-of-job save: the fxcache action did not install its toolkit; nothing to save\n");
    return 0;
  }
  return runSteps(fxcache, "post", env, io);
}

// Which extra the toolkit needs (redis, s3): the invalidate sub-action's target, else the
// store the fxcache action's setup wrote into its settings. It picks what to install, nothing
// more: every decision stays the toolkit's.
function extraStore(env) {
  const target = input(env, "target");
  if (target) return target;
  try {
    return String(JSON.parse(fs.readFileSync(env.FXCACHE_ACTION_SETTINGS, "utf8")).store || "");
  } catch (err) {
    return "";
  }
}

// A sub-action (save, invalidate): install the toolkit it ships, then its steps.
function subAction(runName, env = process.env, io = stdout) {
  const fxcache = installToolkit(env, io, extraStore(env));
  if (fxcache === null) return 2;
  return runSteps(fxcache, runName, env, io);
}

module.exports = {
  ACTION_ROOT, appendFileCommand, bareEnv, childEnv, escapeData, extraStore, inputVariable, main,
  maskLines, post, readFileCommand, runSteps, stepInputs, subAction,
};
