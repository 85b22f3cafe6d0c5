//! `mailgate explain`: one answer to "why didn't I get my code?", from what
//! Redis holds, against the real services.

use std::process::Output;

use std::time::Duration;

use mailgate::settings::Rule;
use serde_json::{Value, json};

use crate::common::harness::Harness;

async fn mailgate(h: &Harness, args: &[&str]) -> Output {
    h.run_tool(args).await
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_answers_why_a_mailbox_gets_no_code() {
    let h = Harness::new("explain").await;
    let w = h.start_worker().await;
    let job = |id: &str, email: &str| json!({"id": id, "email": email, "ip": "203.0.113.7", "code": "553311"});
    h.publish(&job("e1", "who@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("e2", "who@example.com")).await;
    assert_eq!(h.result().await["status"], "rejected");
    h.publish(&job("e3", "someone-else@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    let added = mailgate(
        &h,
        &[
            "overrides",
            "add",
            "ip:203.0.113.7",
            "--rule",
            "1h=100",
            "--reason",
            "office NAT",
        ],
    )
    .await;
    stdout(&added);

    let out = stdout(
        &mailgate(
            &h,
            &[
                "explain",
                "--email",
                "Who@Example.com",
                "--ip",
                "203.0.113.7",
                "--json",
            ],
        )
        .await,
    );
    let e: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(e["next_send_in_ms"].as_u64().unwrap() > 0, "{e}");
    assert!(e["bound_by"].as_str().unwrap().contains("email:"), "{e}");
    let admissions = e["admissions"].as_array().unwrap();
    assert_eq!(admissions.len(), 1, "only this mailbox's: {e}");
    assert_eq!(admissions[0]["id"], "e1");
    assert_eq!(admissions[0]["record"]["state"], "sent");
    let ip = e["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["key"].as_str().unwrap().contains(":ip:"))
        .expect("the IP scope");
    assert_eq!(ip["override"]["reason"], "office NAT", "{e}");
    assert!(!out.contains("553311"), "no code: {out}");
    assert!(!out.contains("someone-else"), "no other mailbox: {out}");

    let text = stdout(&mailgate(&h, &["explain", "--email", "who@example.com"]).await);
    assert!(text.contains("next send for who@example.com: in"), "{text}");
    assert!(text.contains("e1") && text.contains("sent"), "{text}");
    let fresh = stdout(&mailgate(&h, &["explain", "--email", "new@example.com"]).await);
    assert!(fresh.contains("allowed now"), "{fresh}");
    assert!(fresh.contains("no admission"), "{fresh}");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suppressed_mailboxes_get_no_code_and_use_no_quota() {
    let h = Harness::with("suppress", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 5)];
    })
    .await;
    let w = h.start_worker().await;
    let job = |id: &str, email: &str| json!({"id": id, "email": email, "code": "424242"});
    h.publish(&job("s0", "gone@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");

    let added = stdout(
        &mailgate(
            &h,
            &[
                "suppress",
                "add",
                "gone@example.com",
                "--reason",
                "550 5.1.1 from our ESP",
            ],
        )
        .await,
    );
    assert!(added.contains("suppressed 1 mailbox for 30d"), "{added}");
    let r = {
        h.publish(&job("s1", "gone@example.com")).await;
        h.result().await
    };
    assert_eq!(r["status"], "suppressed", "{r}");
    assert!(
        r["error"].as_str().unwrap().contains("suppression list"),
        "{r}"
    );
    assert_eq!(
        h.sink.mails_to("gone@example.com").len(),
        1,
        "no second mail"
    );
    // No quota used.
    let usage = stdout(
        &mailgate(
            &h,
            &["limits", "show", "--email", "gone@example.com", "--json"],
        )
        .await,
    );
    let usage: Value = serde_json::from_str(usage.trim()).unwrap();
    assert_eq!(usage["rules"][0]["count"], 1, "{usage}");
    // The id sent before is still answered from its record.
    h.publish(&job("s0", "gone@example.com")).await;
    assert_eq!(h.result().await["status"], "duplicate");

    // Listed, and explained.
    let listed = stdout(&mailgate(&h, &["suppress", "list", "--json"]).await);
    let listed: Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(listed["mailbox"], "gone@example.com");
    assert_eq!(listed["source"], "manual");
    assert_eq!(listed["reason"], "550 5.1.1 from our ESP");
    assert!(listed["left_ms"].as_u64().unwrap() > 29 * 86_400_000);
    let explained = stdout(&mailgate(&h, &["explain", "--email", "gone@example.com"]).await);
    assert!(explained.starts_with("SUPPRESSED for 30d"), "{explained}");

    // A provider's export: a header, CSV lines, a line without a mailbox.
    let file = std::env::temp_dir().join(format!("{}-bounces.csv", h.settings.amqp.jobs_queue));
    std::fs::write(
        &file,
        "\u{feff}email,type\n\"bounce1@example.com\",hard\nbounce2@example.com,complaint\n\n\
         \"Bounced: x, reported by postmaster@example.com\",\"bounce3@example.com\"\n\
         no mailbox here\n",
    )
    .unwrap();
    let imported = stdout(
        &mailgate(
            &h,
            &[
                "suppress",
                "add",
                "--file",
                file.to_str().unwrap(),
                "--forever",
            ],
        )
        .await,
    );
    let _ = std::fs::remove_file(&file);
    assert!(
        imported.contains("suppressed 3 mailboxes until removed"),
        "{imported}"
    );
    assert!(imported.contains("skipped 2 lines"), "{imported}");
    let listed = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert_eq!(listed.lines().count(), 4, "{listed}");
    assert!(!listed.contains("postmaster"), "{listed}");
    assert!(
        listed.contains("bounce2@example.com") && listed.contains("import"),
        "{listed}"
    );

    // Lifted, the mailbox gets its code again.
    let removed = stdout(&mailgate(&h, &["suppress", "remove", "gone@example.com"]).await);
    assert!(removed.contains("removed gone@example.com"), "{removed}");
    assert!(
        !mailgate(&h, &["suppress", "remove", "gone@example.com"])
            .await
            .status
            .success()
    );
    h.publish(&job("s2", "gone@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    w.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mailbox_its_server_says_does_not_exist_is_suppressed() {
    let h = Harness::with("bounce", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 5)];
    })
    .await;
    h.sink.refuse_saying(
        "ghost@",
        550,
        "5.1.1 <ghost@example.com>: Recipient address rejected: User unknown",
    );
    h.sink.refuse_saying("full@", 552, "5.2.2 mailbox full");
    h.sink.refuse_saying("tagged+x@", 550, "5.1.1 no such user");
    let w = h.start_worker().await;
    let job = |id: &str, email: &str| json!({"id": id, "email": email, "code": "909090"});

    h.publish(&job("b1", "ghost@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert!(r["error"].as_str().unwrap().contains("5.1.1"), "{r}");
    // Its next job is answered without SMTP.
    let tried = h.sink.transactions();
    h.publish(&job("b2", "ghost@example.com")).await;
    let r = h.result().await;
    assert_eq!(r["status"], "suppressed", "{r}");
    assert_eq!(h.sink.transactions(), tried, "no SMTP");
    let listed = stdout(&mailgate(&h, &["suppress", "list", "--json"]).await);
    let listed: Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(listed["mailbox"], "ghost@example.com");
    assert_eq!(listed["source"], "bounce");
    assert!(
        listed["reason"].as_str().unwrap().contains("User unknown"),
        "{listed}"
    );
    assert!(
        listed["left_ms"].as_u64().unwrap() > 29 * 86_400_000,
        "{listed}"
    );

    // Only the spelling the server refused: it may look mailboxes up as
    // written (this one does), and whoever asked chose the spelling.
    h.publish(&job("b3", "GHOST@example.com")).await;
    assert_eq!(h.result().await["status"], "sent");
    h.publish(&job("b4", "tagged+x@example.com")).await;
    assert_eq!(h.result().await["status"], "failed");
    h.publish(&job("b5", "tagged@example.com")).await;
    assert_eq!(
        h.result().await["status"],
        "sent",
        "a +tag's bounce is not its base's"
    );

    // Any other permanent refusal fails the job and suppresses nothing.
    for id in ["f1", "f2"] {
        h.publish(&job(id, "full@example.com")).await;
        assert_eq!(h.result().await["status"], "failed");
    }
    let listed = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert!(!listed.contains("full@"), "{listed}");
    w.stop().await.unwrap();
}

/// A stranger who asks codes for other spellings of the owner's address,
/// which the owner's server refuses as written (RFC 5321 lets it), does
/// not get the owner suppressed: a bounce suppresses exactly the refused
/// spelling. The other way, a mailbox someone suppressed is suppressed in
/// every spelling the limiter counts as it (Unicode case, a +tag, quotes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_spelling_never_suppresses_the_owner() {
    let h = Harness::with("bounce-spelling", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 50)];
    })
    .await;
    // The owner's server knows "jane" as written, nothing else.
    for spelling in ["JANE@", "Jane@", "\"jane\"@", "\"ja\\ne\"@"] {
        h.sink
            .refuse_saying(spelling, 550, "5.1.1 no such user here");
    }
    let w = h.start_worker().await;
    let job = |id: &str, email: &str| json!({"id": id, "email": email, "code": "909090"});
    let spellings = [
        "JANE@owner.example",
        "Jane@owner.example",
        "\"jane\"@owner.example",
        "\"ja\\ne\"@owner.example",
    ];
    for (i, spelling) in spellings.iter().enumerate() {
        h.publish(&job(&format!("x{i}"), spelling)).await;
        let r = h.result().await;
        assert_eq!(r["status"], "failed", "{spelling}: {r}");
        // Refused again, that spelling is suppressed.
        h.publish(&job(&format!("y{i}"), spelling)).await;
        assert_eq!(h.result().await["status"], "suppressed", "{spelling}");
    }
    // A provider's bounce export of such a spelling, imported: only that
    // spelling; a complaint in it: the mailbox.
    let export = std::env::temp_dir().join(format!("{}-export.csv", h.settings.amqp.jobs_queue));
    std::fs::write(
        &export,
        "Email,Type,Reason\nJANE+promo@owner.example,Permanent,General\n\
         Jo@owner.example,SpamComplaint,marked as spam\n",
    )
    .unwrap();
    stdout(&mailgate(&h, &["suppress", "add", "--file", export.to_str().unwrap()]).await);
    let _ = std::fs::remove_file(&export);
    h.publish(&job("promo", "JANE+promo@owner.example")).await;
    assert_eq!(h.result().await["status"], "suppressed");
    h.publish(&job("jo", "jo+x@owner.example")).await;
    assert_eq!(
        h.result().await["status"],
        "suppressed",
        "a complaint: the mailbox"
    );
    h.publish(&job("owner", "jane@owner.example")).await;
    assert_eq!(
        h.result().await["status"],
        "sent",
        "the owner gets her code"
    );
    let explained = stdout(&mailgate(&h, &["explain", "--email", "jane@owner.example"]).await);
    assert!(!explained.contains("SUPPRESSED"), "{explained}");

    // The owner asks for no mail: no spelling reaches her.
    stdout(&mailgate(&h, &["suppress", "add", "jöhn@owner.example"]).await);
    for (i, spelling) in [
        "jöhn@owner.example",
        "JÖHN@owner.example",
        "jÖhn@owner.example",
        "jöhn+again@owner.example",
    ]
    .iter()
    .enumerate()
    {
        h.publish(&job(&format!("j{i}"), spelling)).await;
        assert_eq!(h.result().await["status"], "suppressed", "{spelling}");
    }
    let explained = stdout(&mailgate(&h, &["explain", "--email", "JÖHN+x@owner.example"]).await);
    assert!(
        explained.contains("SUPPRESSED") && explained.contains("every spelling"),
        "{explained}"
    );
    w.stop().await.unwrap();
}

/// A relay that says every mailbox does not exist (a broken recipient
/// table) must not suppress everyone who asks for a code while it lasts:
/// past five in a row without a mail taken, its word stops counting, and
/// the five it was believed for are lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_that_says_every_mailbox_is_unknown_suppresses_none() {
    let h = Harness::new("bounce-all").await;
    h.sink.refuse_saying(
        "@example.com",
        550,
        "5.1.1 User unknown in relay recipient table",
    );
    let w = h.start_worker().await;
    for n in 0..8 {
        let job =
            json!({"id": format!("u{n}"), "email": format!("user{n}@example.com"), "code": "1"});
        h.publish(&job).await;
        assert_eq!(h.result().await["status"], "failed");
    }
    let listed = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert_eq!(listed.lines().count(), 0, "{listed}");
    w.stop().await.unwrap();
}

