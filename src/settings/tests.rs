//! The checks of whole settings: sections checked through
//! [`Settings::validate`], and the rules that cross them.

use std::time::Duration;

use super::*;

/// `config/default.toml`, without environment overrides.
fn shipped() -> Settings {
    config::Config::builder()
        .add_source(config::File::from(std::path::Path::new(
            "config/default.toml",
        )))
        .build()
        .and_then(|c| c.try_deserialize())
        .expect("the shipped config")
}

#[test]
fn a_list_of_urls_is_split_at_each_next_url_and_redacted_url_by_url() {
    let amqp = |url: &str| AmqpSettings {
        url: url.into(),
        ..shipped().amqp
    };
    let list = "amqp://u:p1@n1:5672/%2f, amqp://u:p,2@n2:5673/%2f,amqps://n3/v";
    assert_eq!(
        amqp(list).urls(),
        [
            "amqp://u:p1@n1:5672/%2f",
            "amqp://u:p,2@n2:5673/%2f",
            "amqps://n3/v"
        ]
    );
    assert_eq!(
        redact_url(list),
        "amqp://u:***@n1:5672/%2f,amqp://u:***@n2:5673/%2f,amqps://n3/v"
    );
    assert_eq!(amqp("amqp://n1/%2f").urls(), ["amqp://n1/%2f"]);
    // A comma not followed by a URL stays: one URL, which does not parse.
    assert_eq!(amqp("amqp://n1,n2/%2f").urls(), ["amqp://n1,n2/%2f"]);
    let mut s = shipped();
    s.amqp.url = "amqp://u:SEKRET@n1/%2f,amqp://u:SEKRET@n2:x/%2f".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("amqp.url") && !e.contains("SEKRET"), "{e}");
    s.amqp.url = list.replace("amqps://", "amqp://").into();
    s.validate().expect("a list of nodes");
    // Both schemes: a reset of the TLS node would move the worker onto
    // an unencrypted one.
    s.amqp.url = list.into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("amqps:// and amqp://"), "{e}");
}

#[test]
fn a_url_without_a_scheme_is_hidden_whole_and_so_is_its_parse_error() {
    let mut s = shipped();
    s.amqp.url = "guest:SEKRET@127.0.0.1:5672".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("amqp.url") && !e.contains("SEKRET"), "{e}");
}

#[test]
fn a_password_that_breaks_its_url_is_refused_without_showing_it() {
    let mut s = shipped();
    s.smtp.url = "smtp://user:8462/Qr7sLm2@127.0.0.1:2525".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("smtp.url") && e.contains("percent-encode"),
        "{e}"
    );
    assert!(!e.contains("Qr7sLm2") && !e.contains("8462"), "{e}");
    s.smtp.url = "smtp://user:8462%2FQr7sLm2@127.0.0.1:2525".into();
    s.validate().expect("percent-encoded");
}

#[test]
fn a_bad_redis_url_is_refused_without_its_password() {
    let mut s = shipped();
    s.redis.url = "redis+sentinel://:Xk9p7sLm2@s1:x/m".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("redis.url") && e.contains("no valid port"),
        "{e}"
    );
    assert!(!e.contains("Xk9p7sLm2"), "{e}");
}

#[test]
fn a_cluster_keys_prefix_chooses_one_slot_or_every_shard() {
    let mut s = shipped();
    s.redis.url = "redis+cluster://n1:7000,n2:7001".into();
    for tagged in ["{mailgate}:", "mg:{a}:"] {
        s.redis.key_prefix = tagged.into();
        s.validate().expect(tagged);
        assert!(
            !s.redis.spreads_keys(),
            "{tagged} keeps every key in one slot"
        );
    }
    for untagged in ["mailgate:", "mg:{}:", "mg:{:", "mg:}{"] {
        s.redis.key_prefix = untagged.into();
        s.validate().expect(untagged);
        assert!(s.redis.spreads_keys(), "{untagged} spreads the keys");
    }
    s.redis.url = "redis://n1:7000".into();
    assert!(
        !s.redis.spreads_keys(),
        "one server has nothing to spread over"
    );
    s.redis.url = "redis+cluster://n1:7000,n2:7001".into();
    s.redis.min_replicas_acked = 1;
    s.validate()
        .expect("a cluster's primaries have replicas too");
    // Superseding judges a job and its newer one in one call: one slot.
    s.limits.purpose.insert(
        "login".into(),
        PurposeLimits {
            supersede: Some(true),
            ..PurposeLimits::default()
        },
    );
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("limits.supersede") && e.contains("hash tag"),
        "{e}"
    );
    s.redis.key_prefix = "{mailgate}:".into();
    s.validate().expect("one slot supersedes");
}

