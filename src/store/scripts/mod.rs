//! Every Lua script mailgate runs in Redis, in one registry: each is
//! composed from its parts
//! once, on first use, and [`preload`] loads them all on a connection, so
//! that a server that cannot run them shows at start-up.
//!
//! | Script | Runs | Parts |
//! |---|---|---|
//! | [`LEDGER`] | every ledger write: admissions, send marks, settles; the readiness probe; the clock watch | `decide.lua`, `ledger.lua` |
//! | [`SCOPE`] | one scope's log, with keys spread over a cluster's shards | `decide.lua`, `scope.lua` |
//! | [`TOOLS`] | `mailgate limits show` and `reset`: one scope key's log | `tools.lua` |
//! | [`PRUNE`] | `mailgate overrides`: drops expired overrides | `prune.lua` |
//!
//! Each file's header documents its KEYS, ARGV and reply.

use std::sync::LazyLock;

use redis::RedisResult;
use redis::aio::ConnectionLike;

/// Lua that scripts share, as a Lua module: a chunk that ends by returning
/// a table, its API. A script composed with it runs the chunk as a
/// function and binds the table to a local of the library's name; the
/// chunk's own locals stay private to it, so the script can use nothing
/// but what the table exports (a unit test checks the names).
#[derive(Debug, Clone, Copy)]
struct Library {
    /// The local that holds its table in the scripts that use it.
    name: &'static str,
    /// Its source, ending with `return { ... }`.
    source: &'static str,
}

/// The limiter's decision (`decide.lua`): rule sets, shapes, judging and
/// recording an admission. Shared by the ledger's script and the scope
/// script, so the limiter's semantics live in Redis once.
const DECIDE: Library = Library {
    name: "decide",
    source: include_str!("decide.lua"),
};

/// One script of the registry: its name, the source sent to Redis, and the
/// `redis::Script` that runs it (by `EVALSHA`, loading it again on
/// `NOSCRIPT`). Used as that `redis::Script` (it dereferences to it).
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    source: String,
    script: redis::Script,
}

impl Script {
    /// The script `body` after the `libraries` it uses, each bound to its
    /// name: `local decide = (function() <decide.lua> end)()`.
    fn compose(name: &'static str, libraries: &[Library], body: &str) -> Self {
        let mut source = String::new();
        for library in libraries {
            source.push_str("local ");
            source.push_str(library.name);
            source.push_str(" = (function()\n");
            source.push_str(library.source);
            source.push_str("\nend)()\n");
        }
        source.push_str(body);
        let script = redis::Script::new(&source);
        Self {
            name,
            source,
            script,
        }
    }

    /// Its name in the registry (the table in the module docs).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The whole source sent to Redis, its libraries included.
    pub fn source(&self) -> &str {
        &self.source
    }
}

impl std::ops::Deref for Script {
    type Target = redis::Script;

    fn deref(&self) -> &redis::Script {
        &self.script
    }
}

/// The ledger's script: the limiter's decision, then `ledger.lua`.
pub static LEDGER: LazyLock<Script> =
    LazyLock::new(|| Script::compose("ledger", &[DECIDE], include_str!("ledger.lua")));

/// The scope script: the limiter's decision, then `scope.lua`.
pub static SCOPE: LazyLock<Script> =
    LazyLock::new(|| Script::compose("scope", &[DECIDE], include_str!("scope.lua")));

/// The support tools' script, `tools.lua`.
pub static TOOLS: LazyLock<Script> =
    LazyLock::new(|| Script::compose("tools", &[], include_str!("tools.lua")));

/// The overrides' pruning script, `prune.lua`.
pub static PRUNE: LazyLock<Script> =
    LazyLock::new(|| Script::compose("prune", &[], include_str!("prune.lua")));

/// Every script mailgate runs.
pub fn all() -> [&'static Script; 4] {
    [&LEDGER, &SCOPE, &TOOLS, &PRUNE]
}

/// Loads every script (`SCRIPT LOAD`; on a cluster, on every primary), so
/// a server that refuses them (an ACL, a read-only replica) fails now
/// rather than on the first call.
pub async fn preload(conn: &mut impl ConnectionLike) -> RedisResult<()> {
    for script in all() {
        script.load_async(conn).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
