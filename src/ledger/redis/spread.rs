//! The ledger's admissions and refunds with the keys spread over a Redis
//! Cluster's shards ([`RedisSettings::spreads_keys`]): each call names one
//! key, so an admission is a look at the job's record (with a judgement of
//! each scope), a reservation in each scope, and the record's creation; a
//! refund gives the reservations back. `ledger.lua`'s "look", "peek",
//! "reserve", "unreserve" and "create" document each step.
//!
//! [`RedisSettings::spreads_keys`]: crate::settings::RedisSettings::spreads_keys

use super::{Answer, Code, RedisLedger, admission_args, answered, shape_char, stopped, verdict};
use crate::ledger::{Admission, Entry, LedgerError, Verdict};
use crate::limiter::{Clock, Request, Scope, Subject};

/// What judging (or reserving in) every scope of a request came to (keys
/// spread over shards).
enum Reservations {
    /// Every scope has room (and holds the reservation): its scope, key
    /// and reservation time.
    Held(Vec<(Scope, String, u64)>),
    /// A scope rejected, and every reservation was given back: the largest
    /// wait, the first rule with it, and when its scope decided.
    Rejected(Admission),
}

impl RedisLedger {
    /// [`Ledger::admit`] with keys spread over a cluster's shards: look at
    /// the record and judge every scope at once; then reserve in every
    /// scope; then create the record with the reservations (`ledger.lua`'s
    /// "look", "peek", "reserve" and "create").
    pub(super) async fn admit_spread(
        &self,
        entry: &Entry<'_>,
        clock: Clock,
    ) -> Result<Admission, LedgerError> {
        let record = self.keys.record_key(entry.job.request.id);
        let scopes = self.keys.applicable(&entry.job.request);
        let args = admission_args("look", entry, String::new());
        let look = self
            .enqueue(Some(clock), args, vec![record.clone()], entry.send_now)
            .await?;
        let peeks = self.each_scope(clock, &scopes, None).await?;
        let look = answered(look).await?;
        if look.values[0] != Code::Absent as i64 {
            return self.decided(entry, &[], look).await;
        }
        if let Reservations::Rejected(rejection) = self.gather(&scopes, peeks, None).await? {
            return Ok(rejection);
        }
        // Unique per reservation: two copies of one job reserving in the same
        // millisecond hold two members, and the loser's give-back leaves the
        // winner's.
        let nonce = uuid::Uuid::new_v4().as_u128() as u32;
        let suffix = format!("{}:{nonce}", entry.job.request.id.as_str());
        // One scope after another: a request that loses the race for one
        // scope's room holds none in the scopes after it.
        let mut held = Vec::with_capacity(scopes.len());
        for scope in &scopes {
            let one = std::slice::from_ref(scope);
            let answer = self.each_scope(clock, one, Some(&suffix)).await?;
            let rejection = match self.gather(one, answer, Some(&suffix)).await {
                Ok(Reservations::Held(h)) => {
                    held.extend(h);
                    continue;
                }
                Ok(Reservations::Rejected(rejection)) => Ok(rejection),
                Err(e) => Err(e),
            };
            self.give_back(&suffix, &held).await;
            return rejection;
        }
        let time_in = |scope| {
            held.iter()
                .find(|(s, ..)| *s == scope)
                .map_or(-1, |(_, _, t)| i128::from(*t))
        };
        let reservations = format!("{nonce} {} {}", time_in(Scope::Email), time_in(Scope::Ip));
        let args = admission_args("create", entry, reservations);
        // A failed call may have created the record: its reservations stay.
        let created = self
            .submit(Some(clock), args, vec![record], entry.send_now)
            .await?;
        if created.values[0] != Code::Admitted as i64 {
            // Another copy of the job won the record meanwhile.
            self.give_back(&suffix, &held).await;
        }
        self.decided(entry, &[], created).await
    }

    /// Queues a "peek" (no `suffix`) or a "reserve" of `suffix` in each of
    /// `scopes`, all at once. A reservation is always acknowledged by the
    /// replicas (with `redis.min_replicas_acked`): the job's send mark, on
    /// another shard, cannot wait for it.
    async fn each_scope(
        &self,
        clock: Clock,
        scopes: &[(Scope, String, usize)],
        suffix: Option<&str>,
    ) -> Result<Vec<Answer>, LedgerError> {
        let wait = suffix.is_some();
        let mut answers = Vec::with_capacity(scopes.len());
        for (_, key, set) in scopes {
            let set = shape_char(*set).to_string();
            let args = match suffix {
                None => vec!["peek".into(), set],
                Some(suffix) => vec!["reserve".into(), suffix.into(), set],
            };
            answers.push(
                self.enqueue(Some(clock), args, vec![key.clone()], wait)
                    .await?,
            );
        }
        Ok(answers)
    }

