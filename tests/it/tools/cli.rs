//! The `mailgate` binary's commands against the real services.

use crate::common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::harness::Harness;
use crate::common::*;
use mailgate::domain::Ticket;
use mailgate::ledger::{RedisLedger, Verdict};
use mailgate::limiter::Clock;
use mailgate::settings::LimitSettings;
use serde_json::{Value, json};

/// The binary, with the environment pointed at `h`'s queues and keys.
fn mailgate(h: &Harness, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mailgate"));
    c.args(args)
        .env("MAILGATE__AMQP__JOBS_QUEUE", &h.settings.amqp.jobs_queue)
        .env(
            "MAILGATE__AMQP__RESULTS_QUEUE",
            &h.settings.amqp.results_queue,
        )
        .env("MAILGATE__REDIS__KEY_PREFIX", &h.settings.redis.key_prefix)
        .env("MAILGATE__REDIS__URL", h.settings.redis.url.as_str())
        .env("MAILGATE__AMQP__URL", h.settings.amqp.url.as_str())
        .env("MAILGATE__SMTP__URL", h.settings.smtp.url.as_str())
        .env("MAILGATE__HTTP__LISTEN", "127.0.0.1:0")
        .env_remove("RUST_LOG");
    c
}

fn run(mut c: Command) -> Output {
    c.stdin(Stdio::null()).output().expect("the binary runs")
}

