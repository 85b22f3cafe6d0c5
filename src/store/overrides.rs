//! The overrides in Redis ([`crate::limiter::overrides`] says what they
//! are and how they match): stored, listed and removed by
//! `mailgate overrides`, and polled by every worker.
//!
//! They live in one Redis hash, `<prefix>overrides`: one field per subject
//! (a new one replaces the old), its JSON as the value, and a `~version`
//! field bumped by each change, which every worker polls (every [`POLL`]),
//! so a change applies within a few seconds everywhere. Expired overrides
//! are ignored at once, and dropped from the hash by the next change.
//!
//! The store needs the limiter's override types and its `Keyspace`: the
//! keyspace says how the limiter counts a subject (an override is stored
//! so), and holds the table of the overrides in force, which the store
//! fills and the ledger judges by.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Conn;
use super::scripts::PRUNE;
use crate::domain::Normalization;
use crate::limiter::Keyspace;
use crate::limiter::overrides::{Action, MAX_OVERRIDES, Override, OverrideError, Target};
use crate::settings::{LimitSettings, RedisSettings, Rule};

/// How often a worker asks Redis whether the overrides changed: a change
/// applies everywhere within this (and the poll's round trip).
pub const POLL: Duration = Duration::from_secs(2);

/// The hash field holding the version (`prune.lua` names it too).
pub(crate) const VERSION: &str = "~version";

/// The overrides stored in Redis, and the live table they are put in
/// force in.
///
/// A ledger's store ([`crate::ledger::RedisLedger::overrides`]) shares the
/// ledger's connection and fills the table the ledger judges by; one
/// opened alone ([`Self::open`], for `mailgate overrides`) has a
/// connection and a table of its own.
#[derive(Clone)]
pub struct OverrideStore {
    conn: Conn,
    /// The prefix, how the limiter counts subjects, and the live table.
    keys: Arc<Keyspace>,
}

/// Names the type only: it holds a connection.
impl std::fmt::Debug for OverrideStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OverrideStore").finish_non_exhaustive()
    }
}

/// What `mailgate overrides remove` did.
#[derive(Debug, Clone, Default)]
pub struct Removal {
    /// The stored overrides it removed (none: the subject had none).
    pub removed: Vec<Target>,
    /// Others stored for a subject the limiter counts as the same one,
    /// left in force (only when one was stored for exactly the target).
    pub still: Vec<Target>,
}

impl OverrideStore {
    /// Connects to Redis on its own (failing if it does not answer now), to
    /// store, list and remove overrides; nothing judges by its table.
    pub async fn open(
        redis: &RedisSettings,
        limits: &LimitSettings,
    ) -> Result<Self, OverrideError> {
        let conn = super::connect(redis).await.map_err(|e| {
            match super::conn::refusal(&e, &redis.key_prefix) {
                Some(why) => OverrideError::Unfit(why),
                None => e.into(),
            }
        })?;
        let keys = Arc::new(Keyspace::new(&redis.key_prefix, limits));
        Ok(Self::on(conn, keys))
    }

    /// The store on `conn` that puts what it reads in force in `keys`'
    /// table.
    pub(crate) fn on(conn: Conn, keys: Arc<Keyspace>) -> Self {
        Self { conn, keys }
    }

    /// Puts the overrides stored now in force, then polls them every
    /// [`POLL`] while anything else holds the table's keyspace (the
    /// ledger that judges by it). A failed poll is logged, and the
    /// overrides in force stay. Must be called within a Tokio runtime.
    /// A Redis that refuses mailgate for good (credentials, an ACL) is
    /// [`OverrideError::Unfit`]; one that does not answer, or is loading
    /// its data, is [`OverrideError::Redis`]: worth trying again.
    pub async fn start(&self) -> Result<(), OverrideError> {
        refresh(&self.conn, &self.keys).await.map_err(|e| match e {
            OverrideError::Redis(e) => match super::conn::refusal(&e, &self.keys.prefix) {
                Some(why) => OverrideError::Unfit(why),
                None => OverrideError::Redis(e),
            },
            other => other,
        })?;
        tokio::spawn(poll(self.conn.clone(), Arc::downgrade(&self.keys)));
        Ok(())
    }