/// The 5.1.1 guard holds where one worker's runs cannot see it all: three
/// workers share a broken domain's refusals (none sees six), a worker
/// restarts mid-run (its runs are gone), and a table broken for many
/// domains, each of too few users for a run, amid mail to others. Every
/// worker's bounces of a domain are counted in Redis, and a share of
/// refusals among a relay's latest mails is doubted too: nobody is left
/// suppressed (found by review: 9 of 15, 5 of 11 and 60 of 60 were).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounce_guard_holds_across_workers_restarts_and_many_domains() {
    let h = Harness::with("bounce-shared", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 50)];
        s.limits.ip.rules = vec![];
        s.limits.domain.rules = vec![];
        s.amqp.prefetch = 4;
    })
    .await;
    for domain in ["@broken.example", "@restart.example", ".many.example"] {
        h.sink
            .refuse_saying(domain, 550, "5.1.1 User unknown in relay recipient table");
    }
    let job = |id: String, email: String| json!({"id": id, "email": email, "code": "1"});
    // Three workers, 15 refusals of one domain.
    let workers = [
        h.start_worker().await,
        h.start_worker().await,
        h.start_worker().await,
    ];
    for n in 0..15 {
        h.publish(&job(format!("b{n}"), format!("u{n}@broken.example")))
            .await;
    }
    let results = h.results(15).await;
    assert!(
        results.values().all(|r| r["status"] == "failed"),
        "{results:?}"
    );
    for w in workers {
        w.stop().await.unwrap();
    }
    let left = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert!(!left.contains("broken.example"), "{left}");

    // A restart between the fifth refusal and the sixth.
    let w = h.start_worker().await;
    for n in 0..5 {
        h.publish(&job(format!("r{n}"), format!("u{n}@restart.example")))
            .await;
        assert_eq!(h.result().await["status"], "failed");
    }
    w.stop().await.unwrap();
    let before = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert_eq!(before.matches("restart.example").count(), 5, "{before}");
    let w = h.start_worker().await;
    h.publish(&job("r5".into(), "u5@restart.example".into()))
        .await;
    let r = h.result().await;
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("not taken as grounds"),
        "{r}"
    );
    let after = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert!(!after.contains("restart.example"), "{after}");

    // Broken for 15 domains, 4 users each, a good mail after each refusal.
    for n in 0..60 {
        h.publish(&job(
            format!("m{n}"),
            format!("u{}@d{}.many.example", n % 4, n / 4),
        ))
        .await;
        assert_eq!(h.result().await["status"], "failed");
        h.publish(&job(format!("f{n}"), format!("u{n}@fine.example")))
            .await;
        assert_eq!(h.result().await["status"], "sent");
    }
    let after = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert!(!after.contains("many.example"), "{after}");
    w.stop().await.unwrap();
}