/// [`run`] off the async runtime's threads.
async fn run_async(c: Command) -> Output {
    tokio::task::spawn_blocking(move || run(c))
        .await
        .expect("the runner did not panic")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_wait_prints_the_sent_result() {
    let h = Harness::new("cli-publish").await;
    let w = h.start_worker().await;
    let out = run_async(mailgate(
        &h,
        &[
            "publish",
            "--wait",
            "--email",
            "newbie@example.com",
            "--var",
            "app_name=Acme",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON result line");
    assert_eq!(r["status"], "sent", "{r}");
    assert_eq!(r["email"], "newbie@example.com");
    assert_eq!(h.sink.mails_to("newbie@example.com").len(), 1);
    // Again at once: rejected by the mailbox's limit, and the exit status
    // says so (3), so a script can tell (issue 42: it exited 0).
    let out = run_async(mailgate(
        &h,
        &["publish", "--wait", "--email", "newbie@example.com"],
    ))
    .await;
    let r: Value = serde_json::from_slice(&out.stdout).expect("one JSON result line");
    assert_eq!(r["status"], "rejected", "{r}");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    // Without --wait it prints the ids; JSON lines from stdin work too.
    let mut c = mailgate(&h, &["publish", "--file", "-"]);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(
            stdin,
            r#"{{"id":"line-1","email":"one@example.com","code":"111111"}}"#
        )
        .unwrap();
        writeln!(stdin).unwrap();
        writeln!(
            stdin,
            r#"{{"id":"line-2","email":"two@example.com","code":"222222"}}"#
        )
        .unwrap();
    }
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "line-1\nline-2\n");
    let results = h.results(2).await;
    assert!(results.values().all(|r| r["status"] == "sent"));

    // `results` prints what is queued as JSON lines.
    h.publish(&serde_json::json!({"id": "for-results", "email": "three@example.com", "code": "3"}))
        .await;
    h.sink.wait_for(4, Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let out = run_async(mailgate(&h, &["results"])).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["id"], "for-results");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_matches_the_limiter_and_reset_says_what_it_removed() {
    let h = Harness::new("cli-limits").await;
    let ledger = RedisLedger::connect(&h.settings.redis, &LimitSettings::default())
        .await
        .unwrap();
    let job = |n: &str| TestJob::new(n, "victim@example.com", None);
    let first = job("l1")
        .admission(&ledger, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(first.verdict, Verdict::Admitted);

    let out = run_async(mailgate(
        &h,
        &[
            "limits",
            "show",
            "--email",
            "Victim+x@Example.com",
            "--json",
        ],
    ))
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    // What the limiter decides right after agrees with what was shown.
    let second = job("l2")
        .admission(&ledger, &Ticket::new(), Clock::Server)
        .await;
    let Verdict::Rejected {
        retry_after_ms,
        rule,
    } = second.verdict
    else {
        panic!("expected a rejection, got {:?}", second.verdict);
    };
    let shown_retry = shown["retry_after_ms"].as_u64().unwrap();
    let elapsed = second.decided_at_ms - shown["at_ms"].as_u64().unwrap();
    assert_eq!(
        shown_retry,
        retry_after_ms + elapsed,
        "shown {shown} vs decided {retry_after_ms}"
    );
    assert_eq!(shown["rules"][0]["count"], 1);
    assert_eq!(shown["rules"][0]["window_ms"], rule.window_ms);
    assert_eq!(shown["rules"][0]["retry_after_ms"], shown_retry);
    assert_eq!(shown["rules"][1]["count"], 1);
    assert_eq!(shown["rules"][1]["retry_after_ms"], 0);

    // The human form says the same.
    let out = run(mailgate(
        &h,
        &["limits", "show", "--email", "victim@example.com"],
    ));
    let human = text(&out.stdout);
    assert!(
        human.contains("1 per 1m: 1 used, full for") && human.contains("next send: in"),
        "{human}"
    );

    // A reset says why, or is refused; it leaves a trace that limits show
    // and limits resets read.
    let out = run(mailgate(
        &h,
        &["limits", "reset", "--email", "victim@example.com"],
    ));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--reason"),
        "{}",
        text(&out.stderr)
    );
    let out = run(mailgate(
        &h,
        &[
            "limits",
            "reset",
            "--email",
            "victim@example.com",
            "--reason",
            "ticket 4711",
        ],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("removed 1 admission(s) from "),
        "{}",
        text(&out.stdout)
    );
    let shown = text(
        &run(mailgate(
            &h,
            &["limits", "show", "--email", "victim@example.com"],
        ))
        .stdout,
    );
    assert!(
        shown.contains("1 admission(s) removed from") && shown.contains(": ticket 4711"),
        "{shown}"
    );
    let out = run(mailgate(&h, &["limits", "resets", "--json"]));
    let note: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(
        (note["reason"].as_str(), note["removed"].as_u64()),
        (Some("ticket 4711"), Some(1))
    );
    let third = job("l3")
        .admission(&ledger, &Ticket::new(), Clock::Server)
        .await;
    assert_eq!(
        third.verdict,
        Verdict::Admitted,
        "the reset gave the quota back"
    );

    let out = run(mailgate(&h, &["limits", "show", "--ip", "1.2.3"]));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).starts_with("error: --ip: ip is not an IPv4 or IPv6 address"),
        "{}",
        text(&out.stderr)
    );
}

/// `--domain` shows and resets a registrable domain's log, however the
/// domain is spelled, and says when the domain scope exempts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_show_and_reset_a_domain() {
    let h = Harness::with("cli-domain", |s| {
        s.limits.domain = mailgate::settings::DomainRules {
            rules: rules(&[(10 * MIN, 50)]).rules,
            exempt: vec![mailgate::domain::RegistrableDomain::parse_exact("gmail.com").unwrap()],
            ..Default::default()
        };
    })
    .await;
    let ledger = RedisLedger::connect(&h.settings.redis, &h.settings.limits)
        .await
        .unwrap();
    let froms = [None, Some("198.51.100.7")];
    for (n, mail) in ["a@mx.farm.example", "b@farm.example"].iter().enumerate() {
        let d = TestJob::new(&format!("d{n}"), mail, froms[n])
            .admission(&ledger, &Ticket::new(), Clock::Server)
            .await;
        assert_eq!(d.verdict, Verdict::Admitted);
    }
    // One client network's share of it (a fifth of 50), and the hint.
    let out = run(mailgate(
        &h,
        &[
            "limits",
            "show",
            "--domain",
            "farm.example",
            "--ip",
            "198.51.100.9",
        ],
    ));
    let shown = text(&out.stdout);
    assert!(
        shown.contains("domain:farm.example:net:198.51.100.0/24"),
        "{shown}"
    );
    assert!(shown.contains("10 per 10m: 1 used"), "{shown}");
    let out = run(mailgate(
        &h,
        &["limits", "show", "--domain", "farm.example"],
    ));
    assert!(
        text(&out.stdout).contains("each client network may use only 0.2 of this"),
        "{}",
        text(&out.stdout)
    );
    let out = run(mailgate(
        &h,
        &[
            "limits",
            "reset",
            "--domain",
            "farm.example",
            "--ip",
            "198.51.100.9",
            "--reason",
            "test",
        ],
    ));
    assert!(
        text(&out.stdout).starts_with("removed 1 admission(s) from "),
        "{}",
        text(&out.stdout)
    );
    // An onboarding day's override says what each network may use of it.
    let add = [
        "overrides",
        "add",
        "domain:farm.example",
        "--rule",
        "10m=100",
        "--reason",
        "onboarding",
        "--expires-in",
        "1h",
    ];
    let out = run(mailgate(&h, &add));
    assert!(
        text(&out.stdout)
            .contains("each client network (an IPv4 /24, an IPv6 /48) may use 20 per 10m"),
        "{}",
        text(&out.stdout)
    );
    let out = run(mailgate(
        &h,
        &["overrides", "remove", "domain:farm.example"],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(mailgate(
        &h,
        &["limits", "show", "--domain", "Mail.Farm.example", "--json"],
    ));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        shown["key"]
            .as_str()
            .unwrap()
            .ends_with("domain:farm.example"),
        "{shown}"
    );
    assert_eq!(
        (
            &shown["rules"][0]["scope"],
            &shown["rules"][0]["count"],
            &shown["exempt"]
        ),
        (&json!("domain"), &json!(2), &json!(false))
    );
    let out = run(mailgate(&h, &["limits", "show", "--domain", "gmail.com"]));
    assert!(
        text(&out.stdout).contains("exempt (limits.domain.exempt)"),
        "{}",
        text(&out.stdout)
    );
    let out = run(mailgate(
        &h,
        &[
            "limits",
            "reset",
            "--domain",
            "farm.example",
            "--reason",
            "test",
        ],
    ));
    assert!(
        text(&out.stdout).starts_with("removed 2 admission(s) from "),
        "{}",
        text(&out.stdout)
    );
    let out = run(mailgate(
        &h,
        &["limits", "show", "--domain", "not a domain"],
    ));
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).starts_with("error: --domain: not a valid domain"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_explains_what_is_wrong() {
    let h = Harness::new("cli-check").await;
    let out = run(mailgate(&h, &["check-config"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("templates: ok, 4 sets"),
        "{}",
        text(&out.stdout)
    );

    let out = run(mailgate(&h, &["check-config", "--connect"]));
    let report = text(&out.stdout);
    assert!(out.status.success(), "{report}{}", text(&out.stderr));
    for line in ["rabbitmq: ok", "redis: ok", "smtp: ok"] {
        assert!(report.contains(line), "{report}");
    }

    // An unknown key, in the environment or the file.
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE__SMTP__PASWORD", "x");
    let out = run(c);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.starts_with("error: from MAILGATE__SMTP__PASWORD (an environment variable")
            && err.contains("unknown field `pasword`"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // A bad value is blamed on the variable that set it, and a URL with no
    // password shows its host.
    for (var, value, says) in [
        ("MAILGATE__AMPQ__URL", "amqp://x", "unknown field `ampq`"),
        (
            "MAILGATE__LIMITS__EMAIL__RULES",
            "[{ window = \"60s\", max = 3 }]",
            "a list (rules, exempt, relays) cannot be set from the environment",
        ),
        (
            "MAILGATE__LIMITS__DEDUP_FOR",
            "banana",
            "bad duration \"banana\"",
        ),
        (
            "MAILGATE__SMTP__URL",
            "smtp://relay.example:25x",
            "smtp://relay.example:***",
        ),
    ] {
        let mut c = mailgate(&h, &["check-config"]);
        c.env(var, value);
        let out = run(c);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{var}");
        assert!(err.starts_with(&format!("error: from {var}")), "{err}");
        assert!(err.contains(says), "{err}");
    }
    // A refused login is not "cannot reach", and is one line (when the
    // test broker's URL has the password to spoil).
    let url = h.settings.amqp.url.as_str();
    let wrong = url.replacen("guest:guest@", "guest:wrong@", 1);
    if wrong != url {
        let mut c = mailgate(&h, &["results"]);
        c.env("MAILGATE__AMQP__URL", wrong);
        let err = text(&run(c).stderr);
        assert!(err.contains("refused the login"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    }

    // A variable with one underscore after MAILGATE is not read: said.
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE_AMQP__URL", "amqp://x");
    let said = text(&run(c).stdout);
    assert!(
        said.contains("warning: MAILGATE_AMQP__URL is not read"),
        "{said}"
    );

    // A misspelt purpose's rules would never apply: refused, by name, with
    // the purposes there are; so is asking for its limits.
    let typo = std::env::temp_dir().join(format!("mailgate-cli-typo-{}.toml", std::process::id()));
    let shipped = std::fs::read_to_string("config/default.toml").unwrap();
    let misspelt = shipped.replace(
        "[limits.purpose.reset_password.email]",
        "[limits.purpose.resetpassword.email]",
    );
    assert_ne!(misspelt, shipped);
    std::fs::write(&typo, misspelt).unwrap();
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE_CONFIG", &typo);
    let out = run(c);
    let _ = std::fs::remove_file(&typo);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        err.contains("limits.purpose.resetpassword") && err.contains("reset_password, verify"),
        "{err}"
    );
    assert!(!text(&out.stdout).contains("settings: ok"), "not ok first");
    for args in [
        &[
            "limits",
            "show",
            "--email",
            "a@example.com",
            "--purpose",
            "resetpassword",
        ][..],
        &[
            "explain",
            "--email",
            "a@example.com",
            "--purpose",
            "resetpassword",
        ],
    ] {
        let out = run(mailgate(&h, args));
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("unknown purpose \"resetpassword\""), "{err}");
    }
    // smtp.from is checked before the settings are said to be ok, with
    // what it should look like.
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE__SMTP__FROM", "Acme no-reply");
    let out = run(c);
    assert!(!out.status.success() && !text(&out.stdout).contains("settings: ok"));
    assert!(
        text(&out.stderr).contains("Acme <no-reply@acme.example>"),
        "{}",
        text(&out.stderr)
    );

    // Run from another folder, the templates are not found, and the error
    // says where it looked and relative to what.
    let config = std::path::absolute("config/default.toml").unwrap();
    let mut c = mailgate(&h, &["check-config"]);
    c.current_dir(std::env::temp_dir())
        .env("MAILGATE_CONFIG", config);
    let out = run(c);
    let err = text(&out.stderr);
    let looked = std::env::temp_dir().join("templates");
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("{} (templates.dir", looked.display())),
        "{err}"
    );
    assert!(err.contains("relative to the current folder"), "{err}");

    // A broken template names the file.
    let dir = std::env::temp_dir().join(format!("mailgate-cli-broken-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (path, body) in [
        ("verify/en/subject.txt", "Your code"),
        ("verify/en/body.txt", "{% if code %}{{ code }}"),
    ] {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE__TEMPLATES__DIR", &dir);
    let out = run(c);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("verify/en/body.txt"), "{err}");

    // Unreachable services: say which and how to point elsewhere.
    let mut c = mailgate(&h, &["check-config", "--connect"]);
    c.env(
        "MAILGATE__REDIS__URL",
        format!("redis://127.0.0.1:{}/0", free_port()),
    );
    let out = run(c);
    assert!(!out.status.success());
    let report = text(&out.stdout);
    assert!(
        report.contains("redis: FAILED") && report.contains("MAILGATE__REDIS__URL"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_binary_exits_0_on_sigterm() {
    let h = Harness::new("cli-sigterm").await;
    let child = mailgate(&h, &["worker"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for it to consume, then have it do one job.
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;
    h.publish(&serde_json::json!({"id": "sig", "email": "sig@example.com", "code": "1"}))
        .await;
    assert_eq!(h.result().await["status"], "sent");
    // A result RabbitMQ returns (its reply_to queue does not exist) falls
    // back to the results queue, and its body (an address, a code) is not
    // logged on the way.
    let leaky = br#"{"id": "sig2", "email": "leak.victim@example.com", "code": "734291"}"#;
    let props = lapin::BasicProperties::default().with_reply_to("cli-sigterm-no-such-queue".into());
    h.publish_raw(leaky, props).await;
    assert_eq!(h.result().await["id"], "sig2");
    let out = common::signal_and_wait(child, "-TERM", Duration::from_secs(30)).await;
    let out = (out.status, text(&out.stderr));
    assert!(out.0.success(), "exit status {:?}: {}", out.0, out.1);
    assert!(out.1.contains("shutdown requested"), "{}", out.1);
    assert!(out.1.contains("reply_to queue does not exist"), "{}", out.1);
    // Written to a pipe (a file, a collector), the pretty log has no colours.
    assert!(
        !out.1.contains('\x1b'),
        "ANSI escapes in a piped log: {}",
        out.1
    );
    // lapin logs a returned message (here the result, with the address)
    // in full, as bytes; mailgate says what happened in its own words.
    assert!(
        !out.1.contains("734291")
            && !out.1.contains("leak.victim")
            && !out.1.contains("returned us a message"),
        "{}",
        out.1
    );
}

/// `overrides list` says when there are none, and a lifetime reads as it
/// was given (`24h`, not `1440m0s`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_list_says_none_and_durations_read_as_given() {
    let h = Harness::new("cli-ovlist").await;
    let out = run_async(mailgate(&h, &["overrides", "list"])).await;
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(
        text(&out.stderr).contains("no overrides in force"),
        "{}",
        text(&out.stderr)
    );
    let add = [
        "overrides",
        "add",
        "email:qa@example.com",
        "--allow",
        "--reason",
        "QA",
        "--expires-in",
        "24h",
    ];
    assert!(run_async(mailgate(&h, &add)).await.status.success());
    let out = run_async(mailgate(&h, &["overrides", "list"])).await;
    let listed = text(&out.stdout);
    assert!(listed.contains("for 24h more"), "{listed}");
    // An allow inside a denied network holds for what it covers: said.
    let deny = [
        "overrides",
        "add",
        "ip:203.0.113.0/24",
        "--deny",
        "--reason",
        "abuse",
    ];
    assert!(run_async(mailgate(&h, &deny)).await.status.success());
    let allow = [
        "overrides",
        "add",
        "ip:203.0.113.5",
        "--allow",
        "--reason",
        "office",
    ];
    let out = run_async(mailgate(&h, &allow)).await;
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("note: deny is in force for the wider ip:203.0.113.0/24"),
        "{said}"
    );
}

/// A Redis that evicts keys is refused at start, with the setting named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_refuses_a_redis_that_evicts() {
    let h = Harness::new("cli-evict").await;
    let server = PrivateRedis::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let out = run_async({
        let mut c = mailgate(&h, &["worker"]);
        c.env("MAILGATE__REDIS__URL", server.url());
        c
    })
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("maxmemory-policy volatile-lru") && err.contains("redis.allow_eviction"),
        "{err}"
    );
    let out = run_async({
        let mut c = mailgate(&h, &["check-config", "--connect"]);
        c.env("MAILGATE__REDIS__URL", server.url());
        c
    })
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stdout).contains("redis: FAILED"),
        "{}",
        text(&out.stdout)
    );
}

/// A Redis that answers every read of the overrides with an error that
/// waiting cannot mend (their key holds a string: `WRONGTYPE`) stops the
/// worker at start, with the reason, as an evicting Redis does; the worker
/// must not retry it for ever saying that Redis "is not answering".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_stops_when_the_overrides_can_never_be_read() {
    let h = Harness::new("cli-overrides-wrongtype").await;
    let server = PrivateRedis::start();
    let mut conn = server.connection();
    let _: () = redis::cmd("SET")
        .arg("t:overrides")
        .arg("not a hash")
        .query(&mut conn)
        .unwrap();
    let mut child = mailgate(&h, &["worker"])
        .env("MAILGATE__REDIS__URL", server.url())
        .env("MAILGATE__REDIS__KEY_PREFIX", "t:")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(20) {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let exited = child.try_wait().unwrap();
    let out = match exited {
        Some(_) => child.wait_with_output().unwrap(),
        None => common::signal_and_wait(child, "-KILL", Duration::from_secs(10)).await,
    };
    let err = text(&out.stderr);
    assert!(
        exited.is_some(),
        "the worker still retries a WRONGTYPE after 20 s: {err}"
    );
    assert!(!out.status.success());
    assert!(
        err.contains("reading the overrides") && err.contains("WRONGTYPE"),
        "{err}"
    );
}

/// `redis.url = "memory://"`: one worker without Redis, which says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_memory_needs_no_redis() {
    let h = Harness::new("cli-memory").await;
    let child = mailgate(&h, &["worker"])
        .env("MAILGATE__REDIS__URL", "memory://")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    h.wait_for_queue(&h.settings.amqp.jobs_queue).await;
    for id in ["m1", "m2"] {
        h.publish(&serde_json::json!({"id": id, "email": "mem@example.com", "code": "1"}))
            .await;
    }
    let results = h.results(2).await;
    let mut statuses: Vec<&str> = results
        .values()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    statuses.sort();
    assert_eq!(statuses, ["rejected", "sent"], "limits hold in memory");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("memory://") && err.contains("not shared"),
        "the worker warns at start: {err}"
    );
}

/// A jobs queue declared before with other arguments: the worker stops at
/// start with RabbitMQ's own reason, instead of retrying forever as if the
/// broker were down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_stops_with_the_brokers_reason_when_its_queue_is_refused() {
    let h = Harness::new("cli-refused").await;
    let mut args = lapin::types::FieldTable::default();
    args.insert("x-max-length".into(), lapin::types::AMQPValue::LongInt(5));
    h.channel
        .queue_declare(
            h.settings.amqp.jobs_queue.as_str().into(),
            lapin::options::QueueDeclareOptions::durable(),
            args,
        )
        .await
        .unwrap();
    let started = Instant::now();
    let out = run_async(mailgate(&h, &["worker"])).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("PRECONDITION_FAILED") && err.contains(&h.settings.amqp.jobs_queue),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "no retrying");
}

