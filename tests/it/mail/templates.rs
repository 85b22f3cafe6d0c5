//! The shipped templates: they load, render every set, escape HTML and never
//! execute what a job puts in `vars`.

use mailgate::settings::TemplateSettings;
use mailgate::templates::Templates;
use mailgate::wire;

fn shipped() -> Templates {
    Templates::load(&TemplateSettings::default()).expect("the shipped templates load")
}

fn job(json: &str) -> mailgate::domain::Job {
    wire::decode(json.as_bytes()).expect("a valid job")
}

#[test]
fn shipped_sets_are_complete() {
    let t = shipped();
    let mut sets: Vec<_> = t.sets().map(|(p, l)| format!("{p}/{l}")).collect();
    sets.sort();
    assert_eq!(
        sets,
        [
            "reset_password/en",
            "reset_password/zh-CN",
            "verify/en",
            "verify/zh-CN"
        ]
    );
}

#[test]
fn renders_code_and_branding_in_both_parts() {
    let t = shipped();
    let now = jiff::Timestamp::from_second(1_800_000_000).unwrap();
    let j = job(
        r#"{"id":"j","email":"a@example.com","code":"493817","locale":"zh-CN",
            "vars":{"app_name":"Acme","support_email":"help@acme.example"},
            "expires_at":"2027-01-15T08:10:00Z"}"#,
    );
    let r = t.render(&j, now).unwrap();
    assert_eq!(r.locale, "zh-CN");
    assert_eq!(r.subject, "Acme验证码：493817");
    assert!(
        r.text.contains("493817") && r.text.contains("10 分钟"),
        "{}",
        r.text
    );
    let html = r.html.expect("verify has an HTML part");
    assert!(html.contains("493817") && html.contains("help@acme.example"));
}

#[test]
fn locale_falls_back_to_default() {
    let t = shipped();
    let now = jiff::Timestamp::now();
    for (locale, want) in [("zh-TW", "en"), ("fr", "en"), ("ZH_cn", "zh-CN")] {
        let j = job(&format!(
            r#"{{"id":"j","email":"a@example.com","code":"1","purpose":"reset_password","locale":"{locale}"}}"#
        ));
        assert_eq!(t.render(&j, now).unwrap().locale, want, "{locale}");
    }
}

#[test]
fn vars_are_data_not_code() {
    let t = shipped();
    let j = job(r#"{"id":"j","email":"a@example.com","code":"493817",
            "vars":{"app_name":"<script>alert(1)</script>{{ code }}{% if true %}X{% endif %}"}}"#);
    let r = t.render(&j, jiff::Timestamp::now()).unwrap();
    let html = r.html.unwrap();
    assert!(!html.contains("<script>"), "HTML is escaped");
    assert!(html.contains("&lt;script&gt;"));
    assert!(
        r.text.contains("{{ code }}{% if true %}X{% endif %}"),
        "printed, not executed: {}",
        r.text
    );
    assert_eq!(
        r.subject.matches("493817").count(),
        1,
        "the var's {{ code }} did not render the code"
    );
}
