//! How the relays drive their circuits: each send's or check's outcome
//! is recorded ([`Relays::record`]), whether some relay takes mail is
//! published to waiters and to `mailgate_smtp_relay_up`, and an open
//! circuit is probed after each cool-down until a probe closes it.

use std::time::Duration;

use tokio::time::Instant;

use super::circuit::{Change, State};
use super::{Relays, lock};
use crate::mailer::pool::Failure;
use crate::telemetry;

impl Relays {
    /// A send or check on relay `i` worked.
    pub(super) fn worked(&self, i: usize) {
        let relay = &self.list[i];
        let mut s = lock(&relay.status);
        s.circuit.success();
        if s.health.is_err() {
            tracing::info!(relay = %relay.name, "the SMTP relay works again");
            s.health = Ok(());
        }
        drop(s);
        self.publish();
    }

    /// Records a failed send or check on relay `i`: a relay-level failure
    /// counts against its circuit (and may open it); any other shows the
    /// session worked.
    pub(super) fn record(&self, i: usize, failure: &Failure) {
        if !failure.relay_fault {
            return self.worked(i);
        }
        let relay = &self.list[i];
        let why = failure.error.to_string();
        telemetry::smtp_relay_failed(&relay.name);
        let mut s = lock(&relay.status);
        if s.health.is_ok() {
            tracing::warn!(
                relay = %relay.name,
                error = %crate::redact::mask_emails(&why),
                "the SMTP relay is failing"
            );
        }
        s.health = Err(why.clone());
        let change = s.circuit.failure(Instant::now());
        let state = s.circuit.state();
        drop(s);
        if change == Some(Change::Opened) {
            tracing::warn!(
                relay = %relay.name,
                failures = self.threshold(i),
                cool_down = ?self.cool_down(i),
                error = %crate::redact::mask_emails(&why),
                "the SMTP relay's circuit opens: no mail goes to it until a probe succeeds"
            );
            telemetry::smtp_relay_circuit(&relay.name, state.gauge());
            relay.pool.clear_idle();
            self.spawn_probe(i);
        }
        self.publish();
    }

    fn threshold(&self, i: usize) -> u32 {
        lock(&self.list[i].status).circuit.threshold()
    }

    fn cool_down(&self, i: usize) -> Duration {
        lock(&self.list[i].status).circuit.cool_down()
    }

    /// Updates whether some relay takes mail, and `mailgate_smtp_relay_up`.
    fn publish(&self) {
        let (mut open, mut up) = (false, false);
        for r in &self.list {
            let s = lock(&r.status);
            open |= s.circuit.takes_mail();
            up |= s.circuit.takes_mail() && s.health.is_ok();
        }
        telemetry::smtp_relay_up(up);
        self.available.send_if_modified(|was| {
            if *was == open {
                return false;
            }
            if open {
                tracing::info!("an SMTP relay takes mail again");
            } else {
                tracing::warn!(
                    relays = %crate::redact::mask_emails(&self.states()),
                    "every SMTP relay's circuit is open: no job is taken until a probe succeeds"
                );
            }
            *was = open;
            true
        });
    }

