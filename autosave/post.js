// End-of-job save: `fxcache action post-save` (commits the scope unless the job already did,
// then uploads it for store github when the toolkit decided so).
"use strict";
const { runFxcache } = require("./toolkit.js");

process.exit(runFxcache("post-save"));