/// SIGTERM or SIGINT while the worker is still starting (Redis does not
/// answer yet): a clean exit 0, not death by the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signal_during_start_up_is_a_clean_stop() {
    let h = Harness::new("cli-startsig").await;
    for sig in ["-TERM", "-INT"] {
        let child = mailgate(&h, &["worker"])
            .env(
                "MAILGATE__REDIS__URL",
                format!("redis://127.0.0.1:{}/0", free_port()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let _ = Command::new("kill")
            .args([sig, &child.id().to_string()])
            .status();
        let started = Instant::now();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.status.success(),
            "{sig}: {:?} {}",
            out.status,
            text(&out.stderr)
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{sig}: stopped at once"
        );
    }
}

/// `check-config` refuses a template layout that is ambiguous or reaches
/// outside its directory, naming the paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_refuses_ambiguous_or_escaping_templates() {
    let h = Harness::new("cli-tpl").await;
    let base = std::env::temp_dir().join(format!("mgtest-tpl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let copy = |to: &std::path::Path| {
        let out = Command::new("cp")
            .args(["-r", "templates"])
            .arg(to)
            .status()
            .unwrap();
        assert!(out.success());
    };
    let dir = base.join("ambiguous");
    std::fs::create_dir_all(&base).unwrap();
    copy(&dir);
    Command::new("cp")
        .args(["-r"])
        .arg(dir.join("verify/zh-CN"))
        .arg(dir.join("verify/zh_cn"))
        .status()
        .unwrap();
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE__TEMPLATES__DIR", &dir);
    let out = run(c);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("zh_cn") && err.contains("zh-CN"), "{err}");

    let dir = base.join("escaping");
    copy(&dir);
    std::fs::write(base.join("secret.txt"), "secret").unwrap();
    let subject = dir.join("verify/en/subject.txt");
    std::fs::remove_file(&subject).unwrap();
    std::os::unix::fs::symlink(base.join("secret.txt"), &subject).unwrap();
    let mut c = mailgate(&h, &["check-config"]);
    c.env("MAILGATE__TEMPLATES__DIR", &dir);
    let out = run(c);
    let _ = std::fs::remove_dir_all(&base);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("subject.txt") && err.contains("outside"),
        "{err}"
    );
}

