//! `mailgate results`: print what the results queue holds, or follow it.

use std::io::{IsTerminal, Write};

use anyhow::Context as _;
use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions};
use lapin::types::FieldTable;

use super::amqp;
use crate::settings::Settings;

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