/// A relay whose recipient table is broken for one domain, amid normal
/// mail to others: that domain's users are not suppressed (the guard runs
/// per domain too, so the mail taken for other domains does not keep it
/// believed), and each 5.1.1 past the run is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_broken_for_one_domain_amid_other_mail_suppresses_none_of_it() {
    let h = Harness::with("bounce-domain", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 50)];
        s.limits.ip.rules = vec![];
        s.limits.domain.rules = vec![];
    })
    .await;
    h.sink.refuse_saying(
        "@broken.example",
        550,
        "5.1.1 User unknown in relay recipient table",
    );
    let w = h.start_worker().await;
    for n in 0..20 {
        let broken =
            json!({"id": format!("b{n}"), "email": format!("user{n}@broken.example"), "code": "1"});
        h.publish(&broken).await;
        assert_eq!(h.result().await["status"], "failed");
        let fine =
            json!({"id": format!("f{n}"), "email": format!("user{n}@fine.example"), "code": "1"});
        h.publish(&fine).await;
        assert_eq!(h.result().await["status"], "sent");
    }
    let listed = stdout(&mailgate(&h, &["suppress", "list"]).await);
    assert_eq!(listed.lines().count(), 0, "{listed}");
    // Asked again, each of them reaches the relay (none is suppressed).
    h.publish(&json!({"id": "again", "email": "user0@broken.example", "code": "1"}))
        .await;
    let r = h.result().await;
    assert_eq!(r["status"], "failed", "{r}");
    assert!(
        r["error"]
            .as_str()
            .unwrap()
            .contains("not taken as grounds"),
        "{r}"
    );
    w.stop().await.unwrap();
}

