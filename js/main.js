// The fxcache action's main step: install the toolkit, then setup, restore, verify, report,
// comment and fail-on, each `fxcache action <step>` in its own log group (js/fxcache.js).
"use strict";
process.exitCode = require("./fxcache.js").main();
