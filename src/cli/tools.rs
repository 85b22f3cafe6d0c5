//! The tools: `publish`, `results`, `limits`, `check-config` and `probe`.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use serde_json::{Map, Value, json};

use crate::broker::{self, TIMESTAMP_MS_HEADER};
use crate::domain::{EmailAddress, IpKey, Name, RegistrableDomain, now_ms};
use crate::ledger::{Backend, Ledger};
use crate::limiter::{Clock, Quotas, Scope, Subject, Usage};
use crate::mailer::Mailer;
use crate::settings::{Settings, redact_url};
use crate::templates::Templates;

/// Connects to RabbitMQ with a hint on failure.
async fn amqp(settings: &Settings) -> anyhow::Result<(Connection, Channel)> {
    let url = redact_url(&settings.amqp.url);
    let conn = broker::connect_node(&settings.amqp, ConnectionProperties::default())
        .await
        .map_err(|e| {
            match crate::tls::explain_url(&e, "amqp.tls", &settings.amqp.url, &settings.amqp.tls) {
                Some(why) => anyhow!("cannot reach RabbitMQ at {url}: {why}"),
                None => anyhow::Error::new(e).context(format!(
                    "cannot reach RabbitMQ at {url} (set [amqp] url or MAILGATE__AMQP__URL)"
                )),
            }
        })?;
    let channel = conn
        .create_channel()
        .await
        .context("opening a RabbitMQ channel")?;
    Ok((conn, channel))
}

/// Connects the limiter with a hint on failure (one attempt: a tool should
/// fail fast, unlike the worker).
async fn limiter(settings: &Settings) -> anyhow::Result<Backend> {
    if Backend::is_memory(&settings.redis) {
        bail!(
            "redis.url is memory://: the limits live inside the worker process, where no tool \
             can reach them (use Redis to share them)"
        );
    }
    let url = redact_url(&settings.redis.url);
    Backend::open(&settings.redis, &settings.limits)
        .await
        .map_err(|e| {
            match crate::tls::explain_url(&e, "redis.tls", &settings.redis.url, &settings.redis.tls)
            {
                Some(why) => anyhow!("cannot reach Redis at {url}: {why}"),
                None => anyhow::Error::new(e).context(format!(
                    "cannot reach Redis at {url} (set [redis] url or MAILGATE__REDIS__URL)"
                )),
            }
        })
}

/// A fresh job id: a UUID v7 (time-ordered, 74 random bits), so ids made in
/// the same millisecond still differ.
fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A random 6-digit code.
fn new_code() -> String {
    format!("{:06}", uuid::Uuid::new_v4().as_u128() % 1_000_000)
}

/// What `mailgate publish` was asked to send.
#[derive(Debug, Default)]
pub struct PublishArgs {
    /// One job from flags: its mailbox.
    pub email: Option<String>,
    /// Its client IP.
    pub ip: Option<String>,
    /// Its code; a random 6-digit code if absent.
    pub code: Option<String>,
    /// Its purpose.
    pub purpose: Option<String>,
    /// Its locale.
    pub locale: Option<String>,
    /// The attempt it is for (see the job's `session`).
    pub session: Option<String>,
    /// Its id; generated if absent.
    pub id: Option<String>,
    /// Template variables.
    pub vars: Vec<(String, String)>,
    /// Set `expires_at` this far in the future.
    pub expires_in: Option<Duration>,
    /// Jobs as JSON lines from this file (`-`: stdin) instead of flags.
    pub file: Option<PathBuf>,
    /// Results go to this queue.
    pub reply_to: Option<String>,
    /// Wait for each result on a private queue and print it.
    pub wait: bool,
    /// How long to wait for all results.
    pub timeout: Duration,
}