    /// The answers of [`Self::each_scope`]: if a scope rejects, the first
    /// with the largest wait binds; if a scope rejects or a call fails, the
    /// reservations of `suffix` made are given back.
    async fn gather(
        &self,
        scopes: &[(Scope, String, usize)],
        answers: Vec<Answer>,
        suffix: Option<&str>,
    ) -> Result<Reservations, LedgerError> {
        let (mut held, mut rejected, mut failed) = (Vec::new(), None::<Admission>, None);
        for ((scope, key, set), answer) in scopes.iter().zip(answers) {
            let reply = match answered(answer).await {
                Ok(reply) => reply,
                // It may have reserved: that one stays counted.
                Err(e) => {
                    failed = Some(e);
                    continue;
                }
            };
            if reply.values[0] == 1 {
                held.push((
                    *scope,
                    key.clone(),
                    u64::try_from(reply.values[1]).unwrap_or(0),
                ));
                if let Some(acked) = reply.unreplicated {
                    failed = Some(self.unreplicated_reservation(acked));
                }
                continue;
            }
            let wait = |a: &Admission| match a.verdict {
                Verdict::Rejected { retry_after_ms, .. } => retry_after_ms,
                _ => 0,
            };
            match verdict(&self.keys, &[(*scope, *set)], &reply.values) {
                Some(verdict @ Verdict::Rejected { retry_after_ms, .. })
                    if rejected.as_ref().is_none_or(|r| retry_after_ms > wait(r)) =>
                {
                    rejected = Some(Admission {
                        decided_at_ms: reply.now_ms,
                        verdict,
                    });
                }
                Some(Verdict::Rejected { .. }) => {}
                _ => {
                    failed = Some(LedgerError::Protocol(format!(
                        "a scope answered {:?}",
                        reply.values
                    )));
                }
            }
        }
        if rejected.is_none() && failed.is_none() {
            return Ok(Reservations::Held(held));
        }
        if let Some(suffix) = suffix {
            self.give_back(suffix, &held).await;
        }
        match (rejected, failed) {
            (Some(rejection), _) => Ok(Reservations::Rejected(rejection)),
            (None, failed) => Err(failed.unwrap_or_else(stopped)),
        }
    }

    /// Gives back the reservations a refunded record named (`values`: the
    /// reply's code or flag, then t_email, t_ip and the nonce, -1 for none).
    /// Only spread over shards: elsewhere the script forgot the admission
    /// in the same call.
    pub(super) async fn give_back_refunded(&self, request: &Request<'_>, values: &[i64; 4]) {
        let [_, email, ip, nonce] = *values;
        if !self.spread || nonce < 0 {
            return;
        }
        let subjects = [
            (Some(Subject::Email(request.email)), email),
            (request.ip.map(Subject::Ip), ip),
        ];
        let held: Vec<(Scope, String, u64)> = subjects
            .into_iter()
            .filter_map(|(subject, t)| {
                let subject = subject?;
                Some((
                    subject.scope(),
                    self.keys.key_of(subject),
                    u64::try_from(t).ok()?,
                ))
            })
            .collect();
        let suffix = format!("{}:{nonce}", request.id.as_str());
        self.give_back(&suffix, &held).await;
    }

    /// Gives back the reservations `held` (scope, key, time) of `suffix`.
    /// One that cannot be given back now (Redis away) stays counted until
    /// its window passes: a rejection too many, never an admission too many.
    async fn give_back(&self, suffix: &str, held: &[(Scope, String, u64)]) {
        let mut answers = Vec::with_capacity(held.len());
        for (_, key, t) in held {
            let args = vec!["unreserve".into(), t.to_string(), suffix.to_owned()];
            answers.push(self.enqueue(None, args, vec![key.clone()], false).await);
        }
        for answer in answers {
            let done = match answer {
                Ok(answer) => answered(answer).await,
                Err(e) => Err(e),
            };
            if let Err(e) = done {
                tracing::warn!(error = %e, "could not give a reservation back; it counts until its window passes");
            }
        }
    }

    /// A reservation too few replicas acknowledged: a failover could lose it
    /// and admit past a rule, so it is given back, and the job retried.
    fn unreplicated_reservation(&self, acked: i64) -> LedgerError {
        LedgerError::Unreplicated(format!(
            "{acked} of the {} Redis replicas redis.min_replicas_acked asks for acknowledged \
             a reservation within {} ms; it was given back, and the job is not sent now",
            self.replication.replicas, self.replication.timeout_ms
        ))
    }
}
