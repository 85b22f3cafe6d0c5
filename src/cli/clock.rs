//! `mailgate clock`: how far each Redis primary's clock is from this
//! host's, and the mark of a step that holds every worker back.

use anyhow::bail;

use super::limiter;
use crate::ledger::{Backend, Ledger};
use crate::settings::Settings;

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