/// The jobs `args` describe, as JSON objects with ids.
pub fn jobs_from(args: &PublishArgs) -> anyhow::Result<Vec<Map<String, Value>>> {
    let mut jobs = Vec::new();
    if let Some(path) = &args.file {
        let reader: Box<dyn BufRead> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin().lock())
        } else {
            Box::new(std::io::BufReader::new(
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
            ))
        };
        for (n, line) in reader.lines().enumerate() {
            let line = line.context("reading jobs")?;
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&line)
                .with_context(|| format!("line {}: not JSON (one job object per line)", n + 1))?;
            let Value::Object(mut job) = value else {
                bail!("line {}: a job is a JSON object", n + 1);
            };
            job.entry("id").or_insert_with(|| Value::String(new_id()));
            jobs.push(job);
        }
    } else {
        let email = args
            .email
            .clone()
            .ok_or_else(|| anyhow!("give --email (or --file with JSON lines)"))?;
        let mut job = Map::new();
        job.insert("id".into(), json!(args.id.clone().unwrap_or_else(new_id)));
        job.insert("email".into(), json!(email));
        let code = args.code.clone().unwrap_or_else(new_code);
        job.insert("code".into(), json!(code));
        for (k, v) in [
            ("ip", &args.ip),
            ("purpose", &args.purpose),
            ("locale", &args.locale),
            ("session", &args.session),
        ] {
            if let Some(v) = v {
                job.insert(k.into(), json!(v));
            }
        }
        if !args.vars.is_empty() {
            let vars: Map<String, Value> = args
                .vars
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            job.insert("vars".into(), Value::Object(vars));
        }
        // When the job was made: a newer job supersedes it where its
        // purpose says so.
        job.insert(
            "created_at".into(),
            json!(jiff::Timestamp::now().to_string()),
        );
        if let Some(d) = args.expires_in {
            let at = jiff::Timestamp::now()
                .checked_add(jiff::SignedDuration::try_from(d)?)
                .context("--expires-in is too far")?;
            job.insert("expires_at".into(), json!(at.to_string()));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

/// Publishes the jobs with publisher confirms, printing each id (or, with
/// `wait`, each result as a JSON line). Returns whether every publish was
/// confirmed and, with `wait`, every result arrived.
pub async fn publish(settings: &Settings, args: &PublishArgs) -> anyhow::Result<bool> {
    if args.wait && args.reply_to.is_some() {
        bail!("--wait reads results on a private queue; it cannot be combined with --reply-to");
    }
    let jobs = jobs_from(args)?;
    let (conn, channel) = amqp(settings).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let reply_to = if args.wait {
        let q = channel
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .context("declaring a private reply queue")?;
        Some(q.name().to_string())
    } else {
        args.reply_to.clone()
    };
    let mut replies = match &reply_to {
        Some(q) if args.wait => Some(
            channel
                .basic_consume(
                    q.as_str().into(),
                    "mailgate-publish".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?,
        ),
        _ => None,
    };
    let mut all_ok = true;
    let mut waiting: BTreeMap<String, ()> = BTreeMap::new();
    let stdout = std::io::stdout();
    for job in jobs {
        let id = job
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let mut headers = FieldTable::default();
        headers.insert(
            TIMESTAMP_MS_HEADER.into(),
            AMQPValue::LongLongInt(i64::try_from(now_ms()).unwrap_or(i64::MAX)),
        );
        let mut props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_timestamp(now_ms() / 1000)
            .with_headers(headers)
            .with_correlation_id(id.as_str().into());
        if let Some(q) = &reply_to {
            props = props.with_reply_to(q.as_str().into());
        }
        let body = serde_json::to_vec(&job)?;
        let confirm = channel
            .basic_publish(
                "".into(),
                settings.amqp.jobs_queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &body,
                props,
            )
            .await?
            .await?;
        match confirm {
            Confirmation::Ack(None) => {
                if args.wait {
                    waiting.insert(id, ());
                } else {
                    writeln!(stdout.lock(), "{id}")?;
                }
            }
            Confirmation::Ack(Some(_)) => {
                all_ok = false;
                eprintln!(
                    "error: {id}: no queue {:?} (start a worker first, or set [amqp] jobs_queue)",
                    settings.amqp.jobs_queue
                );
            }
            _ => {
                all_ok = false;
                eprintln!("error: {id}: RabbitMQ did not confirm the publish");
            }
        }
    }
    if let Some(consumer) = replies.as_mut() {
        let deadline = tokio::time::Instant::now() + args.timeout;
        while !waiting.is_empty() {
            let next = tokio::time::timeout_at(deadline, consumer.next()).await;
            let Ok(Some(Ok(delivery))) = next else {
                all_ok = false;
                eprintln!(
                    "error: no result within {} for {} (is a worker running? `mailgate worker`)",
                    humantime::format_duration(args.timeout),
                    waiting.keys().cloned().collect::<Vec<_>>().join(", ")
                );
                break;
            };
            delivery.ack(BasicAckOptions::default()).await?;
            let result: Value = serde_json::from_slice(&delivery.data).unwrap_or(Value::Null);
            if let Some(id) = result.get("id").and_then(Value::as_str) {
                waiting.remove(id);
            }
            writeln!(stdout.lock(), "{}", String::from_utf8_lossy(&delivery.data))?;
        }
    }
    let _ = conn.close(200, "bye".into()).await;
    Ok(all_ok)
}

/// Prints results as JSON lines: what is queued now, or, with `follow`,
/// everything until `stop` completes. Returns how many were printed.
pub async fn results(
    settings: &Settings,
    queue: Option<&str>,
    follow: bool,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<u64> {
    let queue = queue.unwrap_or(&settings.amqp.results_queue).to_owned();
    let (conn, channel) = amqp(settings).await?;
    let progress = std::io::stderr().is_terminal();
    let stdout = std::io::stdout();
    let mut n = 0u64;
    let mut print = |data: &[u8]| -> anyhow::Result<()> {
        writeln!(stdout.lock(), "{}", String::from_utf8_lossy(data))?;
        n += 1;
        if progress {
            eprint!("\r{n} results from {queue}");
        }
        Ok(())
    };
    if follow {
        let mut consumer = channel
            .basic_consume(
                queue.as_str().into(),
                "mailgate-results".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .with_context(|| format!("consuming {queue:?} (does the queue exist?)"))?;
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => break,
                next = consumer.next() => match next {
                    Some(Ok(d)) => {
                        print(&d.data)?;
                        d.ack(BasicAckOptions::default()).await?;
                    }
                    Some(Err(e)) => return Err(e).context("RabbitMQ connection lost"),
                    None => break,
                },
            }
        }
    } else {
        while let Some(m) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions::default())
            .await
            .with_context(|| format!("reading {queue:?} (does the queue exist?)"))?
        {
            print(&m.delivery.data)?;
            m.delivery.ack(BasicAckOptions::default()).await?;
        }
    }
    if progress {
        eprintln!();
    }
    let _ = conn.close(200, "bye".into()).await;
    Ok(n)
}

/// Parses `--email`, `--ip` or `--domain` (or `--domain` with `--ip`)
/// into a subject's owned value.
pub enum Who {
    /// A mailbox.
    Email(EmailAddress),
    /// A client address.
    Ip(IpKey),
    /// A registrable domain.
    Domain(RegistrableDomain),
    /// A client network's share of a registrable domain's quota.
    Share(RegistrableDomain, IpKey),
}

impl Who {
    /// From the flags; exactly one must be given.
    pub fn parse(
        email: Option<&str>,
        ip: Option<&str>,
        domain: Option<&str>,
    ) -> anyhow::Result<Self> {
        match (email, ip, domain) {
            (Some(e), None, None) => Ok(Who::Email(EmailAddress::parse(e).context("--email")?)),
            (None, Some(i), None) => Ok(Who::Ip(IpKey::parse(i).context("--ip")?)),
            (None, None, Some(d)) => Ok(Who::Domain(
                RegistrableDomain::parse(d).context("--domain")?,
            )),
            (None, Some(i), Some(d)) => Ok(Who::Share(
                RegistrableDomain::parse(d).context("--domain")?,
                IpKey::parse(i).context("--ip")?,
            )),
            _ => bail!(
                "give exactly one of --email, --ip or --domain (or --domain with --ip: that \
                 client network's share of the domain)"
            ),
        }
    }

    fn subject(&self) -> Subject<'_> {
        match self {
            Who::Email(e) => Subject::Email(e),
            Who::Ip(i) => Subject::Ip(i),
            Who::Domain(d) => Subject::Domain(d),
            Who::Share(d, i) => Subject::Share(d, i),
        }
    }
}

/// The usage of `who`'s quota under `purpose`'s rules, consuming nothing.
pub async fn limits_show(
    settings: &Settings,
    who: &Who,
    purpose: Option<&str>,
) -> anyhow::Result<Usage> {
    let purpose = purpose.map(|p| Name::parse("purpose", p)).transpose()?;
    let limiter = limiter(settings).await?;
    Ok(limiter
        .usage(who.subject(), purpose.as_ref(), Clock::Server)
        .await?)
}

/// A JSON rendering of a [`Usage`], for scripts.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "key": u.key,
        "at_ms": u.at_ms,
        "retry_after_ms": u.retry_after_ms,
        "exempt": u.exempt,
        "override": u.by_override.as_ref().map(|o| json!({
            "target": o.target,
            "action": o.kind,
            "reason": o.reason,
            "expires_at_ms": o.expires_at_ms,
        })),
        "rules": u.rules.iter().map(|r| json!({
            "scope": r.rule.scope.as_str(),
            "window_ms": r.rule.window_ms,
            "max": r.rule.max,
            "enforce": r.enforce,
            "count": r.count,
            "retry_after_ms": r.retry_after_ms,
        })).collect::<Vec<_>>(),
    })
}