/// A RabbitMQ address that accepts the TCP connection and never answers
/// (a load balancer without a backend) is an outage the worker retries,
/// each attempt bounded by `amqp.timeout`, not a wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_never_finishes_the_handshake_is_retried() {
    let h = Harness::new("cli-blackhole").await;
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = hole.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(conn);
        }
    });
    let child = mailgate(&h, &["worker"])
        .env(
            "MAILGATE__AMQP__URL",
            format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
        )
        .env("MAILGATE__AMQP__TIMEOUT", "300ms")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while accepted.load(std::sync::atomic::Ordering::SeqCst) < 3 {
        assert!(
            Instant::now() < deadline,
            "the worker stopped trying after {} connection(s)",
            accepted.load(std::sync::atomic::Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = common::signal_and_wait(child, "-TERM", Duration::from_secs(30)).await;
    let out = (out.status, text(&out.stderr));
    assert!(out.0.success(), "{}", out.1);
    assert!(out.1.contains("did not answer within 300ms"), "{}", out.1);
}

/// Every tool stops on Ctrl-C, here `publish --wait` with no worker to
/// answer it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_stops_on_ctrl_c() {
    let h = Harness::new("cli-ctrl-c").await;
    // The jobs queue, as a worker would have declared it.
    h.declare("jobs").await;
    let child = mailgate(
        &h,
        &[
            "publish",
            "--wait",
            "--timeout",
            "60s",
            "--email",
            "ctrl-c@example.com",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // By now it has published and waits for a result that never comes (if
    // not, it is interrupted earlier, which stops it just the same).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let out = common::signal_and_wait(child, "-INT", Duration::from_secs(10)).await;
    let out = (out.status, text(&out.stderr));
    assert!(!out.0.success(), "{}", out.1);
    assert!(out.1.contains("interrupted"), "{}", out.1);
}

/// Support staff allow a QA mailbox with `mailgate overrides add`: a
/// running worker applies it within 5 s without a restart, `limits show`
/// names it, `list` shows it, and `remove` takes it back as fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_applies_to_running_workers_within_seconds() {
    let h = Harness::with("cli-overrides", |s| {
        s.limits.email = rules(&[(HOUR, 1)]);
    })
    .await;
    let w = h.start_worker().await;
    let job = |id: &str| json!({"id": id, "email": "qa@example.com", "code": "493817"});
    h.publish(&job("q0")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("q1")).await;
    assert_eq!(h.result().await["status"], "rejected");

    let add = [
        "overrides",
        "add",
        "email:QA@example.com",
        "--allow",
        "--reason",
        "QA account",
        "--expires-in",
        "1h",
    ];
    let out = run_async(mailgate(&h, &add)).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("allow for 1h more: QA account"),
        "{}",
        text(&out.stdout)
    );
    let until = |want: &'static str, tag: &'static str| {
        let h = &h;
        async move {
            let since = std::time::Instant::now();
            for n in 0.. {
                h.publish(&job(&format!("{tag}{n}"))).await;
                if h.result().await["status"] == want {
                    return since.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            unreachable!()
        }
    };
    let took = until("sent", "a").await;
    assert!(took < Duration::from_secs(5), "applied after {took:?}");
    let out = run_async(mailgate(
        &h,
        &["limits", "show", "--email", "qa@example.com"],
    ))
    .await;
    let shown = text(&out.stdout);
    assert!(
        shown.contains("override in force: email:QA@example.com allow for")
            && shown.contains("QA account")
            && shown.contains("exempt (the override allows it)"),
        "{shown}"
    );
    let out = run_async(mailgate(&h, &["overrides", "list", "--json"])).await;
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            &listed["target"],
            &listed["action"],
            &listed["reason"],
            &listed["live"]
        ),
        (
            &json!("email:QA@example.com"),
            &json!("allow"),
            &json!("QA account"),
            &json!(true)
        )
    );
    let (_, metrics) = common::harness::http_get(w.http, "/metrics").await;
    assert!(
        metrics.contains(r#"mailgate_limiter_override_decisions_total{kind="allow"}"#),
        "{metrics}"
    );

    let out = run_async(mailgate(
        &h,
        &["overrides", "remove", "email:qa@example.com"],
    ))
    .await;
    assert!(
        text(&out.stdout).contains("removed"),
        "{}",
        text(&out.stdout)
    );
    let took = until("rejected", "r").await;
    assert!(took < Duration::from_secs(5), "removed after {took:?}");
    // A reason is required; a bad target is refused with why.
    let out = run_async(mailgate(
        &h,
        &["overrides", "add", "ip:10.0.0.0/8", "--deny"],
    ))
    .await;
    assert!(!out.status.success());
    let out = run_async(mailgate(
        &h,
        &[
            "overrides",
            "add",
            "ip:10.0.0.300",
            "--deny",
            "--reason",
            "x",
        ],
    ))
    .await;
    assert!(
        !out.status.success() && text(&out.stderr).contains("ip"),
        "{}",
        text(&out.stderr)
    );
    w.stop().await.unwrap();
}

/// An override cannot take every client out of the IP scope by accident. A
/// host address under a short prefix (a typo for the one address) is
/// refused; a network wider than /8 or /32 needs --force;
/// `ip:::ffff:0:0/96` is the whole IPv4 space; what an override covers is
/// printed. Against the worker: with the typo refused, the client stays
/// limited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_cannot_silently_cover_every_client() {
    let h = Harness::with("cli-wide-override", |s| {
        s.limits.ip = rules(&[(MIN, 5)]);
    })
    .await;
    let with = |target: &'static str, action: &'static str, extra: &'static [&'static str]| {
        let mut args = vec!["overrides", "add", target, action, "--reason", "test"];
        args.extend_from_slice(extra);
        run(mailgate(&h, &args))
    };
    let add = |target, extra| with(target, "--allow", extra);
    let typo = add("ip:203.0.113.7/0", &[]);
    assert!(!typo.status.success());
    let said = text(&typo.stderr);
    assert!(
        said.contains("host bits set") && said.contains("ip:203.0.113.7 for the address"),
        "{said}"
    );
    for wide in [
        "ip:0.0.0.0/0",
        "ip:::/0",
        "ip:::ffff:0:0/96",
        "ip:10.0.0.0/7",
        "ip:2001::/31",
    ] {
        let out = add(wide, &[]);
        assert!(!out.status.success(), "{wide} accepted");
        assert!(
            text(&out.stderr).contains("needs --force"),
            "{wide}: {}",
            text(&out.stderr)
        );
    }
    // A public suffix matches no mailbox (alice@acme.co.uk counts as
    // acme.co.uk), and a deny of a big provider needs --force.
    let suffix = add("domain:co.uk", &[]);
    assert!(!suffix.status.success());
    assert!(
        text(&suffix.stderr).contains("public suffix"),
        "{}",
        text(&suffix.stderr)
    );
    let provider = with("domain:gmail.com", "--deny", &[]);
    assert!(!provider.status.success());
    assert!(
        text(&provider.stderr).contains("--force"),
        "{}",
        text(&provider.stderr)
    );
    // Rules of its own would put every sign-up there under one rule.
    let args = [
        "overrides",
        "add",
        "domain:gmail.com",
        "--rule",
        "1h=5",
        "--reason",
        "test",
    ];
    let ruled = run(mailgate(&h, &args));
    let said = text(&ruled.stderr);
    assert!(
        !ruled.status.success() && said.contains("rules of its own"),
        "{said}"
    );
    let narrow = add("ip:198.51.100.0/24", &[]);
    assert!(narrow.status.success(), "{}", text(&narrow.stderr));
    assert!(
        text(&narrow.stdout).contains("covers: 256 addresses"),
        "{}",
        text(&narrow.stdout)
    );
    let forced = add("ip:0.0.0.0/0", &["--force"]);
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    assert!(
        text(&forced.stdout).contains("covers: every IPv4 address (4294967296)"),
        "{}",
        text(&forced.stdout)
    );
    let gone = run(mailgate(&h, &["overrides", "remove", "ip:0.0.0.0/0"]));
    assert!(gone.status.success(), "{}", text(&gone.stderr));
    // The typo was refused: one client is still held to 5 a minute.
    let w = h.start_worker().await;
    for i in 0..7 {
        let job = json!({"id": format!("w{i}"), "email": format!("u{i}@example.com"),
                         "ip": "203.0.113.7", "code": "493817"});
        h.publish(&job).await;
    }
    let statuses: Vec<String> = (h.results(7).await.values())
        .map(|r| r["status"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| *s == "sent").count(),
        5,
        "{statuses:?}"
    );
    w.stop().await.unwrap();
}