/// With a client address, `explain` weighs the domain's own total as well
/// as that network's share of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_with_an_ip_weighs_the_domains_own_total() {
    let h = Harness::with("explain-domain", |s| {
        s.limits.email.rules = vec![Rule::new(Duration::from_secs(60), 5)];
        s.limits.ip.rules = vec![Rule::new(Duration::from_secs(60), 50)];
        s.limits.domain.rules = vec![Rule::new(Duration::from_secs(600), 5)];
        s.limits.domain.network_share = 0.4;
    })
    .await;
    let w = h.start_worker().await;
    for n in 0..5 {
        let ip = format!("198.18.{}.1", n % 3);
        let job = json!({"id": format!("d{n}"), "email": format!("m{n}@dom.example"), "ip": ip, "code": "1"});
        h.publish(&job).await;
        assert_eq!(h.result().await["status"], "sent");
    }
    let args = [
        "explain",
        "--email",
        "new@dom.example",
        "--ip",
        "198.18.4.1",
    ];
    let out = stdout(&mailgate(&h, &[&args[..], &["--json"]].concat()).await);
    let e: Value = serde_json::from_str(out.trim()).unwrap();
    assert!(e["next_send_in_ms"].as_u64().unwrap() > 0, "{e}");
    let bound = e["bound_by"].as_str().unwrap();
    assert!(bound.ends_with("domain:dom.example"), "{e}");
    let text = stdout(&mailgate(&h, &args).await);
    assert!(text.contains("the domain scope's 5 per 10m"), "{text}");
    w.stop().await.unwrap();
}

/// A quoted local part is the same address as the unquoted one (RFC 5321):
/// a suppression of either holds for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quoted_spelling_is_the_same_suppressed_address() {
    let h = Harness::new("suppress-quoted").await;
    let w = h.start_worker().await;
    stdout(&mailgate(&h, &["suppress", "add", "victim@corp.example"]).await);
    for (id, email) in [
        ("q1", "\"victim\"@corp.example"),
        ("q2", "\"Vi\\ctim\"@corp.example"),
        ("q3", "VICTIM@CORP.EXAMPLE"),
    ] {
        h.publish(&json!({"id": id, "email": email, "code": "5"}))
            .await;
        let r = h.result().await;
        assert_eq!(r["status"], "suppressed", "{email}: {r}");
    }
    w.stop().await.unwrap();
}