/// A human rendering of a [`Usage`]; a domain's says that each client
/// network may use only its `share` (`limits.domain.network_share`) of it.
pub fn render_usage(u: &Usage, share: f64) -> String {
    let mut out = format!("{}\n", u.key);
    for r in &u.rules {
        let window = short_duration(r.rule.window_ms);
        out.push_str(&format!("  {} per {window}: {} used", r.rule.max, r.count));
        if r.retry_after_ms > 0 {
            out.push_str(&format!(", full for {}", short_duration(r.retry_after_ms)));
        }
        if !r.enforce {
            out.push_str(" (shadow: counted, never rejects)");
        }
        out.push('\n');
    }
    if let Some(o) = &u.by_override {
        let until = o.expires_at_ms.map_or_else(
            || "until removed".to_owned(),
            |t| format!("for {}", short_duration(t.saturating_sub(u.at_ms))),
        );
        out.push_str(&format!(
            "override in force: {} {} {until}: {}\n",
            o.target, o.kind, o.reason
        ));
    }
    let domain = u
        .rules
        .first()
        .is_some_and(|r| r.rule.scope == Scope::Domain);
    if domain && share < 1.0 && !u.exempt && !u.key.contains(":net:") {
        out.push_str(&format!(
            "each client network may use only {share} of this (limits.domain.network_share); \
             --domain with --ip shows, and resets, one network's share\n"
        ));
    }
    if u.exempt {
        let why = match u.by_override {
            Some(_) => "the override allows it",
            None => "limits.domain.exempt",
        };
        out.push_str(&format!("exempt ({why}): this scope does not count it\n"));
    } else if u.retry_after_ms == 0 {
        out.push_str("next send: allowed now\n");
    } else {
        let at = jiff::Timestamp::from_millisecond(
            i64::try_from(u.at_ms + u.retry_after_ms).unwrap_or(0),
        )
        .map(|t| t.to_string())
        .unwrap_or_default();
        out.push_str(&format!(
            "next send: in {} ({at})\n",
            short_duration(u.retry_after_ms)
        ));
    }
    out
}