/// A one-shot command against a broker that accepts TCP and never finishes
/// the handshake gives up after `--connect-timeout` (5 s by default, here
/// 1 s), names RabbitMQ, and never says it is reconnecting (the fault it
/// guards against: 30 s, then "…; reconnecting").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_gives_up_on_a_silent_broker_at_once() {
    let h = Harness::new("cli-silent-tool").await;
    let hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = hole.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = hole.accept().await {
            held.push(conn);
        }
    });
    let started = Instant::now();
    let out = mailgate(
        &h,
        &["check-config", "--connect", "--connect-timeout", "1s"],
    )
    .env(
        "MAILGATE__AMQP__URL",
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f"),
    )
    .output()
    .unwrap();
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {text}");
    assert!(
        text.contains("rabbitmq: FAILED") && text.contains("within 1s"),
        "{text}"
    );
    assert!(!text.contains("reconnecting"), "{text}");
}

/// A deny's rejections are one series, however many (were its "window" the
/// time it had left, a new label value on every rejection, an attacker
/// hammering a denied mailbox would grow `/metrics` without bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denys_rejections_are_one_series() {
    let h = Harness::new("cli-deny-series").await;
    let w = h.start_worker().await;
    let add = [
        "overrides",
        "add",
        "email:victim@example.com",
        "--deny",
        "--reason",
        "abuse",
        "--expires-in",
        "1h",
    ];
    let out = run_async(mailgate(&h, &add)).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Workers apply an override within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut n = 0;
    loop {
        h.publish(&json!({"id": format!("d{n}"), "email": "victim@example.com", "code": "1"}))
            .await;
        n += 1;
        let r = h.result().await;
        if r["status"] == "rejected" && r["rule"]["max"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the deny never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for i in 0..20 {
        h.publish(&json!({"id": format!("e{i}"), "email": "victim@example.com", "code": "1"}))
            .await;
        assert_eq!(h.result().await["status"], "rejected");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let metrics = common::harness::http_get(w.http, "/metrics").await.1;
    let denied: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("mailgate_limiter_decisions_total{")
                && l.contains("rejected")
                && l.contains("max=\"0\"")
        })
        .collect();
    assert_eq!(denied.len(), 1, "{denied:?}");
    assert!(denied[0].contains("window_ms=\"deny\""), "{denied:?}");
    assert!(n >= 1);
    w.stop().await.unwrap();
}

