//! `mailgate overrides`: add, list or remove the overrides every worker
//! applies.

use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use serde_json::{Value, json};

use super::{in_redis, letters, short_duration, time_left};
use crate::limiter::overrides::{Action, Override, Target};
use crate::settings::Settings;
use crate::store::overrides::OverrideStore;

/// `overrides`' actions.
#[derive(Subcommand, Debug)]
pub enum OverridesAction {
    /// Add an override (replacing any of the same subject).
    Add(AddOverride),
    /// List the overrides stored (expired ones marked).
    List {
        /// Print JSON lines instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Remove the override of a subject.
    Remove {
        /// As `add` names it.
        target: String,
    },
}

/// `overrides add`'s flags: the override to add, and what it may do.
#[derive(clap::Args, Debug)]
pub struct AddOverride {
    /// What it matches: `email:<mailbox>`, `domain:<registrable
    /// domain>` or `ip:<address or network>` (e.g. `ip:10.0.0.0/8`).
    pub target: String,
    /// Not limited or counted by the subject's own scope (a mailbox by the
    /// mailbox rules, a network by the IP rules, a domain by the domain
    /// rules); the other scopes still judge its requests, so an allowed
    /// mailbox can still be rejected by its client's IP rules.
    #[arg(long, conflicts_with_all = ["deny", "rule"])]
    pub allow: bool,
    /// Always rejected while it lasts.
    #[arg(long, conflicts_with = "rule")]
    pub deny: bool,
    /// Its own rules instead of the scope's: `<window>=<max>`, e.g.
    /// `--rule 1h=500 --rule 24h=2000`.
    #[arg(long, value_parser = parse_rule)]
    pub rule: Vec<crate::settings::Rule>,
    /// Why (required: whoever finds it later must know).
    #[arg(long)]
    pub reason: String,
    /// How long it lasts (e.g. `2h`, `30d`); without it, until removed.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub expires_in: Option<Duration>,
    /// Replace an override in force that this one loosens (a weaker
    /// action, or other rules), for the same subject as the limiter
    /// counts it; without it that is refused.
    #[arg(long)]
    pub replace: bool,
    /// Accept an IP network wider than /8 (IPv4) or /32 (IPv6), which
    /// takes that many clients out of (or into) the IP scope at once,
    /// or a deny of a domain in `limits.domain.exempt` (a big
    /// provider's: every user there).
    #[arg(long)]
    pub force: bool,
}

fn parse_rule(s: &str) -> Result<crate::settings::Rule, String> {
    let (window, max) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not <window>=<max>, e.g. 1h=500"))?;
    let window = humantime::parse_duration(window).map_err(|e| format!("{window:?}: {e}"))?;
    let max: u32 = max
        .parse()
        .map_err(|_| format!("{max:?} is not a whole number"))?;
    Ok(crate::settings::Rule::new(window, max))
}

/// Runs an `overrides` action, printing what it did.
pub async fn overrides(settings: &Settings, action: OverridesAction) -> anyhow::Result<bool> {
    let opened = OverrideStore::open(&settings.redis, &settings.limits);
    let store = in_redis(settings, opened).await?;
    match action {
        OverridesAction::Add(add) => add_override(settings, &store, add).await,
        OverridesAction::List { json } => {
            let now = crate::domain::now_ms();
            let listed = store.list().await?;
            if listed.is_empty() && !json {
                eprintln!("no overrides in force");
            }
            for ov in listed {
                match json {
                    true => println!(
                        "{}",
                        letters::printable_json(&override_json(&ov, now).to_string())
                    ),
                    false => println!("{}", render_override(&ov, now)),
                }
            }
            Ok(true)
        }
        OverridesAction::Remove { target } => {
            let target = Target::parse(&target)?;
            let done = store.remove(&target).await?;
            let removed = !done.removed.is_empty();
            if !removed {
                // Exit 1, as `suppress remove` of a mailbox with none.
                println!("{target} had no override");
            }
            for t in done.removed {
                println!("removed the override of {t}");
            }
            for t in done.still {
                println!("still in force for the same subject: the override of {t}");
            }
            Ok(removed)
        }
    }
}

/// `overrides add`: stores the override, and says what it replaced, the
/// subject it counts as, and what it covers.
async fn add_override(
    settings: &Settings,
    store: &OverrideStore,
    add: AddOverride,
) -> anyhow::Result<bool> {
    let replace = add.replace;
    let now = crate::domain::now_ms();
    let ov = add.into_override(settings, now)?;
    let (stored, replaced) = store.store(std::slice::from_ref(&ov), replace).await?;
    let Some(stored) = stored.into_iter().next() else {
        bail!("nothing was stored");
    };
    for old in replaced {
        println!("replaced: {}", render_override(&old, now));
    }
    if stored.target != ov.target {
        println!(
            "{} counts as {}: the limiter counts that subject so",
            ov.target, stored.target
        );
    }
    println!("added: {}", render_override(&stored, now));
    println!("covers: {}", stored.target.coverage());
    for wider in wider_in_force(&stored, &store.list().await?, now) {
        println!(
            "note: {} is in force for the wider {}; for the clients this one covers, this \
             one holds instead (the narrowest network holding a client wins)",
            wider.action.kind(),
            wider.target
        );
    }
    if let Some(note) = network_shares(&stored, settings.limits.domain.network_share) {
        println!("{note}");
    }
    Ok(true)
}

impl AddOverride {
    /// The override these flags describe, added at `now`. Refuses one that
    /// says nothing, a target that does not parse, and (without `--force`)
    /// a network wider than /8 or /32, or a deny or rules of a domain in
    /// `limits.domain.exempt`.
    fn into_override(self, settings: &Settings, now: u64) -> anyhow::Result<Override> {
        let action = match (self.allow, self.deny) {
            (true, _) => Action::Allow,
            (_, true) => Action::Deny,
            _ if !self.rule.is_empty() => Action::Rules(self.rule),
            _ => bail!("say what it does: --allow, --deny or --rule <window>=<max>"),
        };
        let expires_at_ms = (self.expires_in)
            .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        let target = Target::parse_to_add(&self.target, self.force)?;
        // A deny of a big provider's domain locks out every user there, and
        // rules of its own put all of them under one domain rule.
        if let Target::Domain(d) = &target
            && settings.limits.domain.exempt.contains(d)
            && !self.force
        {
            match &action {
                Action::Deny => bail!(
                    "domain:{d} is in limits.domain.exempt (a big provider): a deny locks out \
                     every user there; add --force if that is meant"
                ),
                Action::Rules(_) => bail!(
                    "domain:{d} is in limits.domain.exempt (a big provider): rules of its own \
                     would judge every sign-up there by one domain rule (and each client \
                     network by its share of it); add --force if that is meant"
                ),
                Action::Allow => {}
            }
        }
        Ok(Override {
            target,
            action,
            reason: self.reason,
            expires_at_ms,
            added_at_ms: now,
        })
    }
}

/// The live overrides of wider networks than `stored`'s that hold the
/// networks it covers: `stored`, the narrower, now decides for those
/// clients (an allow inside a denied /24 lifts the deny for them), which
/// whoever adds it should be told.
fn wider_in_force<'a>(stored: &Override, all: &'a [Override], now: u64) -> Vec<&'a Override> {
    let Target::Net(net) = &stored.target else {
        return Vec::new();
    };
    (all.iter())
        .filter(|o| o.live(now))
        .filter(|o| match &o.target {
            Target::Net(wider) => wider.prefix_len() < net.prefix_len() && wider.contains(net),
            _ => false,
        })
        .collect()
}