    /// Reads the overrides now rather than at the next poll; whether they
    /// changed.
    pub async fn reload(&self) -> Result<bool, OverrideError> {
        refresh(&self.conn, &self.keys).await
    }

    /// Stores `ov`, replacing any override of the same subject; every
    /// worker applies it within [`POLL`].
    pub async fn add(&self, ov: &Override) -> Result<Override, OverrideError> {
        let mut stored = self.add_all(std::slice::from_ref(ov)).await?;
        stored
            .pop()
            .ok_or_else(|| OverrideError::Invalid("nothing stored".into()))
    }

    /// Stores `ovs` at once (as [`Self::add`] does one). Each is stored as
    /// the limiter counts its subject (`Keyspace::counted`); returns them
    /// so. One that would loosen an override in force is refused
    /// ([`Self::store`]).
    pub async fn add_all(&self, ovs: &[Override]) -> Result<Vec<Override>, OverrideError> {
        Ok(self.store(ovs, false).await?.0)
    }

    /// Stores `ovs` as the limiter counts their subjects; with `replace`,
    /// even where one loosens an override in force (a weaker action, or
    /// other rules: without it that is refused). Returns them as stored,
    /// and the overrides in force they replaced.
    pub async fn store(
        &self,
        ovs: &[Override],
        replace: bool,
    ) -> Result<(Vec<Override>, Vec<Override>), OverrideError> {
        let now = crate::domain::now_ms();
        let norm = &self.keys.limits.normalize;
        let ovs: Vec<Override> = ovs.iter().map(|o| self.keys.counted(o.clone())).collect();
        let replaced = add(&self.conn, &self.keys.prefix, norm, &ovs, now, replace).await?;
        Ok((ovs, replaced))
    }

    /// Removes the override stored for exactly `target` (its field, even
    /// an entry this version cannot read); if there is none, the one
    /// stored for a subject that widens to the same one as the limiter
    /// counts it (`Keyspace::counted`: removing the /24 a stored /32
    /// widens to removes that /32). Several such are refused, naming each
    /// (removing them all could take a deny of another address with them).
    /// Says which it removed, and which others in force still apply to
    /// that subject.
    pub async fn remove(&self, target: &Target) -> Result<Removal, OverrideError> {
        let norm = &self.keys.limits.normalize;
        let (wanted, exact) = (self.subject(target), target.field(norm));
        let key = hash_key(&self.keys.prefix);
        let all = read(&self.conn, &key).await?;
        let now = crate::domain::now_ms();
        // Its own entry: under the field this normalization gives, or
        // stored for exactly this target under another (an entry written
        // with another normalization, e.g. `strip_plus_tag = false`).
        let own = |field: &str, ov: &Override| field == exact || ov.target == *target;
        let (same, _): (Vec<_>, Vec<_>) = (all.into_iter())
            .filter(|(field, ov)| own(field, ov) || ov.live(now))
            .partition(|(field, ov)| own(field, ov) || self.subject(&ov.target) == wanted);
        let (mine, others): (Vec<_>, Vec<_>) = same.into_iter().partition(|(f, ov)| own(f, ov));
        let mut fields: Vec<String> = mine.iter().map(|(f, _)| f.clone()).collect();
        if !fields.contains(&exact) {
            fields.push(exact.clone());
        }
        // The exact field even if this version cannot read its entry.
        let removed = remove(&self.conn, &self.keys.prefix, &fields).await?;
        if removed > 0 {
            let mut removed: Vec<Target> = mine.into_iter().map(|(_, ov)| ov.target).collect();
            if removed.is_empty() {
                removed.push(target.clone());
            }
            return Ok(Removal {
                removed,
                still: others.into_iter().map(|(_, ov)| ov.target).collect(),
            });
        }
        self.remove_widened(target, others).await
    }

