// The invalidate sub-action: install the toolkit this action ships, then
// `fxcache action invalidate`.
"use strict";
process.exitCode = require("../js/fxcache.js").subAction("invalidate");
