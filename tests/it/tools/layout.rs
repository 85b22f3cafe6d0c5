//! The layering `src/lib.rs` documents: each top-level module imports
//! only the modules its row names, so the import graph has no cycle and no
//! arrow pointing up. Read from the sources (comments and unit-test files
//! left out), so a new `use crate::…` that breaks it fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module → the modules it may import (as `src/lib.rs` lists them).
const ALLOWED: &[(&str, &[&str])] = &[
    ("domain", &[]),
    ("redact", &[]),
    ("tls", &[]),
    ("wire", &["domain"]),
    ("settings", &["domain", "redact", "tls"]),
    ("telemetry", &["domain", "wire"]),
    ("limiter", &["domain", "settings"]),
    ("store", &["domain", "settings", "tls", "redact", "limiter"]),
    ("ledger", &["domain", "settings", "limiter", "store"]),
    ("templates", &["domain", "settings", "wire"]),
    (
        "mailer",
        &["domain", "settings", "tls", "redact", "telemetry"],
    ),
    ("broker", &["domain", "settings", "tls", "redact"]),
    (
        "pipeline",
        &[
            "domain",
            "settings",
            "wire",
            "telemetry",
            "limiter",
            "ledger",
            "templates",
            "mailer",
            "broker",
        ],
    ),
    ("traces", &["settings", "redact", "broker"]),
    ("http", &["telemetry"]),
];

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
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut broken = Vec::new();
    for (module, may) in &allowed {
        let (dir, file) = (src.join(module), src.join(format!("{module}.rs")));
        let mut files = Vec::new();
        if dir.is_dir() {
            walk(&dir, &mut files);
        } else {
            files.push(file);
        }
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            for import in imports(&text) {
                if import != *module && !may.contains(&import.as_str()) {
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
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    for line in lib.lines() {
        if let Some(m) = line
            .strip_prefix("pub mod ")
            .and_then(|m| m.strip_suffix(';'))
            && !matches!(m, "worker" | "cli")
        {
            assert!(allowed.contains_key(m), "{m} has no row in the layout");
        }
    }
}
