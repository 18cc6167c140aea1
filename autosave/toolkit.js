// Runs `fxcache action <step>` with the toolkit the fxcache action installed (its path is in
// the settings file). A JavaScript action's environment holds the Actions cache service's
// variables (ACTIONS_RESULTS_URL, ACTIONS_RUNTIME_TOKEN), which `run:` steps do not get; they
// pass through to the toolkit as they are. Every decision is the toolkit's.
"use strict";
const fs = require("fs");
const { spawnSync } = require("child_process");

function runFxcache(step) {
  const settings = process.env.INPUT_SETTINGS || process.env.FXCACHE_ACTION_SETTINGS || "";
  let fxcache = "";
  try {
    fxcache = JSON.parse(fs.readFileSync(settings, "utf8")).fxcache || "";
  } catch (err) {
    console.log(`fxcache: ${step}: no settings (${err.message}); nothing to do`);
    return 0;
  }
  const env = Object.assign({}, process.env, {
    FXCACHE_ACTION_SETTINGS: settings,
    FXCACHE_SIGNING_KEY: process.env["INPUT_SIGNING-KEY"] || "",
  });
  const result = spawnSync(fxcache, ["action", step], { stdio: "inherit", env });
  if (result.error) {
    console.log(`::warning::fxcache: ${step} could not run ${fxcache}: ${result.error.message}`);
    return 0;
  }
  return result.status === null ? 1 : result.status;
}

module.exports = { runFxcache };
