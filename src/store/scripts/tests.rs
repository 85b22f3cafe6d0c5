//! The registry's scripts in a real Redis, and against the Rust that
//! calls them.

use std::collections::BTreeSet;

use super::*;

/// The Redis the tests use (as the integration tests' `redis_url`).
fn redis_url() -> String {
    std::env::var("MAILGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// Lua source with its comments and string literals blanked out (each
/// string as `''`): what is left is code.
fn code_of(lua: &str) -> String {
    let mut out = String::with_capacity(lua.len());
    let mut rest = lua;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("--[[") {
            rest = after.split_once("]]").map_or("", |(_, r)| r);
        } else if rest.starts_with("--") {
            rest = rest.find('\n').map_or("", |i| &rest[i..]);
        } else if c == '\'' || c == '"' {
            let mut chars = rest.char_indices().skip(1);
            let mut end = rest.len();
            while let Some((i, d)) = chars.next() {
                if d == '\\' {
                    chars.next();
                } else if d == c {
                    end = i + 1;
                    break;
                }
            }
            out.push_str("''");
            rest = &rest[end..];
        } else {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// Each identifier of `code` (as [`code_of`] leaves it), with whether a
/// `.` comes right before it (a field) and a `(` right after it (a call).
fn identifiers(code: &str) -> Vec<(String, bool, bool)> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut start = None;
    for (i, c) in code.char_indices().chain([(code.len(), ' ')]) {
        match (start, word(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                let name = &code[s..i];
                if !name.starts_with(|c: char| c.is_ascii_digit()) {
                    let field = code[..s].ends_with('.');
                    let call = code[i..].trim_start().starts_with('(');
                    found.push((name.to_owned(), field, call));
                }
                start = None;
            }
            _ => {}
        }
    }
    found
}

/// The names a script uses of the library bound to `library`
/// (`decide.judge` → `judge`).
fn uses_of(script: &str, library: &str) -> BTreeSet<String> {
    let code = code_of(script);
    let prefix = format!("{library}.");
    let mut used = BTreeSet::new();
    for (i, _) in code.match_indices(&prefix) {
        let before = code[..i].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            continue;
        }
        let name: String = code[i + prefix.len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        used.insert(name);
    }
    used
}

/// The scripts that use `decide.lua`, by their own source (not composed).
const DECIDERS: [(&str, &str); 3] = [
    ("ledger.lua", include_str!("ledger.lua")),
    ("commit.lua", include_str!("commit.lua")),
    ("scope.lua", include_str!("scope.lua")),
];

/// Every script compiles in Redis and loads under the hash it is called
/// by; `decide.lua`, run there, exports exactly what the scripts composed
/// with it use; and every constant a script shares with the Rust that
/// calls it has the same value on both sides.
#[tokio::test]
async fn every_script_loads_and_agrees_with_the_rust() {
    let client = redis::Client::open(redis_url()).expect("a Redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("Redis answers at MAILGATE_TEST_REDIS_URL or 127.0.0.1:6379");
    assert_eq!(
        preload(&mut conn).await.expect("every script loads"),
        Calls::Functions,
        "a Redis 7 takes the ledger's function library"
    );
    // Loaded again (another worker of the same version, or a node that
    // lost it): the same code, replaced by itself.
    LEDGER_LIBRARY.load(&mut conn).await.expect("loads again");
    let probed: i64 = redis::cmd("FCALL")
        .arg(LEDGER_LIBRARY.function())
        .arg(1)
        .arg("scripts-test:probe")
        .arg("probe")
        .query_async(&mut conn)
        .await
        .expect("the library's function runs the ledger's operations");
    assert_eq!(probed, 1);
    for script in all() {
        let exists: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(script.get_hash())
            .query_async(&mut conn)
            .await
            .expect("SCRIPT EXISTS");
        assert_eq!(exists, [true], "{} is loaded", script.name());
    }
    let probe = Script::compose(
        "probe",
        &[DECIDE],
        "local names = {}\n\
         for name in pairs(decide) do names[#names + 1] = name end\n\
         return {decide.MAX_PERIOD_MS, decide.MAX_KEEP_MS, names}",
    );
    let (max_period, max_keep, names): (u64, u64, Vec<String>) = probe
        .prepare_invoke()
        .invoke_async(&mut conn)
        .await
        .expect("decide.lua runs");
    let max_period_ms = u64::try_from(crate::settings::MAX_PERIOD.as_millis()).expect("ms");
    assert_eq!(max_period, max_period_ms, "decide.MAX_PERIOD_MS");
    assert_eq!(
        max_keep,
        max_period_ms + crate::limiter::CLOCK_SLACK_MS,
        "decide.MAX_KEEP_MS: the longest period and the clock slack"
    );
    let exported: BTreeSet<String> = names.into_iter().collect();
    let used: BTreeSet<String> = (DECIDERS.iter())
        .flat_map(|(_, source)| uses_of(source, DECIDE.name))
        .collect();
    assert_eq!(exported, used, "decide.lua exports exactly what is used");
    records_export_what_is_used(&mut conn).await;
    ledger_codes_and_width_agree();
    let version = format!("'{}'", crate::store::overrides::VERSION);
    let prune = include_str!("prune.lua");
    assert_eq!(
        prune.matches("'~").count(),
        prune.matches(version.as_str()).count(),
        "prune.lua names the version field as the store does"
    );
    assert!(prune.contains(&version));
}

/// `records.lua`, run in Redis, exports exactly what the scripts
/// composed after it use.
async fn records_export_what_is_used(conn: &mut redis::aio::MultiplexedConnection) {
    let probe = Script::compose(
        "probe",
        &[RECORDS],
        "local names = {}\n\
         for name in pairs(records) do names[#names + 1] = name end\n\
         return names",
    );
    let names: Vec<String> = probe
        .prepare_invoke()
        .invoke_async(conn)
        .await
        .expect("records.lua runs");
    let exported: BTreeSet<String> = names.into_iter().collect();
    let mut used = uses_of(include_str!("ledger.lua"), RECORDS.name);
    used.extend(uses_of(include_str!("commit.lua"), RECORDS.name));
    assert_eq!(
        exported, used,
        "records.lua exports exactly what ledger.lua and commit.lua use"
    );
}

/// A script composed with `decide.lua` calls none of its names bare (it
/// would be a global, nil in Redis): only as `decide.<name>`.
#[test]
fn the_deciders_use_decide_only_through_its_table() {
    let exported: BTreeSet<String> = (DECIDERS.iter())
        .flat_map(|(_, source)| uses_of(source, DECIDE.name))
        .collect();
    for (file, source) in DECIDERS {
        let code = code_of(source);
        for (name, field, call) in identifiers(&code) {
            let constant = name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
            assert!(
                field || !exported.contains(&name) || !(call || constant),
                "{file} uses {name} bare, not as decide.{name}"
            );
        }
    }
}

/// `ledger.lua`'s result codes and reply width are the ledger's.
fn ledger_codes_and_width_agree() {
    use crate::ledger::redis::reply::{CODES, REPLY_WIDTH};
    let lua = include_str!("ledger.lua");
    let table = lua
        .split_once("local CODE = {")
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(t, _)| t)
        .expect("ledger.lua has a CODE table");
    let mut in_lua: Vec<(String, i64)> = table
        .lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once('=')?;
            let n = rest.trim().split(',').next()?.trim().parse().ok()?;
            Some((name.trim().to_owned(), n))
        })
        .collect();
    in_lua.sort_by_key(|(_, n)| *n);
    let mut in_rust: Vec<(String, i64)> = CODES
        .iter()
        .map(|(c, name)| ((*name).to_owned(), *c as i64))
        .collect();
    in_rust.sort_by_key(|(_, n)| *n);
    assert_eq!(in_lua, in_rust);
    // The main loop takes each item's code and values into as many names.
    let names = lua
        .split_once("= item.run(")
        .and_then(|(head, _)| head.rsplit_once("local "))
        .map(|(_, names)| names.split(',').count())
        .expect("ledger.lua's main loop runs each item");
    assert_eq!(
        names, REPLY_WIDTH,
        "ledger.lua's reply width is REPLY_WIDTH"
    );
}