    /// [`Self::remove`] of `target` that has no override of its own:
    /// `same`, the overrides stored for a subject the limiter counts as
    /// the same one, is removed if it is one.
    async fn remove_widened(
        &self,
        target: &Target,
        same: Vec<(String, Override)>,
    ) -> Result<Removal, OverrideError> {
        match same.as_slice() {
            [] => Ok(Removal::default()),
            [(field, ov)] => {
                remove(&self.conn, &self.keys.prefix, std::slice::from_ref(field)).await?;
                Ok(Removal {
                    removed: vec![ov.target.clone()],
                    still: Vec::new(),
                })
            }
            several => Err(OverrideError::Invalid(format!(
                "{target} has no override of its own, and several count as its subject: \
                 remove each by its target: {}",
                (several.iter().map(|(_, ov)| ov.target.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// A subject as the limiter counts it: the field of its widened target
    /// (one per mailbox however it is spelled).
    fn subject(&self, target: &Target) -> String {
        let probe = Override {
            target: target.clone(),
            action: Action::Allow,
            reason: String::new(),
            expires_at_ms: None,
            added_at_ms: 0,
        };
        let norm = &self.keys.limits.normalize;
        self.keys.counted(probe).target.field(norm)
    }

    /// Every stored override, expired ones too (an expired one is no longer
    /// in force; the next change drops it).
    pub async fn list(&self) -> Result<Vec<Override>, OverrideError> {
        let key = hash_key(&self.keys.prefix);
        let all = read(&self.conn, &key).await?;
        Ok(all.into_iter().map(|(_, o)| o).collect())
    }
}

/// One `mailgate limits reset`, as the log of resets keeps it: support
/// staff forgetting a subject's admissions leave a trace, as an override
/// does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetNote {
    /// The log reset (`<prefix>email:…`, `<prefix>ip:…`, …).
    pub key: String,
    /// Why (required by the command).
    pub reason: String,
    /// How many admissions it forgot.
    pub removed: u64,
    /// When, ms since the epoch.
    pub at_ms: u64,
}

/// How many resets the log keeps (the newest).
const RESETS_KEPT: isize = 1000;

impl OverrideStore {
    /// Notes `note` in the log of resets (`<prefix>resets`, which keeps
    /// the newest 1 000).
    pub async fn note_reset(&self, note: &ResetNote) -> Result<(), OverrideError> {
        let key = crate::limiter::families::resets_key(&self.keys.prefix);
        let json =
            serde_json::to_string(note).map_err(|e| OverrideError::Invalid(e.to_string()))?;
        let mut pipe = ::redis::pipe();
        pipe.lpush(&key, json).ignore();
        pipe.ltrim(&key, 0, RESETS_KEPT - 1).ignore();
        let () = pipe.query_async(&mut self.conn.clone()).await?;
        Ok(())
    }

    /// The resets noted, newest first (an entry that cannot be read is
    /// left out).
    pub async fn resets(&self) -> Result<Vec<ResetNote>, OverrideError> {
        let key = crate::limiter::families::resets_key(&self.keys.prefix);
        let all: Vec<String> = ::redis::cmd("LRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(all
            .iter()
            .filter_map(|j| serde_json::from_str(j).ok())
            .collect())
    }
}

/// Puts the overrides stored in Redis in force if their hash changed
/// ([`stamp`]: one round trip when it did not, and nothing logged);
/// whether it did. A change made after the stamp was read is installed
/// under the older stamp, so the next poll reads it again.
async fn refresh(conn: &Conn, keys: &Keyspace) -> Result<bool, OverrideError> {
    let stamp = stamp(conn, &keys.prefix).await?;
    if keys.overrides_version().as_deref() == Some(stamp.as_str()) {
        return Ok(false);
    }
    let all = read(conn, &hash_key(&keys.prefix)).await?;
    let now = crate::domain::now_ms();
    let live: Vec<Override> = (all.into_iter())
        .map(|(_, o)| o)
        .filter(|o| o.live(now))
        .collect();
    let n = keys.install(live, Some(stamp));
    tracing::info!(overrides = n, "overrides in force");
    Ok(true)
}

/// Polls the overrides every [`POLL`] until nothing else holds the
/// keyspace (`keys` no longer upgrades). A failed poll is logged and the
/// overrides in force stay.
async fn poll(conn: Conn, keys: Weak<Keyspace>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(POLL).await;
        let Some(keys) = keys.upgrade() else {
            return;
        };
        match refresh(&conn, &keys).await {
            Ok(_) if failing => {
                failing = false;
                tracing::info!("reading the overrides works again");
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %crate::report::one_line(&e), "cannot read the overrides; those in force stay");
            }
            // Logged once when it changes.
            Ok(_) | Err(_) => {}
        }
    }
}

/// An override as stored in the hash.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    target: String,
    action: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rules: Vec<StoredRule>,
    reason: String,
    expires_at_ms: Option<u64>,
    added_at_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredRule {
    window_ms: u64,
    max: u32,
    #[serde(default = "yes")]
    enforce: bool,
}

fn yes() -> bool {
    true
}

impl From<&Override> for Stored {
    fn from(o: &Override) -> Self {
        let rules = match &o.action {
            Action::Rules(rules) => (rules.iter())
                .map(|r| StoredRule {
                    window_ms: r.window_ms(),
                    max: r.max,
                    enforce: r.enforce,
                })
                .collect(),
            _ => Vec::new(),
        };
        Stored {
            target: o.target.to_string(),
            action: o.action.kind().to_owned(),
            rules,
            reason: o.reason.clone(),
            expires_at_ms: o.expires_at_ms,
            added_at_ms: o.added_at_ms,
        }
    }
}

impl TryFrom<Stored> for Override {
    type Error = OverrideError;

    fn try_from(s: Stored) -> Result<Self, OverrideError> {
        let action = match s.action.as_str() {
            "allow" => Action::Allow,
            "deny" => Action::Deny,
            "rules" => Action::Rules(
                (s.rules.iter())
                    .map(|r| Rule {
                        enforce: r.enforce,
                        ..Rule::new(Duration::from_millis(r.window_ms), r.max)
                    })
                    .collect(),
            ),
            other => return Err(OverrideError::Invalid(format!("unknown action {other:?}"))),
        };
        let ov = Override {
            target: Target::parse(&s.target)?,
            action,
            reason: s.reason,
            expires_at_ms: s.expires_at_ms,
            added_at_ms: s.added_at_ms,
        };
        ov.check_shape()?;
        Ok(ov)
    }
}

/// A version no earlier one repeats (a counter would start again if the
/// hash were deleted, and a worker holding that number would never see the
/// change).
fn new_version() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// The overrides' hash key.
fn hash_key(prefix: &str) -> String {
    crate::limiter::families::overrides_key(prefix)
}

/// Whether storing `new` over `old` (one field: the same subject as the
/// limiter counts it) would loosen what holds: a weaker action (deny >
/// rules > allow), other rules, or an earlier end: an allow of one
/// address must not silently replace the deny of the network it widens
/// to, nor a short deny of an alias a lasting one.
fn loosens(old: &Override, new: &Override) -> bool {
    let strength = |a: &Action| match a {
        Action::Deny => 2,
        Action::Rules(_) => 1,
        Action::Allow => 0,
    };
    let end = |o: &Override| o.expires_at_ms.unwrap_or(u64::MAX);
    strength(&new.action) < strength(&old.action)
        || matches!((&old.action, &new.action), (Action::Rules(a), Action::Rules(b)) if a != b)
        || (!matches!(old.action, Action::Allow) && end(new) < end(old))
}

/// Drops expired overrides, then stores `ovs` (each replacing any override
/// of the same subject) and bumps the version, atomically. A live override
/// that one would loosen ([`loosens`]) is replaced only with `replace`;
/// else nothing is stored and the error names it. Returns the live
/// overrides replaced.
async fn add(
    conn: &Conn,
    prefix: &str,
    norm: &Normalization,
    ovs: &[Override],
    now_ms: u64,
    replace: bool,
) -> Result<Vec<Override>, OverrideError> {
    let key = hash_key(prefix);
    let _: i64 = PRUNE
        .key(&key)
        .arg(now_ms)
        .arg(new_version())
        .invoke_async(&mut conn.clone())
        .await?;
    let current = read(conn, &key).await?;
    let live: HashMap<&str, &Override> = (current.iter())
        .filter(|(_, o)| o.live(now_ms))
        .map(|(f, o)| (f.as_str(), o))
        .collect();
    let mut fields = std::collections::HashSet::new();
    let mut replaced = Vec::new();
    let mut pipe = ::redis::pipe();
    pipe.atomic();
    for ov in ovs {
        ov.check(now_ms)?;
        let field = ov.target.field(norm);
        if let Some(old) = live.get(field.as_str()) {
            if !replace && loosens(old, ov) {
                return Err(OverrideError::Invalid(format!(
                    "{} has an override in force that this would loosen: {} ({}); \
                     give --replace to replace it",
                    ov.target,
                    old.action.kind(),
                    old.reason
                )));
            }
            replaced.push((*old).clone());
        }
        let json = serde_json::to_string(&Stored::from(ov))
            .map_err(|e| OverrideError::Invalid(e.to_string()))?;
        pipe.hset(&key, &field, json).ignore();
        fields.insert(field);
    }
    let kept = (current.iter())
        .filter(|(f, o)| o.live(now_ms) && !fields.contains(f))
        .count();
    if kept + fields.len() > MAX_OVERRIDES {
        return Err(OverrideError::Invalid(format!(
            "at most {MAX_OVERRIDES} overrides can be in force: remove some first"
        )));
    }
    pipe.hset(&key, VERSION, new_version()).ignore();
    let () = pipe.query_async(&mut conn.clone()).await?;
    Ok(replaced)
}

/// Removes the overrides stored under `fields`, bumping the version,
/// atomically; how many there were.
async fn remove(conn: &Conn, prefix: &str, fields: &[String]) -> Result<i64, OverrideError> {
    let key = hash_key(prefix);
    let (removed, _): (i64, i64) = ::redis::pipe()
        .atomic()
        .hdel(&key, fields)
        .hset(&key, VERSION, new_version())
        .query_async(&mut conn.clone())
        .await?;
    Ok(removed)
}

/// Every stored override (expired ones too), by field.
async fn read(conn: &Conn, key: &str) -> Result<Vec<(String, Override)>, OverrideError> {
    let all: HashMap<String, String> = ::redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut conn.clone())
        .await?;
    let mut out = Vec::with_capacity(all.len());
    for (field, json) in all {
        if field == VERSION {
            continue;
        }
        let parsed = serde_json::from_str::<Stored>(&json)
            .map_err(|e| OverrideError::Invalid(e.to_string()))
            .and_then(Override::try_from);
        match parsed {
            Ok(ov) => out.push((field, ov)),
            // One unreadable entry (written by hand, or by a later
            // version) must not take the others down.
            Err(e) => {
                let kind = field.split(':').next().unwrap_or_default();
                tracing::warn!(kind, error = %crate::report::one_line(&e), "an override cannot be read; ignored");
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// What the hash looks like from outside, in one round trip: its version
/// and its length (`v7/3`; `-/0` when there is none). It changes with
/// every change `mailgate overrides` makes, and with an entry written by
/// hand, so the hash is read again only when it differs.
async fn stamp(conn: &Conn, prefix: &str) -> Result<String, OverrideError> {
    let key = hash_key(prefix);
    let (version, len): (Option<String>, u64) = ::redis::pipe()
        .cmd("HGET")
        .arg(&key)
        .arg(VERSION)
        .cmd("HLEN")
        .arg(&key)
        .query_async(&mut conn.clone())
        .await?;
    Ok(format!("{}/{len}", version.as_deref().unwrap_or("-")))
}