#[test]
fn waiting_for_replicas_needs_replicas_and_room_in_the_lease() {
    let mut s = shipped();
    s.redis.min_replicas_acked = 1;
    s.validate().expect("30s lease, 10s SMTP, 1s WAIT");
    s.redis.replica_ack_timeout = Duration::from_secs(16);
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("redis.replica_ack_timeout") && e.contains("send_lease"),
        "{e}"
    );
    s.redis.replica_ack_timeout = Duration::from_secs(1);
    s.redis.url = "memory://".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("min_replicas_acked"), "{e}");
}

/// A shutdown that cannot wait for a send under way says so: 1 s against
/// the shipped 10 s is warned of, not passed as "settings: ok".
#[test]
fn a_shutdown_shorter_than_a_send_is_warned_of() {
    let mut s = shipped();
    assert!(s.warnings().is_empty(), "{:?}", s.warnings());
    s.worker.shutdown_timeout = Duration::from_secs(1);
    let w = s.warnings();
    assert!(
        w.len() == 1 && w[0].contains("worker.shutdown_timeout (1s)") && w[0].contains("12s"),
        "{w:?}"
    );
}

/// Replicas that can be promoted without waiting for them: a failover can
/// mail a job twice, so check-config says so (issue 41).
#[test]
fn promotable_replicas_without_waiting_are_warned_of() {
    let mut s = shipped();
    for url in ["redis+sentinel://s1:26379/mg", "redis+cluster://n1:6379"] {
        s.redis.url = url.into();
        s.redis.min_replicas_acked = 0;
        let w = s.warnings();
        assert!(
            w.len() == 1 && w[0].contains("min_replicas_acked is 0"),
            "{url}: {w:?}"
        );
        s.redis.min_replicas_acked = 1;
        assert!(s.warnings().is_empty(), "{url}: {:?}", s.warnings());
    }
}

#[test]
fn timeouts_are_bounded() {
    for (set, key) in [
        (
            (|s: &mut Settings, d| s.worker.shutdown_timeout = d) as fn(&mut Settings, Duration),
            "worker.shutdown_timeout",
        ),
        (|s, d| s.amqp.timeout = d, "amqp.timeout"),
        (|s, d| s.smtp.timeout = d, "smtp.timeout"),
        (
            |s, d| s.redis.replica_ack_timeout = d,
            "redis.replica_ack_timeout",
        ),
        (|s, d| s.redis.max_clock_skew = d, "redis.max_clock_skew"),
    ] {
        let mut s = shipped();
        set(&mut s, Duration::from_secs(u64::MAX / 4));
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains(key) && e.contains("must be"), "{e}");
        let mut s = shipped();
        set(&mut s, Duration::ZERO);
        assert!(s.validate().unwrap_err().to_string().contains(key));
    }
}

#[test]
fn dedup_for_must_outlast_a_job_being_retried() {
    let mut s = shipped();
    s.validate().expect("the shipped config is valid");
    // 5 attempts: waits of at most 2 × (1 + 2 + 4 + 8) s, plus a 30 s lease.
    assert_eq!(s.retry.horizon(), Duration::from_secs(30));
    s.limits.dedup_for = Duration::from_secs(59);
    let err = s
        .validate()
        .expect_err("shorter than the lease plus the retries");
    assert!(err.to_string().contains("limits.dedup_for"), "{err}");
    s.limits.dedup_for = Duration::from_secs(60);
    s.validate().expect("exactly enough");
}

