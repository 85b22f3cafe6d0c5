//! `mailgate results`: print what the results queue holds, looking (the
//! default) or taking, or follow it.

use std::io::{IsTerminal, Write};

use anyhow::{Context as _, bail};
use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions};
use lapin::types::FieldTable;

use super::amqp;
use super::letters::printable_json;
use crate::broker::Browse;
use crate::settings::Settings;

/// How `results` reads the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Print what is queued now (at most this many), and leave it there,
    /// in its order: the application still gets every result.
    Look(Option<u64>),
    /// Print what is queued now (at most this many), and take it.
    Take(Option<u64>),
    /// Print and take everything, new results included, until stopped.
    Follow,
}

/// Prints results as JSON lines, as `how` says, until `stop` completes
/// (for [`Reading::Follow`]) or what was queued is printed. Returns how
/// many were printed.
pub async fn results(
    settings: &Settings,
    queue: Option<&str>,
    how: Reading,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<u64> {
    let queue = queue.unwrap_or(&settings.amqp.results_queue).to_owned();
    let topology = crate::broker::Topology::new(settings);
    if topology.reserved(&queue) && queue != topology.results {
        bail!(
            "{queue:?} is one of mailgate's own queues, not a results queue: `mailgate dead` \
             looks at dead letters; the others hold jobs, which a look would hold back from \
             the workers"
        );
    }
    let (conn, channel) = amqp(settings).await?;
    let progress = std::io::stderr().is_terminal();
    let stdout = std::io::stdout();
    let mut n = 0u64;
    let mut print = |data: &[u8]| -> anyhow::Result<()> {
        writeln!(
            stdout.lock(),
            "{}",
            printable_json(&String::from_utf8_lossy(data))
        )?;
        n += 1;
        if progress {
            eprint!("\r{n} results from {queue}");
        }
        Ok(())
    };
    let unknown = || format!("reading {queue:?} (does the queue exist?)");
    let mut stop = std::pin::pin!(stop);
    let mut stopped = false;
    match how {
        Reading::Follow => follow(&channel, &queue, stop, &mut print).await?,
        Reading::Take(limit) => {
            let limit = limit.unwrap_or(u64::MAX);
            let mut taken = 0;
            while taken < limit {
                let got = tokio::select! {
                    biased;
                    () = &mut stop => {
                        stopped = true;
                        break;
                    }
                    got = channel.basic_get(queue.as_str().into(), BasicGetOptions::default()) => got,
                };
                let Some(m) = got.with_context(unknown)? else {
                    break;
                };
                print(&m.delivery.data)?;
                m.delivery.ack(BasicAckOptions::default()).await?;
                taken += 1;
            }
        }
        Reading::Look(limit) => {
            let mut browse = Browse::open(&conn, &queue).await.with_context(unknown)?;
            let looked = look(&mut browse, limit, &mut stop, &mut print).await;
            let unseen = browse.unseen();
            browse.close().await?;
            stopped = looked?;
            if unseen > 0 && !stopped {
                eprintln!(
                    "{unseen} results were held by another reader (the application, or \
                     another look) and were not looked at"
                );
            }
        }
    }
    if progress {
        eprintln!();
    }
    let _ = conn.close(200, "bye".into()).await;
    if stopped {
        bail!("interrupted after {n} results");
    }
    Ok(n)
}

/// Prints the first `limit` results of a look, and looks through the rest
/// (each is published again at the tail, so all must be, to keep their
/// order); whether `stop` ended it early.
async fn look(
    browse: &mut Browse,
    limit: Option<u64>,
    stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    print: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<bool> {
    let limit = limit.unwrap_or(u64::MAX);
    let mut seen = 0;
    loop {
        let next = tokio::select! {
            biased;
            () = &mut *stop => return Ok(true),
            next = browse.next() => next?,
        };
        let Some(d) = next else {
            return Ok(false);
        };
        if seen < limit {
            print(&d.data)?;
        }
        seen += 1;
        browse.keep(&d).await?;
    }
}

/// Prints, and takes, every result `queue` gets until `stop` completes.
async fn follow(
    channel: &lapin::Channel,
    queue: &str,
    mut stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    print: &mut impl FnMut(&[u8]) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut consumer = channel
        .basic_consume(
            queue.into(),
            "mailgate-results".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .with_context(|| format!("reading {queue:?} (does the queue exist?)"))?;
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            next = consumer.next() => match next {
                Some(Ok(d)) => {
                    print(&d.data)?;
                    d.ack(BasicAckOptions::default()).await?;
                }
                Some(Err(e)) => return Err(e).context("RabbitMQ connection lost"),
                None => return Ok(()),
            },
        }
    }
}
