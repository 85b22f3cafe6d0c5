//! Overrides: how targets parse and how a subject's overrides hold in the
//! [`Table`].

use super::*;

#[test]
fn targets_parse_and_name_one_field_per_subject() {
    let norm = Normalization::default();
    let a = Target::parse("email:J.o.h.n+x@GMail.com").unwrap();
    let b = Target::parse("email:john@gmail.com").unwrap();
    assert_eq!(a.field(&norm), b.field(&norm));
    let n = Target::parse("ip:10.1.2.3/8").unwrap();
    assert_eq!(n.to_string(), "ip:10.0.0.0/8");
    assert_eq!(
        Target::parse("ip:::ffff:10.0.0.0/104").unwrap(),
        Target::parse("ip:10.0.0.0/8").unwrap()
    );
    assert_eq!(
        Target::parse("ip:2001:db8::1").unwrap().to_string(),
        "ip:2001:db8::1/128"
    );
    assert!(
        Target::parse("domain:a.b.example.co.uk").is_err(),
        "registrable only"
    );
    assert!(Target::parse("domain:example.co.uk").is_ok());
    for bad in ["x", "user:a@b.c", "ip:10.0.0.300", "email:nope"] {
        assert!(Target::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn the_narrowest_live_network_matches() {
    let ov = |t: &str, expires: Option<u64>| Override {
        target: Target::parse(t).unwrap(),
        action: Action::Allow,
        reason: "r".into(),
        expires_at_ms: expires,
        added_at_ms: 0,
    };
    let table = Table::new(
        vec![
            ov("ip:10.0.0.0/8", None),
            ov("ip:10.1.0.0/16", Some(100)),
            ov("ip:2001:db8::/32", None),
        ],
        |e| e.to_string(),
        |d| d.to_string(),
        3,
        |_| 1,
        |_| None,
    );
    let at = |ip: &str, now| {
        table
            .ip(ip.parse().unwrap(), now)
            .map(|h| h.ov.target.to_string())
    };
    assert_eq!(at("10.1.2.3", 50).as_deref(), Some("ip:10.1.0.0/16"));
    assert_eq!(
        at("10.1.2.3", 100).as_deref(),
        Some("ip:10.0.0.0/8"),
        "expired"
    );
    assert_eq!(at("11.0.0.1", 50), None);
    assert_eq!(at("2001:db8:1::9", 50).as_deref(), Some("ip:2001:db8::/32"));
    assert_eq!(table.len(), 3);
}

// Overrides of one subject (stored apart, widened to one) hold by what
// they do and how long they last, not by the order their fields are read
// in: every live rules override holds (1 a minute and 1000 a day
// together), a newer, shorter deny hides no longer one, and once the
// stronger expires the weaker holds at once.

/// An override of the network 10.1.2.0/24.
fn ov(action: Action, expires: Option<u64>, added: u64) -> Override {
    Override {
        target: Target::parse("ip:10.1.2.0/24").unwrap(),
        action,
        reason: format!("r{added}"),
        expires_at_ms: expires,
        added_at_ms: added,
    }
}

/// `n` per `s` seconds.
fn rule(s: u64, n: u32) -> Rule {
    Rule::new(std::time::Duration::from_secs(s), n)
}

/// The table of `ovs`, rule sets numbered from 3.
fn table_of(ovs: Vec<Override>) -> Table {
    Table::new(
        ovs,
        |e| e.to_string(),
        |d| d.to_string(),
        3,
        |_| 1,
        |_| None,
    )
}

/// What holds for 10.1.2.3 at `now` among `ovs`, the table built of the
/// live ones (as it is built again when a merged one expires).
fn held(ovs: Vec<Override>, now: u64) -> Option<(Action, Option<u64>)> {
    let ovs = ovs.into_iter().filter(|o| o.live(now)).collect();
    let table = table_of(ovs);
    assert!(table.len() <= 1);
    let hit = table.ip("10.1.2.3".parse().unwrap(), now).cloned();
    hit.map(|h| (h.ov.action.clone(), h.ov.expires_at_ms))
}

/// The rules of what holds, sorted.
fn rules_of(held: Option<(Action, Option<u64>)>) -> Vec<Rule> {
    match held {
        Some((Action::Rules(mut r), _)) => {
            r.sort_by_key(|r| (r.window, r.max));
            r
        }
        other => panic!("{other:?}"),
    }
}

/// 1 a minute and 1000 a day both apply, in either order; when the first
/// to expire does, the other alone.
#[test]
fn rules_overrides_of_one_subject_all_hold() {
    for ovs in [
        vec![
            ov(Action::Rules(vec![rule(60, 1)]), Some(100), 1),
            ov(Action::Rules(vec![rule(86400, 1000)]), None, 2),
        ],
        vec![
            ov(Action::Rules(vec![rule(86400, 1000)]), None, 2),
            ov(Action::Rules(vec![rule(60, 1)]), Some(100), 1),
        ],
    ] {
        assert_eq!(
            rules_of(held(ovs.clone(), 10)),
            [rule(60, 1), rule(86400, 1000)]
        );
        assert_eq!(rules_of(held(ovs, 150)), [rule(86400, 1000)]);
    }
}

/// However many, one set: the tightest max per window; built again when
/// the first of them expires.
#[test]
fn many_rules_overrides_make_one_set_of_the_tightest() {
    let many: Vec<Override> = (1..=1000)
        .map(|i| {
            ov(
                Action::Rules(vec![
                    rule(60, 1001 - i),
                    rule(3600 + u64::from(i % 3), 5000),
                ]),
                Some(1000 + u64::from(i)),
                i.into(),
            )
        })
        .collect();
    let table = table_of(many);
    assert_eq!(table.rebuild_at, Some(1001));
    let hit = table.ip("10.1.2.3".parse().unwrap(), 10).unwrap();
    let set = &hit.set.as_ref().unwrap().1;
    assert_eq!(set.rules.len(), 4, "{:?}", set.rules);
    assert!(
        set.rules.contains(&rule(60, 1)),
        "the tightest of the minute rules"
    );
}

/// Of two denies the longest-lasting holds, newer or not; a deny holds
/// while it lasts, then the rules, then the allow.
#[test]
fn denies_then_rules_then_allows_hold_in_turn() {
    let denies = vec![ov(Action::Deny, None, 1), ov(Action::Deny, Some(100), 2)];
    assert_eq!(held(denies, 10), Some((Action::Deny, None)));
    let all = || {
        vec![
            ov(Action::Allow, None, 1),
            ov(Action::Rules(vec![rule(60, 1)]), Some(200), 2),
            ov(Action::Deny, Some(100), 3),
        ]
    };
    assert_eq!(held(all(), 50), Some((Action::Deny, Some(100))));
    assert_eq!(rules_of(held(all(), 150)), [rule(60, 1)]);
    assert_eq!(held(all(), 250), Some((Action::Allow, None)));
    assert_eq!(held(vec![ov(Action::Deny, Some(100), 3)], 150), None);
}