/// Every label of every metric comes from a bounded set.
/// Two floods of the same kinds of hostile traffic, with fresh values each
/// time (ids, mailboxes, domains, purposes, locales, client addresses,
/// error texts): a deny override's rejections (mailbox and domain), an IP
/// override's rules, mailbox and network-share rejections, duplicates,
/// unknown purposes, odd locales, bounces, expired and invalid jobs, and
/// bodies that are not JSON. The second flood adds no series to
/// `/metrics`: none grows with what an attacker sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_hostile_jobs_adds_no_metric_series() {
    let h = Harness::with("cli-series", |s| {
        s.limits.domain = mailgate::settings::DomainRules {
            rules: rules(&[(10 * MIN, 50)]).rules,
            ..Default::default()
        };
        s.amqp.prefetch = 32;
    })
    .await;
    h.sink.refuse("bounce", 550);
    let w = h.start_worker().await;
    common::harness::wait_ready(w.http).await;
    let adds: [&[&str]; 3] = [
        &["domain:denied.example", "--deny", "--expires-in", "1h"],
        &["email:victim@example.com", "--deny", "--expires-in", "30m"],
        &["ip:198.51.100.0/24", "--rule", "1h=1", "--expires-in", "1h"],
    ];
    for add in adds {
        let mut args = vec!["overrides", "add", "--reason", "abuse"];
        args.extend_from_slice(add);
        let out = run_async(mailgate(&h, &args)).await;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    // Workers apply overrides within a few seconds.
    let deadline = Instant::now() + Duration::from_secs(15);
    for n in 0.. {
        let id = format!("probe-{n}");
        h.publish(&json!({"id": id, "email": format!("p{n}@denied.example"), "code": "1"}))
            .await;
        if h.result().await["rule"]["max"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the deny never applied");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let series = |metrics: &str| -> std::collections::BTreeSet<String> {
        (metrics.lines())
            .filter(|l| !l.starts_with('#') && l.contains('{'))
            .filter_map(|l| l.rsplit_once(' ').map(|(s, _)| s.to_owned()))
            .collect()
    };
    let mut seen = Vec::new();
    for phase in 0..2 {
        for round in 0..3 {
            let v = format!("{phase}x{round}");
            let ip = format!("203.0.113.{}", 10 * phase + round);
            let sent = json!({"id": format!("s-{v}"), "email": format!("s{v}@ok{v}.example"), "ip": ip, "code": "1"});
            h.publish(&sent).await;
            h.result().await;
            let past = "2020-01-01T00:00:00Z";
            let net = format!("198.51.100.{}", 10 * phase + round);
            let jobs = [
                // A duplicate, and the same mailbox again (the mailbox rule).
                sent.clone(),
                json!({"id": format!("m-{v}"), "email": format!("s{v}@ok{v}.example"), "ip": ip, "code": "1"}),
                json!({"id": format!("p-{v}"), "email": format!("p{v}@ok.example"), "purpose": format!("purpose{v}"), "code": "1"}),
                json!({"id": format!("l-{v}"), "email": format!("l{v}@ok.example"), "locale": format!("x{v}"), "code": "1"}),
                json!({"id": format!("d-{v}"), "email": format!("d{v}@denied.example"), "code": "1"}),
                json!({"id": format!("v-{v}"), "email": "victim@example.com", "code": "1"}),
                // The IP override's rules: one admitted, one rejected.
                json!({"id": format!("o-{v}"), "email": format!("o{v}@o{v}.example"), "ip": net, "code": "1"}),
                json!({"id": format!("q-{v}"), "email": format!("q{v}@q{v}.example"), "ip": net, "code": "1"}),
                json!({"id": format!("b-{v}"), "email": format!("bounce{v}@ok.example"), "code": "1"}),
                json!({"id": format!("e-{v}"), "email": format!("e{v}@ok.example"), "expires_at": past, "code": "1"}),
                json!({"id": format!("i-{v}"), "email": format!("not an address {v}"), "code": "1"}),
            ];
            for j in &jobs {
                h.publish(j).await;
            }
            // The network's share of a domain (a fifth of 50 is 10): 11
            // sign-ups from 11 addresses of one /24.
            for n in 0..11 {
                let mail = format!("f{n}r{round}@farm{phase}.example");
                let from = format!("192.0.{}.{n}", 2 + round);
                h.publish(
                    &json!({"id": format!("f-{v}-{n}"), "email": mail, "ip": from, "code": "1"}),
                )
                .await;
            }
            h.publish_raw(format!("not json {v}").as_bytes(), Default::default())
                .await;
            for _ in 0..jobs.len() + 11 {
                h.result().await;
            }
        }
        // Dead letters and retries are counted once they settle.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let metrics = common::harness::http_get(w.http, "/metrics").await.1;
        seen.push(series(&metrics));
    }
    let new: Vec<&String> = seen[1].difference(&seen[0]).collect();
    assert!(new.is_empty(), "series the second flood added: {new:?}");
    // Every kind of rejection was made.
    for rule in [
        r#"scope="email",window_ms="60000",max="1""#,
        r#"scope="email",window_ms="deny",max="0""#,
        r#"scope="domain",window_ms="deny",max="0""#,
        r#"scope="ip",window_ms="3600000",max="1""#,
        r#"scope="domain",window_ms="600000",max="10""#,
    ] {
        let series = format!(r#"mailgate_limiter_decisions_total{{verdict="rejected",{rule}}}"#);
        assert!(seen[0].contains(&series), "{series} in {:?}", seen[0]);
    }
    eprintln!(
        "SERIES after each flood: {} {}",
        seen[0].len(),
        seen[1].len()
    );
    w.stop().await.unwrap();
}

/// The README's command table names every command and subcommand of the
/// clap tree, each with every flag it takes, and no command that is not
/// there: the table cannot drift from `--help`.
#[test]
fn the_readme_command_table_is_the_clap_tree() {
    use clap::CommandFactory as _;
    let readme = std::fs::read_to_string("README.md").unwrap();
    let rows: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("| `mailgate "))
        .collect();
    let cli = mailgate::cli::Cli::command();
    let global: Vec<String> = (cli.get_arguments())
        .filter_map(|a| a.get_long().map(str::to_owned))
        .chain(["help".into(), "version".into()])
        .collect();
    let mut missing = Vec::new();
    let mut commands: Vec<(String, &clap::Command)> = Vec::new();
    for c in cli.get_subcommands() {
        match c.has_subcommands() {
            false => commands.push((c.get_name().to_owned(), c)),
            true => commands.extend(
                (c.get_subcommands()).map(|s| (format!("{} {}", c.get_name(), s.get_name()), s)),
            ),
        }
    }
    for (path, command) in &commands {
        // Its row: the first cell names it (`mailgate dead list`, or
        // `suppress list` beside `suppress remove`).
        let row = rows.iter().find(|r| {
            let first = r.split(" | ").next().unwrap_or("");
            first.contains(&format!("`mailgate {path}")) || first.contains(&format!("`{path}"))
        });
        let Some(row) = row else {
            missing.push(format!("no row for `mailgate {path}`"));
            continue;
        };
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if global.iter().any(|g| g == long) || arg.is_hide_set() {
                continue;
            }
            if !row.contains(&format!("--{long}")) {
                missing.push(format!("`mailgate {path}`'s row lacks --{long}"));
            }
        }
    }
    for row in &rows {
        let named = row.trim_start_matches("| `mailgate ");
        assert!(
            commands.iter().any(|(p, _)| named.starts_with(p.as_str())),
            "a row for a command that is not there: {row}"
        );
    }
    assert!(
        missing.is_empty(),
        "the README's command table:\n{}",
        missing.join("\n")
    );
}

