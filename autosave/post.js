// End-of-job save: runs `fxcache action post-save` with the toolkit that the fxcache action
// installed (its path is in the settings file). Every decision is the toolkit's; no
// dependencies, so that the runner runs it as it is.
"use strict";
const fs = require("fs");
const { spawnSync } = require("child_process");

const settings = process.env.INPUT_SETTINGS || "";
let fxcache = "";
try {
  fxcache = JSON.parse(fs.readFileSync(settings, "utf8")).fxcache || "";
} catch (err) {
  console.log(`fxcache: end-of-job save: no settings (${err.message}); nothing to save`);
  process.exit(0);
}
const env = Object.assign({}, process.env, {
  FXCACHE_ACTION_SETTINGS: settings,
  FXCACHE_SIGNING_KEY: process.env["INPUT_SIGNING-KEY"] || "",
});
const result = spawnSync(fxcache, ["action", "post-save"], { stdio: "inherit", env });
if (result.error) {
  console.log(`::warning::fxcache: end-of-job save could not run ${fxcache}: ${result.error.message}`);
  process.exit(0);
}
process.exit(result.status === null ? 1 : result.status);
