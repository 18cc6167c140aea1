// The step itself: `fxcache action <step>` (gha-restore for the fxcache action, gha-upload for
// the save sub-action); the end-of-job save follows in post.js.
"use strict";
const { runFxcache } = require("./toolkit.js");

process.exit(runFxcache(process.env.INPUT_STEP || "gha-restore"));