/// Runs an `overrides` action, printing what it did.
pub async fn overrides(
    settings: &Settings,
    action: super::OverridesAction,
) -> anyhow::Result<bool> {
    use crate::limiter::overrides::{Action, Override, Target};
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("overrides live in Redis");
    };
    match action {
        super::OverridesAction::Add {
            target,
            allow,
            deny,
            rule,
            reason,
            expires_in,
            replace,
            force,
        } => {
            let action = match (allow, deny) {
                (true, _) => Action::Allow,
                (_, true) => Action::Deny,
                _ if !rule.is_empty() => Action::Rules(rule),
                _ => bail!("say what it does: --allow, --deny or --rule <window>=<max>"),
            };
            let now = crate::domain::now_ms();
            let expires_at_ms = expires_in
                .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
            let target = Target::parse_to_add(&target, force)?;
            // A deny of a big provider's domain locks out every user there.
            if let (Target::Domain(d), Action::Deny) = (&target, &action)
                && settings.limits.domain.exempt.contains(d)
                && !force
            {
                bail!(
                    "domain:{d} is in limits.domain.exempt (a big provider): a deny locks out \
                     every user there; add --force if that is meant"
                );
            }
            let ov = Override {
                target,
                action,
                reason,
                expires_at_ms,
                added_at_ms: now,
            };
            let (stored, replaced) = ledger
                .store_overrides(std::slice::from_ref(&ov), replace)
                .await?;
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
            // A domain's rules are shared by its client networks too.
            let share = settings.limits.domain.network_share;
            if let (Target::Domain(_), Action::Rules(rules)) = (&stored.target, &stored.action)
                && share < 1.0
            {
                let each: Vec<String> = (rules.iter())
                    .map(|r| {
                        let max = ((f64::from(r.max) * share).ceil() as u32).clamp(1, r.max.max(1));
                        format!("{max} per {}", short_duration(r.window_ms()))
                    })
                    .collect();
                println!(
                    "each client network (an IPv4 /24, an IPv6 /48) may use {} of them \
                     (limits.domain.network_share {share}); an ip: allow lifts that for a network",
                    each.join(", ")
                );
            }
            Ok(true)
        }
        super::OverridesAction::List { json } => {
            let now = crate::domain::now_ms();
            for ov in ledger.list_overrides().await? {
                match json {
                    true => println!("{}", override_json(&ov, now)),
                    false => println!("{}", render_override(&ov, now)),
                }
            }
            Ok(true)
        }
        super::OverridesAction::Remove { target } => {
            let target = Target::parse(&target)?;
            let done = ledger.remove_override(&target).await?;
            if done.removed.is_empty() {
                println!("{target} had no override");
            }
            for t in done.removed {
                println!("removed the override of {t}");
            }
            for t in done.still {
                println!("still in force for the same subject: the override of {t}");
            }
            Ok(true)
        }
    }
}

