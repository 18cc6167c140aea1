// The save sub-action: install the toolkit this action ships, then `fxcache action save`.
"use strict";
process.exitCode = require("../js/fxcache.js").subAction("save");
