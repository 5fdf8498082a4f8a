// Validates a speedscope file against the JSON schema shipped in speedscope's npm package
// (ajv, from the same cache). Usage: node validate_speedscope.js TOOLS_DIR FILE
// Prints "valid PROFILES FRAMES" or the schema's errors (exit 1).
"use strict";
const path = require("path");
const fs = require("fs");
const tools = process.argv[2];
const file = process.argv[3];
const Ajv = require(path.join(tools, "node_modules", "ajv"));
const schema = JSON.parse(
  fs.readFileSync(path.join(tools, "node_modules", "speedscope", "dist", "release", "file-format-schema.json"), "utf8")
);
const ajv = new Ajv({ strict: false, allErrors: true });
const validate = ajv.compile(schema);
const data = JSON.parse(fs.readFileSync(file, "utf8"));
if (!validate(data)) {
  console.log(JSON.stringify(validate.errors, null, 1));
  process.exit(1);
}
console.log(`valid ${data.profiles.length} ${data.shared.frames.length}`);