/// An override on one line: what it matches, what it does, until when,
/// and why.
fn render_override(ov: &crate::limiter::overrides::Override, now: u64) -> String {
    use crate::limiter::overrides::Action;
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
        Some(t) => format!("for {} more", short_duration(t - now)),
    };
    format!("{} {does} {until}: {}", ov.target, ov.reason)
}

/// An override as JSON, for scripts.
fn override_json(ov: &crate::limiter::overrides::Override, now: u64) -> Value {
    use crate::limiter::overrides::Action;
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

/// `24h`, `10m`, `60s`, `1500ms`: as a rule is written in the settings.
fn short_duration(ms: u64) -> String {
    match ms {
        0 => "0s".into(),
        _ if ms.is_multiple_of(3_600_000) => format!("{}h", ms / 3_600_000),
        _ if ms.is_multiple_of(60_000) => format!("{}m", ms / 60_000),
        _ if ms.is_multiple_of(1000) => format!("{}s", ms / 1000),
        _ if ms > 60_000 => {
            let secs = ms.div_ceil(1000);
            format!("{}m{}s", secs / 60, secs % 60)
        }
        _ => format!("{:.1}s", ms as f64 / 1000.0),
    }
}

/// Removes `who`'s admissions; says what it removed.
pub async fn limits_reset(settings: &Settings, who: &Who) -> anyhow::Result<String> {
    let limiter = limiter(settings).await?;
    let (key, removed) = limiter.reset(who.subject()).await?;
    Ok(format!("removed {removed} admission(s) from {key}"))
}

/// `mailgate clock`: each Redis primary's clock against this host's, and
/// the mark of a lost key (removed first with `accept`, which also re-arms
/// the canary). Returns whether a worker here would take jobs.
pub async fn clock(settings: &Settings, accept: bool) -> anyhow::Result<bool> {
    use crate::ledger::clock::{Verdict, rfc3339};
    let Backend::Redis(ledger) = limiter(settings).await? else {
        bail!("redis.url is memory://: there is no Redis clock to check");
    };
    if accept {
        if ledger.clear_clock_mark().await? {
            println!(
                "removed the mark; workers take jobs again once the clocks agree (codes admitted \
                 before Redis's clock ran ahead may be mailed again)"
            );
        } else {
            println!("no mark to remove");
        }
    }
    let Some(readings) = ledger.clocks().await? else {
        bail!("this store keeps no clock of its own");
    };
    let max = settings.redis.max_clock_skew;
    let max_ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX);
    let skewed = readings.skewed(max_ms);
    let wall = i64::try_from(readings.wall_ms).unwrap_or(i64::MAX);
    for (node, t) in &readings.nodes {
        let skew = i64::try_from(*t).unwrap_or(i64::MAX).saturating_sub(wall);
        let past = skewed.as_ref().is_some_and(|s| s.node == *node);
        println!(
            "{node}: {skew:+} ms against this host ({})",
            if past {
                "past redis.max_clock_skew"
            } else {
                "agrees"
            }
        );
    }
    // Looks for a loss too, without refreshing the canary.
    let mark = ledger.watch_clock(false, None).await?;
    match &mark {
        Some(m) => println!(
            "marked: Redis's clock ran more than an hour ahead between {} and {}; no worker \
             takes jobs until {} by Redis's clock (or `mailgate clock --accept`)",
            rfc3339(m.since_ms),
            rfc3339(m.seen_ms),
            rfc3339(m.until_ms),
        ),
        None => println!("no mark stands"),
    }
    Ok(Verdict::of(&readings, mark, max_ms) == Verdict::Agrees)
}

