// Validates an AsyncAPI document as `asyncapi validate --fail-severity warn`
// does: the AsyncAPI parser with its default ruleset (the schema of the
// spec, resolved references, and the governance rules). Errors and
// warnings fail; information and hints are printed.
//
//   node scripts/asyncapi/validate.mjs docs/asyncapi.yaml
import { resolve } from "node:path";
import { DiagnosticSeverity, Parser, fromFile } from "@asyncapi/parser";

const file = resolve(process.argv[2] ?? "docs/asyncapi.yaml");
const { document, diagnostics } = await fromFile(new Parser(), file).parse();
const severity = ["error", "warning", "information", "hint"];
let failing = 0;
for (const d of diagnostics) {
  if (d.severity <= DiagnosticSeverity.Warning) failing++;
  const where = `${d.path.join(".") || "(document)"}, line ${d.range.start.line + 1}`;
  console.log(`${severity[d.severity]}: ${d.message} [${d.code}] at ${where}`);
}
if (!document || failing > 0) {
  console.error(`${file}: not valid (${failing} errors or warnings)`);
  process.exit(1);
}
console.log(`${file}: a valid AsyncAPI ${document.version()} document`);
