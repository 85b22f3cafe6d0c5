//! Every Lua script mailgate runs in Redis, in one registry: each is
//! composed from its parts
//! once, on first use, and [`preload`] loads them all on a connection, so
//! that a server that cannot run them shows at start-up.
//!
//! | Script | Runs | Parts |
//! |---|---|---|
//! | [`LEDGER`] | every ledger write: admissions, send marks, settles; the readiness probe | `decide.lua`, `records.lua`, `commit.lua`, `ledger.lua` |
//! | [`LEDGER_LIBRARY`] | the ledger's batches, as a Redis Function (Redis >= 7; [`Calls`]) | the same |
//! | [`SCOPE`] | one scope's log, with keys spread over a cluster's shards | `decide.lua`, `scope.lua` |
//! | [`CLOCK`] | the clock watch, once a second from each worker | `clock.lua` |
//! | [`TOOLS`] | `mailgate limits show` and `reset`: one scope key's log | `tools.lua` |
//! | [`PRUNE`] | `mailgate overrides`: drops expired overrides | `prune.lua` |
//! | [`SUPPRESS`] | a bounce's suppression, where it shortens none in force | `suppress.lua` |
//! | [`MIGRATE`] | `mailgate admin migrate`: an earlier build's scope log into this one's form | `migrate.lua` |
//!
//! Each file's header documents its KEYS, ARGV and reply.
//!
//! Every `EVALSHA` runs its whole script, definitions included, and
//! converts the rule sets it carries: the ledger's batches, the hot path,
//! are called as a Redis Function where the server allows it, whose
//! definitions run once per load and which keeps the rule sets it built
//! (a tenth to nearly half of Redis's work per job, the more the fewer
//! jobs a call carries: `BENCHMARKS.md`).

use std::sync::LazyLock;

use redis::RedisResult;
use redis::aio::ConnectionLike;

/// Lua that scripts share, as a Lua module: a chunk that ends by returning
/// a table, its API. A script composed with it runs the chunk as a
/// function and binds the table to a local of the module's name; the
/// chunk's own locals stay private to it, so the script can use nothing
/// but what the table exports (a unit test checks the names). Before it,
/// `KEEPS_STATE` says whether the module outlives a call (a function
/// library) or not (a script).
#[derive(Debug, Clone, Copy)]
struct Module {
    /// The local that holds its table in the scripts that use it.
    name: &'static str,
    /// Its source, ending with `return { ... }`.
    source: &'static str,
}

impl Module {
    /// `local <name> = (function() <source> end)()`, after `KEEPS_STATE`.
    fn bind(modules: &[Module], keeps_state: bool, source: &mut String) {
        if !modules.is_empty() {
            source.push_str(if keeps_state {
                "local KEEPS_STATE = true\n"
            } else {
                "local KEEPS_STATE = false\n"
            });
        }
        for module in modules {
            source.push_str("local ");
            source.push_str(module.name);
            source.push_str(" = (function()\n");
            source.push_str(module.source);
            source.push_str("\nend)()\n");
        }
    }
}

/// The limiter's decision (`decide.lua`): rule sets, shapes, judging and
/// recording an admission. Shared by the ledger's script and the scope
/// script, so the limiter's semantics live in Redis once.
const DECIDE: Module = Module {
    name: "decide",
    source: include_str!("decide.lua"),
};

/// How the ledger reads and writes a job's record (`records.lua`): one
/// string (a hash of an earlier build is read, and replaced).
const RECORDS: Module = Module {
    name: "records",
    source: include_str!("records.lua"),
};

/// The admissions the worker decided from a snapshot, written by
/// compare-and-set (`commit.lua`): the ledger's op "commit".
const COMMIT: Module = Module {
    name: "commit",
    source: include_str!("commit.lua"),
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
    /// The script `body` after the `modules` it uses, each bound to its
    /// name: `local decide = (function() <decide.lua> end)()`.
    fn compose(name: &'static str, modules: &[Module], body: &str) -> Self {
        let mut source = String::new();
        Module::bind(modules, false, &mut source);
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

/// `ledger.lua`: a chunk that defines the ledger's operations and returns
/// `main`, which runs the one ARGV[1] names.
const LEDGER_LUA: &str = include_str!("ledger.lua");

/// The ledger's script: the limiter's decision and the records' I/O, then
/// `ledger.lua`'s definitions, then its `main`.
pub static LEDGER: LazyLock<Script> = LazyLock::new(|| {
    let body = format!("return (function()\n{LEDGER_LUA}\nend)()()\n");
    Script::compose("ledger", &[DECIDE, RECORDS, COMMIT], &body)
});

/// A script as a Redis Function library (Redis >= 7): the same code, whose
/// definitions run once, at the first call after a load, and whose modules
/// keep what they built (`KEEPS_STATE`, see `decide.lua`). Its library and
/// function are named for a hash of its source, so workers of different
/// versions (a rolling deploy) each call their own.
#[derive(Debug)]
pub struct FunctionLibrary {
    function: String,
    source: String,
}

impl FunctionLibrary {
    /// `main` of a chunk that returns it (`ledger.lua`), after `modules`,
    /// registered as one function of (keys, args): KEYS and ARGV are the
    /// library's locals, set by each call, so the code reads them as a
    /// script does.
    fn compose(prefix: &str, modules: &[Module], chunk: &str) -> Self {
        let mut setup = String::new();
        Module::bind(modules, true, &mut setup);
        setup.push_str("return (function()\n");
        setup.push_str(chunk);
        setup.push_str("\nend)()\n");
        // Redis runs a library's top level with no globals but `redis`
        // (FUNCTION LOAD): `setup` runs at the first call instead.
        let library = |name: &str| {
            format!(
                "#!lua name={name}\n\
                 local KEYS, ARGV, main\n\
                 local function setup()\n{setup}end\n\
                 redis.register_function('{name}', function(keys, args)\n\
                 \x20 KEYS, ARGV = keys, args\n\
                 \x20 main = main or setup()\n\
                 \x20 return main()\n\
                 end)\n"
            )
        };
        // Named for a hash of all of it but its name.
        let hash = redis::Script::new(&library(prefix)).get_hash().to_owned();
        let function = format!("{prefix}_{}", &hash[..16]);
        let source = library(&function);
        Self { function, source }
    }

    /// The function's name (and the library's), for `FCALL`.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The library's source, for `FUNCTION LOAD`.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Loads the library (`FUNCTION LOAD REPLACE`; on a cluster, on every
    /// primary). A library under its name is the same code (the name is
    /// its hash), so replacing it changes nothing; and a primary that
    /// already has it does not fail the load for one that lacks it.
    pub async fn load(&self, conn: &mut impl ConnectionLike) -> RedisResult<()> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.source)
            .query_async::<redis::Value>(conn)
            .await
            .map(drop)
    }
}