/// What each client network may use of a domain's own rules, when
/// `share` (`limits.domain.network_share`) is below 1: a domain's rules are
/// shared by its client networks too.
fn network_shares(stored: &Override, share: f64) -> Option<String> {
    match (&stored.target, &stored.action) {
        (Target::Domain(_), Action::Rules(rules)) if share < 1.0 => {
            let each: Vec<String> = (rules.iter())
                .map(|r| {
                    let max = ((f64::from(r.max) * share).ceil() as u32).clamp(1, r.max.max(1));
                    format!("{max} per {}", short_duration(r.window_ms()))
                })
                .collect();
            Some(format!(
                "each client network (an IPv4 /24, an IPv6 /48) may use {} of them \
                 (limits.domain.network_share {share}); an ip: allow lifts that for a network",
                each.join(", ")
            ))
        }
        _ => None,
    }
}

/// An override on one line: what it matches, what it does, until when,
/// and why.
fn render_override(ov: &Override, now: u64) -> String {
    let does = match &ov.action {
        Action::Allow => "allow".to_owned(),
        Action::Deny => "deny".to_owned(),
        Action::Rules(rules) => {
            let rules: Vec<String> = (rules.iter())
                .map(|r| format!("{} per {}", r.max, short_duration(r.window_ms())))
                .collect();
            format!("rules {}", rules.join(", "))
        }
    };
    let until = match ov.expires_at_ms {
        None => "until removed".to_owned(),
        Some(t) if t <= now => "EXPIRED".to_owned(),
        Some(t) => format!("for {} more", time_left(t - now)),
    };
    letters::printable(&format!("{} {does} {until}: {}", ov.target, ov.reason))
}

/// An override as JSON, for scripts.
fn override_json(ov: &Override, now: u64) -> Value {
    let rules: Vec<Value> = match &ov.action {
        Action::Rules(rules) => (rules.iter())
            .map(|r| json!({"window_ms": r.window_ms(), "max": r.max}))
            .collect(),
        _ => Vec::new(),
    };
    json!({
        "target": ov.target.to_string(),
        "action": ov.action.kind(),
        "rules": rules,
        "reason": ov.reason,
        "expires_at_ms": ov.expires_at_ms,
        "added_at_ms": ov.added_at_ms,
        "live": ov.live(now),
    })
}