#[test]
fn queue_names_that_would_crash_or_loop_are_refused() {
    let refused = |tweak: &dyn Fn(&mut Settings), says: &str| {
        let mut s = shipped();
        tweak(&mut s);
        let err = s.validate().expect_err(says).to_string();
        assert!(err.contains(says), "{err}");
    };
    refused(
        &|s| s.amqp.jobs_queue = "j".repeat(249),
        "amqp.jobs_queue is 249 bytes",
    );
    refused(&|s| s.amqp.jobs_queue = "amq.jobs".into(), "reserved");
    refused(&|s| s.amqp.results_queue = "r".repeat(256), "at most 255");
    refused(
        &|s| s.retry.max_attempts = 1_000_000,
        "retry.max_attempts is 1000000",
    );
    refused(
        &|s| s.amqp.results_queue = s.amqp.jobs_queue.clone(),
        "amqp.results_queue",
    );
    refused(
        &|s| s.amqp.results_queue = format!("{}.retry.2", s.amqp.jobs_queue),
        "amqp.results_queue",
    );
    refused(
        &|s| s.amqp.results_queue = format!("{}.wait", s.amqp.jobs_queue),
        "amqp.results_queue",
    );
    refused(
        &|s| s.amqp.results_queue = format!("{}.wait.250", s.amqp.jobs_queue),
        "amqp.results_queue",
    );
    // The lease decides the longest wait queue's name.
    refused(
        &|s| {
            s.amqp.jobs_queue = "j".repeat(244);
            s.limits.send_lease = Duration::from_secs(3600);
            s.limits.dedup_for = Duration::from_secs(86_400);
        },
        "j.wait.4096000",
    );
    let mut s = shipped();
    s.amqp.jobs_queue = "j".repeat(240);
    s.validate().expect("240 bytes leave room for '.retry.4'");
}

/// A jobs or results queue named like another deployment's lane would be
/// taken for one by that deployment's `admin purge`.
#[test]
fn queue_names_like_another_deployments_lanes_are_refused() {
    for name in [
        "x.jobs.dead",
        "x.jobs.redelivered",
        "x.jobs.wait",
        "x.jobs.wait.250",
        "x.jobs.retry.5",
    ] {
        for results in [false, true] {
            let mut s = shipped();
            match results {
                true => s.amqp.results_queue = name.into(),
                false => s.amqp.jobs_queue = name.into(),
            }
            let err = s.validate().expect_err(name).to_string();
            assert!(err.contains("is named like"), "{err}");
        }
    }
    for fine in [
        "x.jobs",
        "x.jobs.retry",
        "x.waiting",
        "dead",
        ".wait",
        "x.retry.x",
        "x.wait.2a",
    ] {
        let mut s = shipped();
        s.amqp.jobs_queue = fine.into();
        s.validate().unwrap_or_else(|e| panic!("{fine}: {e}"));
    }
}

#[test]
fn an_ipv6_amqp_host_is_refused_not_read_as_localhost() {
    let mut s = Settings::load(std::path::Path::new("config/default.toml")).unwrap();
    s.amqp.url = "amqp://u:SEKRET@[2001:db8::7]:5673/%2f".into();
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("IPv6") && !e.contains("SEKRET"), "{e}");
    s.amqp.url = "amqp://u:p@rabbit.internal:5673/%2f".into();
    s.validate().unwrap();
}

/// `redis.record_form` is gone (every record is a string since
/// 2026-12-03): a config that still sets it is refused at load, naming the
/// key, rather than run with a setting it thinks it has.
#[test]
fn a_config_that_sets_the_record_form_is_refused_naming_it() {
    let err = config::Config::builder()
        .add_source(config::File::from(std::path::Path::new(
            "config/default.toml",
        )))
        .set_override("redis.record_form", "hash")
        .and_then(|b| b.build())
        .and_then(|c| c.try_deserialize::<Settings>())
        .expect_err("no such key any more")
        .to_string();
    assert!(err.contains("record_form"), "{err}");
}