    /// Runs relay `i`'s probes until one succeeds: after each cool-down,
    /// half-open, a session and NOOP on a slot of the pool, then closed or
    /// open again. Ends with the mailer.
    fn spawn_probe(&self, i: usize) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.this.clone();
        runtime.spawn(async move {
            loop {
                let at = {
                    let Some(relays) = this.upgrade() else { return };
                    let Some(at) = lock(&relays.list[i].status).circuit.probe_at() else {
                        return;
                    };
                    at
                };
                tokio::time::sleep_until(at).await;
                let Some(relays) = this.upgrade() else { return };
                if relays.probe(i).await {
                    return;
                }
            }
        });
    }

    /// One probe of relay `i`; whether it closed the circuit.
    async fn probe(&self, i: usize) -> bool {
        let relay = &self.list[i];
        let started = lock(&relay.status).circuit.start_probe(Instant::now());
        if started.is_none() {
            return false;
        }
        tracing::info!(relay = %relay.name, "the SMTP relay's circuit is half-open: probing it");
        telemetry::smtp_relay_circuit(&relay.name, State::HalfOpen.gauge());
        let result = {
            // The semaphore is never closed.
            let _slot = self.slots.acquire().await;
            relay.pool.check(Instant::now() + self.timeout).await
        };
        let mut s = lock(&relay.status);
        let change = s.circuit.probe_done(result.is_ok(), Instant::now());
        let state = s.circuit.state();
        match &result {
            Ok(()) => s.health = Ok(()),
            Err(f) => s.health = Err(f.error.to_string()),
        }
        drop(s);
        telemetry::smtp_relay_circuit(&relay.name, state.gauge());
        match (&result, change) {
            (Ok(()), _) => tracing::info!(
                relay = %relay.name,
                "the SMTP relay's probe succeeded: its circuit closes and it takes mail again"
            ),
            (Err(f), _) => {
                telemetry::smtp_relay_failed(&relay.name);
                tracing::warn!(
                    relay = %relay.name,
                    cool_down = ?self.cool_down(i),
                    error = %crate::redact::mask_emails(&f.error.to_string()),
                    "the SMTP relay's probe failed: its circuit opens again"
                );
            }
        }
        self.publish();
        state == State::Closed
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lettre::address::Envelope;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::mailer::MailError;
    use crate::mailer::pool::SmtpPool;

    /// A minimal SMTP server for probes: greeting, EHLO, NOOP, QUIT.
    async fn serve_probes(listener: tokio::net::TcpListener) {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write.write_all(b"220 probe.test\r\n").await;
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply: &[u8] = match line.get(..4).map(str::to_ascii_uppercase).as_deref() {
                        Some("EHLO") => b"250 probe.test\r\n",
                        Some("NOOP") | Some("MAIL") | Some("RSET") => b"250 ok\r\n",
                        Some("QUIT") => b"221 bye\r\n",
                        _ => b"502 no\r\n",
                    };
                    let _ = write.write_all(reply).await;
                }
            });
        }
    }

    #[tokio::test]
    async fn a_probe_closes_the_circuit_and_wakes_the_waiters() {
        // A relay that refuses connections (a port nobody listens on yet).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let endpoint =
            crate::mailer::smtp::test_endpoint(&format!("smtp://127.0.0.1:{port}?tls=none"));
        let settings = crate::settings::CircuitSettings {
            failures: 2,
            cool_down: Duration::from_millis(300),
        };
        let relays = Relays::new(
            vec![(
                "a".into(),
                SmtpPool::new(endpoint, "probe@example.com".parse().unwrap()),
            )],
            &settings,
            Duration::from_secs(1),
            Arc::new(Semaphore::new(1)),
            None,
        );
        let soon = || Instant::now() + Duration::from_secs(1);
        assert!(relays.available());
        assert!(relays.check(soon()).await.is_err());
        assert!(relays.available(), "one failure of two");
        assert!(relays.check(soon()).await.is_err());
        assert!(!relays.available());
        let e = relays.health().unwrap_err();
        assert!(
            e.contains("circuit open") && e.contains("connecting to"),
            "{e}"
        );
        // A send now tries no relay.
        let envelope = Envelope::new(
            Some("a@example.com".parse().unwrap()),
            vec!["b@example.com".parse().unwrap()],
        )
        .unwrap();
        let sent = relays.send(&envelope, b"x", soon()).await;
        assert!(
            matches!(&sent, Err(MailError::Relay(t)) if t.contains("no SMTP relay takes mail")),
            "{sent:?}"
        );
        let waiter = {
            let r = relays.clone();
            tokio::spawn(async move { r.until_available().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(relays.waiting(), 1);
        // The first probe (after 300 ms) still finds the port shut.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!relays.available());
        assert!(!waiter.is_finished());
        // The relay comes back: the next probe closes the circuit.
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        tokio::spawn(serve_probes(listener));
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("the probe closes the circuit within two cool-downs")
            .unwrap();
        assert!(relays.available());
        assert_eq!(relays.health(), Ok(()));
        assert_eq!(relays.waiting(), 0);
    }
}
