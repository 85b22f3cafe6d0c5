//! `mailgate publish`: publish jobs (one from flags, or JSON lines) with
//! publisher confirms, and with `--wait` print their results.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Consumer};
use serde_json::{Map, Value, json};

use super::letters::printable;
use super::{Exit, amqp};
use crate::broker::TIMESTAMP_MS_HEADER;
use crate::domain::now_ms;
use crate::settings::Settings;

/// What `mailgate publish` was asked to send: its flags.
#[derive(Debug, clap::Args)]
pub struct PublishArgs {
    /// The mailbox to send a code to.
    #[arg(long)]
    pub email: Option<String>,
    /// The client IP that asked for it.
    #[arg(long)]
    pub ip: Option<String>,
    /// The code (default: a random 6-digit code).
    #[arg(long)]
    pub code: Option<String>,
    /// The template set (default: verify).
    #[arg(long)]
    pub purpose: Option<String>,
    /// The locale, e.g. zh-CN.
    #[arg(long)]
    pub locale: Option<String>,
    /// The attempt it is for (a sign-up or login session): only a newer
    /// job of the same session supersedes it.
    #[arg(long)]
    pub session: Option<String>,
    /// The job id (default: generated).
    #[arg(long)]
    pub id: Option<String>,
    /// A template variable, `name=value`; repeatable.
    #[arg(long = "var", value_parser = parse_var)]
    pub vars: Vec<(String, String)>,
    /// The code expires this long from now, e.g. 10m.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub expires_in: Option<Duration>,
    /// Publish the JSON lines (one job object each) of this file; `-` for stdin.
    #[arg(long, conflicts_with_all = ["email", "ip", "code", "purpose", "locale", "session", "id", "vars", "expires_in"])]
    pub file: Option<PathBuf>,
    /// Ask for results on this queue.
    #[arg(long)]
    pub reply_to: Option<String>,
    /// Wait for each job's result (on a private queue) and print it.
    #[arg(long)]
    pub wait: bool,
    /// With --wait: how long to wait for all results.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

fn parse_var(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not name=value"))
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
/// `wait`, each result as a JSON line). The exit status: 1 if a publish was
/// not confirmed or, with `wait`, a result did not arrive; else, with
/// `wait`, the worst of the results' ([`status_exit`]); else 0.
pub async fn publish(settings: &Settings, args: &PublishArgs) -> anyhow::Result<Exit> {
    if args.wait && args.reply_to.is_some() {
        bail!("--wait reads results on a private queue; it cannot be combined with --reply-to");
    }
    let jobs = jobs_from(args)?;
    let (conn, channel) = amqp(settings).await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let (reply_to, mut replies) = reply_queue(&channel, args).await?;
    let mut all_ok = true;
    let mut waiting = BTreeSet::new();
    for job in jobs {
        let id = job
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let confirm = publish_job(&channel, settings, &job, &id, reply_to.as_deref()).await?;
        match confirm {
            Confirmation::Ack(None) => {
                if args.wait {
                    waiting.insert(id);
                } else {
                    writeln!(std::io::stdout().lock(), "{}", printable(&id))?;
                }
            }
            Confirmation::Ack(Some(_)) => {
                all_ok = false;
                eprintln!(
                    "error: {}: no queue {:?} (start a worker first, or set [amqp] jobs_queue)",
                    printable(&id),
                    settings.amqp.jobs_queue
                );
            }
            _ => {
                all_ok = false;
                eprintln!(
                    "error: {}: RabbitMQ did not confirm the publish",
                    printable(&id)
                );
            }
        }
    }
    let mut exit = Exit::OK;
    if let Some(consumer) = replies.as_mut() {
        exit = print_results(consumer, waiting, args.timeout).await?;
    }
    let _ = conn.close(200, "bye".into()).await;
    // The tool's own failure outranks what the results say.
    Ok(if all_ok { exit } else { Exit::FAILED })
}

/// `publish --wait`'s exit status for a result's `status`, so that a script
/// can tell: 0 a code was mailed (`sent`, or `duplicate`: an earlier
/// message of the job was); 3 `rejected` (a limit: try again after
/// `retry_after_ms`); 4 any other answer (`suppressed`, `invalid`,
/// `failed`, `expired`, `superseded`, or one this version does not know:
/// no code, and asking again soon will not mail one). 1 stays for the tool's own failures; the worst
/// status of several jobs wins.
pub fn status_exit(status: &str) -> Exit {
    match status {
        "sent" | "duplicate" => Exit::OK,
        "rejected" => Exit(3),
        _ => Exit(4),
    }
}

/// Where the jobs ask for their results, and with `--wait` the consumer
/// that reads them: a private queue of this connection's (exclusive,
/// deleted with it) with `--wait`, else `--reply-to` if given.
async fn reply_queue(
    channel: &Channel,
    args: &PublishArgs,
) -> anyhow::Result<(Option<String>, Option<Consumer>)> {
    if !args.wait {
        return Ok((args.reply_to.clone(), None));
    }
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
    let q = q.name().to_string();
    let consumer = channel
        .basic_consume(
            q.as_str().into(),
            "mailgate-publish".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((Some(q), Some(consumer)))
}

/// Publishes one job, `id`, to the jobs queue (mandatory, persistent,
/// stamped with the time in ms) and waits for RabbitMQ's confirm.
async fn publish_job(
    channel: &Channel,
    settings: &Settings,
    job: &Map<String, Value>,
    id: &str,
    reply_to: Option<&str>,
) -> anyhow::Result<Confirmation> {
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
        .with_correlation_id(id.into());
    if let Some(q) = reply_to {
        props = props.with_reply_to(q.into());
    }
    let body = serde_json::to_vec(job)?;
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
    Ok(confirm)
}

/// Prints each result `consumer` receives, until every job in `waiting`
/// has one or `timeout` runs out (then says which are missing). Returns
/// the exit status: 1 if a result did not arrive, else the worst of the
/// results' ([`status_exit`]).
async fn print_results(
    consumer: &mut Consumer,
    mut waiting: BTreeSet<String>,
    timeout: Duration,
) -> anyhow::Result<Exit> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut exit = Exit::OK;
    while !waiting.is_empty() {
        let next = tokio::time::timeout_at(deadline, consumer.next()).await;
        let Ok(Some(Ok(delivery))) = next else {
            eprintln!(
                "error: no result within {} for {} (is a worker running? `mailgate job <id>` \
                 says where a job is, and a worker's /readyz why it may not send)",
                humantime::format_duration(timeout),
                waiting
                    .iter()
                    .map(String::as_str)
                    .map(printable)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return Ok(Exit::FAILED);
        };
        delivery.ack(BasicAckOptions::default()).await?;
        let result: Value = serde_json::from_slice(&delivery.data).unwrap_or(Value::Null);
        if let Some(id) = result.get("id").and_then(Value::as_str) {
            waiting.remove(id);
        }
        let status = result.get("status").and_then(Value::as_str).unwrap_or("");
        exit = exit.max(status_exit(status));
        let text = super::letters::printable_json(&String::from_utf8_lossy(&delivery.data));
        writeln!(std::io::stdout().lock(), "{text}")?;
    }
    Ok(exit)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every status a result can carry has its exit status: mailed 0,
    /// rejected 3, any other answer 4 (1 is the tool's own failure).
    #[test]
    fn each_status_has_its_exit_status() {
        for (status, code) in [
            ("sent", 0),
            ("duplicate", 0),
            ("rejected", 3),
            ("suppressed", 4),
            ("invalid", 4),
            ("failed", 4),
            ("expired", 4),
            ("superseded", 4),
            // One a later worker may add: not mailed, as far as we know.
            ("postponed", 4),
        ] {
            assert_eq!(status_exit(status), Exit(code), "{status}");
        }
    }
}
