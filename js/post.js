// The fxcache action's post step (post-if: always()): the end-of-job save and the job's cache
// stats, run by the toolkit the main step installed (js/fxcache.js).
"use strict";
process.exitCode = require("./fxcache.js").post();