/// The ledger's batches as a Redis Function: `ledger.lua` after the
/// limiter's decision and the records' I/O.
pub static LEDGER_LIBRARY: LazyLock<FunctionLibrary> = LazyLock::new(|| {
    FunctionLibrary::compose("mailgate_ledger", &[DECIDE, RECORDS, COMMIT], LEDGER_LUA)
});

/// How the ledger's batches reach Redis, found when the scripts are loaded
/// ([`preload`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calls {
    /// `FCALL` of [`LEDGER_LIBRARY`] (loaded again if the server lost it).
    Functions,
    /// `EVALSHA` of [`LEDGER`]: the server has no functions (Redis < 7), or
    /// the user may not load them (an ACL without `FUNCTION LOAD`).
    Scripts,
}

/// The scope script: the limiter's decision, then `scope.lua`.
pub static SCOPE: LazyLock<Script> =
    LazyLock::new(|| Script::compose("scope", &[DECIDE], include_str!("scope.lua")));

/// The clock watch's script, `clock.lua`: the canary and the mark of a
/// lost key. Apart from the ledger's, which every `EVALSHA` would run
/// whole, definitions included, once a second from every worker.
pub static CLOCK: LazyLock<Script> =
    LazyLock::new(|| Script::compose("clock", &[], include_str!("clock.lua")));

/// The support tools' script, `tools.lua`.
pub static TOOLS: LazyLock<Script> =
    LazyLock::new(|| Script::compose("tools", &[], include_str!("tools.lua")));

/// The overrides' pruning script, `prune.lua`.
pub static PRUNE: LazyLock<Script> =
    LazyLock::new(|| Script::compose("prune", &[], include_str!("prune.lua")));

/// The conversion of an earlier build's keys, `migrate.lua` (`mailgate
/// admin migrate`).
pub static MIGRATE: LazyLock<Script> =
    LazyLock::new(|| Script::compose("migrate", &[], include_str!("migrate.lua")));

/// The suppression list's script, `suppress.lua`.
pub static SUPPRESS: LazyLock<Script> =
    LazyLock::new(|| Script::compose("suppress", &[], include_str!("suppress.lua")));

/// Every script mailgate runs.
pub fn all() -> [&'static Script; 7] {
    [&LEDGER, &SCOPE, &CLOCK, &TOOLS, &PRUNE, &SUPPRESS, &MIGRATE]
}

/// Loads every script (`SCRIPT LOAD`; on a cluster, on every primary), so
/// a server that refuses them (an ACL, a read-only replica) fails now
/// rather than on the first call; then the ledger's function library, if
/// the server has functions and lets this user load them.
pub async fn preload(conn: &mut impl ConnectionLike) -> RedisResult<Calls> {
    for script in all() {
        script.load_async(conn).await?;
    }
    match LEDGER_LIBRARY.load(conn).await {
        Ok(()) => Ok(Calls::Functions),
        Err(e) if without_functions(&e) => {
            tracing::info!(
                error = %crate::report::one_line(&e),
                "Redis functions unavailable; the ledger calls its script (EVALSHA) instead"
            );
            Ok(Calls::Scripts)
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` says functions are not to be had here, whatever happens
/// next: no such command (Redis < 7, or a proxy without it), not for this
/// user (an ACL), or not on this server (a read-only replica, which the
/// readiness check reports). Anything else (out of memory, loading, a
/// lost connection) passes, and is waited out like any outage at start.
pub fn without_functions(e: &redis::RedisError) -> bool {
    match e.code() {
        Some("NOPERM" | "READONLY") => true,
        Some("ERR") => e.detail().is_some_and(|d| {
            d.starts_with("unknown command") || d.starts_with("unknown subcommand")
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
