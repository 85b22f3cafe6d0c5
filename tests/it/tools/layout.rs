//! The layering `src/lib.rs` documents: each top-level module imports
//! only the modules its row names, so the import graph has no cycle and no
//! arrow pointing up. Read from the sources (comments and unit-test files
//! left out), so a new `use crate::…` that breaks it fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules it may import, read from the table in
/// `src/lib.rs`'s docs (`//! | [`module`] | what it is | may import |`);
/// rows whose last column is not a list of modules (the edges: "all of the
/// above") are not checked.
fn allowed(lib: &str) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for line in lib.lines() {
        let Some(row) = line.strip_prefix("//! | [`") else {
            continue;
        };
        let Some((module, rest)) = row.split_once("`]") else {
            continue;
        };
        let may = rest
            .trim_end_matches('|')
            .rsplit('|')
            .next()
            .unwrap_or("")
            .trim();
        if may.starts_with("all of") {
            continue;
        }
        let may = match may {
            "nothing" => Vec::new(),
            list => list.split(", ").map(str::to_owned).collect(),
        };
        out.insert(module.to_owned(), may);
    }
    out
}

/// Every `crate::<module>` a file's code (not its comments) names.
fn imports(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (at, _) in line.match_indices("crate::") {
            let name: String = line[at + 7..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            files.push(path);
        }
    }
}

#[test]
fn each_module_imports_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let allowed = allowed(&lib);
    assert!(
        allowed.len() > 10,
        "the layout table in src/lib.rs: {allowed:?}"
    );
    let mut broken = Vec::new();
    for (module, may) in &allowed {
        let (dir, file) = (src.join(module), src.join(format!("{module}.rs")));
        assert!(
            dir.is_dir() || file.is_file(),
            "{module} is in the layout but not in src/"
        );
        let mut files = Vec::new();
        if dir.is_dir() {
            walk(&dir, &mut files);
        } else {
            files.push(file);
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for import in imports(&text) {
                if import != *module && !may.contains(&import) {
                    broken.push(format!("{} imports crate::{import}", f.display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "imports that src/lib.rs's layout does not allow:\n{}",
        broken.join("\n")
    );
    // Every module of the crate but the edges (worker, cli) has a row.
    for line in lib.lines() {
        if let Some(m) = line
            .strip_prefix("pub mod ")
            .and_then(|m| m.strip_suffix(';'))
            && !matches!(m, "worker" | "cli")
        {
            assert!(
                allowed.contains_key(m),
                "{m} has no row in src/lib.rs's layout"
            );
        }
    }
}