/// Every key the shipped settings file sets or shows (commented) is
/// explained in the README's configuration list, in its section's entry:
/// the reference cannot drift from the settings (which refuse a key they
/// do not know, `tools::docs_configs`).
#[test]
fn the_readme_explains_every_shipped_setting() {
    let readme = std::fs::read_to_string("README.md").unwrap();
    let config = std::fs::read_to_string("config/default.toml").unwrap();
    let mut section = String::new();
    let mut missing = Vec::new();
    for line in config.lines() {
        let line = line.trim_start_matches('#').trim();
        if line.starts_with('[') {
            let name = line.trim_start_matches('[').split(']').next().unwrap_or("");
            section = name.to_owned();
            continue;
        }
        let Some((key, _)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            continue;
        }
        // A section's own key, in its row; a table's under it (`[amqp.tls]`,
        // `[[smtp.relays]]`), in its row or where the README explains it.
        let top = section.split('.').next().unwrap_or("");
        let entry = readme
            .find(&format!("\n- **`[{top}]`**: "))
            .map(|at| &readme[at + 1..])
            .map(|rest| &rest[..rest[1..].find("\n-").map_or(rest.len(), |end| end + 1)]);
        let explained = entry.is_some_and(|e| e.contains(&format!("`{key}`")))
            || (section.contains('.') && readme.contains(&format!("`{key}`")));
        if !explained {
            missing.push(format!("[{section}] {key}"));
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "not in the README's configuration list:\n{}",
        missing.join("\n")
    );
}