/// Checks settings and templates (and, with `connect`, the services),
/// printing a report. Returns whether everything checked out.
pub async fn check_config(settings: &Settings, connect: bool) -> anyhow::Result<bool> {
    let templates = Templates::load(&settings.templates)
        .with_context(|| format!("templates in {}", settings.templates.dir.display()))?;
    let sets: Vec<String> = templates.sets().map(|(p, l)| format!("{p}/{l}")).collect();
    println!("settings: ok");
    println!(
        "templates: ok, {} sets rendered with sample data: {}",
        sets.len(),
        sets.join(", ")
    );
    let mailer = Mailer::new(&settings.smtp)?;
    for warning in settings.warnings() {
        println!("warning: {warning}");
    }
    if let Some(dir) = mailer.outbox() {
        println!(
            "warning: smtp.url is file://: mail is written to {} as .eml files, not sent",
            dir.display()
        );
    }
    if !connect {
        return Ok(true);
    }
    let mut ok = true;
    let mut report = |name: &str, r: anyhow::Result<()>| match r {
        Ok(()) => println!("{name}: ok"),
        Err(e) => {
            ok = false;
            println!("{name}: FAILED: {}", super::one_line(&e));
        }
    };
    report("rabbitmq", amqp(settings).await.map(|(c, _)| drop(c)));
    let redis = async {
        limiter(settings).await?.health().await?;
        anyhow::Ok(())
    };
    report("redis", redis.await);
    let several = settings.smtp.relay_list().is_ok_and(|r| r.len() > 1);
    // A TLS failure says what to set itself; another is pointed at the URL.
    let tls = |e: &crate::mailer::MailError| {
        let text = e.to_string();
        text.contains("certificate") || text.contains("TLS")
    };
    if !several {
        let at = redact_url(&settings.smtp.url);
        report(
            "smtp",
            (mailer.check().await).map_err(|e| {
                let hint = if tls(&e) {
                    ""
                } else {
                    " (set [smtp] url or MAILGATE__SMTP__URL)"
                };
                anyhow::Error::new(e).context(format!("SMTP at {at}{hint}"))
            }),
        );
    } else {
        // Every relay on its own: a standby that does not work is worth
        // knowing before it is needed.
        for (name, r) in mailer.check_each().await {
            let r = r.map_err(|e| match tls(&e) {
                true => anyhow::Error::new(e),
                false => anyhow::Error::new(e)
                    .context("set its url under [[smtp.relays]] or in smtp.url"),
            });
            report(&format!("smtp relay {name}"), r);
        }
    }
    Ok(ok)
}

/// A plain HTTP/1.1 GET of `path` at `addr`: `(status, body)`. Enough for
/// probing mailgate's own endpoint without an HTTP client dependency.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP response from {addr}"))?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// How long `probe` waits for `/readyz` (it checks Redis and, at most every
/// few seconds, SMTP, each bounded by its own timeout).
const PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Asks this host's worker (at `[http] listen`) whether it is ready, for
/// container health checks. Prints the report; returns whether it is.
pub async fn probe(settings: &Settings) -> anyhow::Result<bool> {
    let mut addr = settings.http.listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    // A health check must answer: a worker that accepts and never replies
    // is as unhealthy as one that is gone.
    let asked = tokio::time::timeout(PROBE_TIMEOUT, http_get(addr, "/readyz"));
    let (status, body) = asked
        .await
        .unwrap_or_else(|_| anyhow::bail!("no answer within {PROBE_TIMEOUT:?}"))
        .with_context(|| {
            format!("no worker answers at {addr} (is `mailgate worker` running? [http] listen)")
        })?;
    print!("{body}");
    Ok(status == 200)
}
