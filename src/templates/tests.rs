//! The template loader's layouts and rendering.

use super::*;

fn set(files: &[(&str, &str)]) -> (tempdir::Dir, TemplateSettings) {
    let dir = tempdir::Dir::new();
    for (path, body) in files {
        let p = dir.0.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    let settings = TemplateSettings {
        dir: dir.0.clone(),
        default_locale: "en".into(),
    };
    (dir, settings)
}

mod tempdir {
    pub(super) struct Dir(pub std::path::PathBuf);
    impl Dir {
        pub(super) fn new() -> Self {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!("mailgate-tpl-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

const OK: &[(&str, &str)] = &[
    (
        "verify/en/subject.txt",
        "Your {{ vars.app_name | default('') }} code",
    ),
    ("verify/en/body.txt", "Code: {{ code }}"),
    (
        "verify/en/body.html",
        "<p>{{ vars.app_name | default('') }}: <b>{{ code }}</b></p>",
    ),
    ("verify/zh/subject.txt", "验证码"),
    ("verify/zh/body.txt", "验证码：{{ code }}"),
    ("verify/zh-CN/subject.txt", "验证码 CN"),
    ("verify/zh-CN/body.txt", "验证码：{{ code }}"),
];

#[test]
fn locales_fall_back() {
    let (_d, s) = set(OK);
    let t = Templates::load(&s).unwrap();
    let p = Name::parse("purpose", "verify").unwrap();
    let l = |s: &str| Name::parse("locale", s).unwrap();
    assert_eq!(t.resolve_locale(&p, Some(&l("zh-CN"))), Some("zh-CN"));
    assert_eq!(t.resolve_locale(&p, Some(&l("zh_cn"))), Some("zh-CN"));
    assert_eq!(t.resolve_locale(&p, Some(&l("zh-TW"))), Some("zh"));
    assert_eq!(t.resolve_locale(&p, Some(&l("fr-FR"))), Some("en"));
    assert_eq!(t.resolve_locale(&p, None), Some("en"));
    let other = Name::parse("purpose", "other").unwrap();
    assert!(!t.has_purpose(&other));
    assert_eq!(t.resolve_locale(&other, None), None);
}

#[test]
fn rules_of_a_purpose_without_templates_are_refused() {
    let (_d, s) = set(OK);
    let t = Templates::load(&s).unwrap();
    assert!(t.check_purposes(["verify"]).is_ok());
    let err = t
        .check_purposes(["verify", "verfy"])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("limits.purpose.verfy: no template set"),
        "{err}"
    );
    assert!(err.contains("(template sets: verify)"), "{err}");
}

#[test]
fn broken_templates_stop_the_load() {
    let mut files = OK.to_vec();
    files.push(("verify/de/subject.txt", "{{ code "));
    files.push(("verify/de/body.txt", "x"));
    let (_d, s) = set(&files);
    let err = Templates::load(&s).expect_err("syntax error");
    assert!(err.to_string().contains("verify/de/subject.txt"), "{err}");

    let mut files = OK.to_vec();
    files.push(("verify/fr/subject.txt", "{{ cod }}"));
    files.push(("verify/fr/body.txt", "x"));
    let (_d, s) = set(&files);
    let mut no_code = OK.to_vec();
    no_code.push(("verify/fr/subject.txt", "x"));
    no_code.push(("verify/fr/body.txt", "Hello, no code here"));
    let (_d3, s3) = set(&no_code);
    let t = Templates::load(&s3).expect("it loads");
    assert_eq!(t.without_code(), ["verify/fr/body.txt"]);
    let err = Templates::load(&s).expect_err("undefined variable");
    let mut missing = OK.to_vec();
    missing.push(("verify/fr/subject.txt", "x"));
    let (_d2, s2) = set(&missing);
    let said = Templates::load(&s2).expect_err("no body").to_string();
    assert!(
        said.contains("verify/fr has no body.txt: a locale needs"),
        "{said}"
    );
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    let said = format!("{err}: {}", cause.unwrap_or_default());
    assert!(said.contains("verify/fr/subject.txt"), "{said}");
    assert!(said.contains("`cod` is undefined"), "names it: {said}");
    // Once loaded, rendering keeps no debug information.
    let (_d, s) = set(OK);
    assert!(!Templates::load(&s).unwrap().env.debug());

    let (_d, s) = set(&[("reset/de/subject.txt", "x"), ("reset/de/body.txt", "x")]);
    let err = Templates::load(&s).expect_err("no default locale");
    assert!(err.to_string().contains("default locale"), "{err}");

    let (_d, s) = set(&[("bad.name/en/subject.txt", "x")]);
    assert!(Templates::load(&s).is_err());
}

#[test]
fn numbers_render_as_written() {
    let mut files = OK.to_vec();
    files.retain(|(p, _)| *p != "verify/en/body.txt");
    files.push((
        "verify/en/body.txt",
        "{{ code }}{% for k in ['n', 'big', 'f', 'z', 'e', 'huge', 'tiny'] %} {{ vars[k] | default('') }}{% endfor %} {{ vars.f * 2 if vars.f is defined }}",
    ));
    let (_d, s) = set(&files);
    let t = Templates::load(&s).unwrap();
    let job = crate::wire::decode(
        br#"{"id":"j","email":"a@example.com","code":"1","vars":{"n":10,"big":12345678901234567890,"f":1.5,
             "z":-0,"e":1e3,"huge":100000000000000000000000000000000000000000000000001,"tiny":1e-400}}"#,
    )
    .unwrap();
    let r = t.render(&job, jiff::Timestamp::now()).unwrap();
    assert_eq!(
        r.text,
        "1 10 12345678901234567890 1.5 -0 1e3 100000000000000000000000000000000000000000000000001 1e-400 3.0"
    );
}

#[test]
fn ambiguous_or_escaping_layouts_are_refused() {
    // Two spellings of one locale.
    let mut files = OK.to_vec();
    files.push(("verify/zh_cn/subject.txt", "x"));
    files.push(("verify/zh_cn/body.txt", "x"));
    let (_d, s) = set(&files);
    let err = Templates::load(&s).expect_err("ambiguous").to_string();
    assert!(err.contains("zh-CN") && err.contains("zh_cn"), "{err}");

    // A template file linked to a file outside the directory.
    let outside = tempdir::Dir::new();
    let secret = outside.0.join("secret.txt");
    std::fs::write(&secret, "secret").unwrap();
    let (d, s) = set(OK);
    let link = d.0.join("verify/en/body.html");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let err = Templates::load(&s).expect_err("escaping link").to_string();
    assert!(
        err.contains("body.html") && err.contains("outside"),
        "{err}"
    );

    // A purpose directory linked from inside is followed, not ignored.
    let (d, s) = set(OK);
    std::os::unix::fs::symlink(d.0.join("verify"), d.0.join("reset")).unwrap();
    let t = Templates::load(&s).expect("a link inside the directory");
    assert!(t.has_purpose(&Name::parse("purpose", "reset").unwrap()));

    // A purpose directory linked to elsewhere is refused.
    let (d, s) = set(OK);
    std::os::unix::fs::symlink(&outside.0, d.0.join("other")).unwrap();
    let err = Templates::load(&s).expect_err("escaping dir").to_string();
    assert!(err.contains("other") && err.contains("outside"), "{err}");
}

/// Lays the files of `dir` out as a ConfigMap volume does: the files in
/// a hidden `..<timestamp>` directory, `..data` linking to it, and each
/// top-level entry a link through `..data`.
fn as_configmap_volume(dir: &std::path::Path) {
    let stamp = dir.join("..2026_11_26_01_00_00.123");
    std::fs::create_dir(&stamp).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with('.') {
            std::fs::rename(entry.path(), stamp.join(&name)).unwrap();
            let through = std::path::Path::new("..data").join(&name);
            std::os::unix::fs::symlink(through, dir.join(&name)).unwrap();
        }
    }
    std::os::unix::fs::symlink("..2026_11_26_01_00_00.123", dir.join("..data")).unwrap();
}

/// A ConfigMap volume (deploy/k8s/) of nested files (mapped by
/// `items`). It loaded as a layout error ("..data" is no purpose name).
#[test]
fn a_kubernetes_configmap_volume_loads() {
    let (d, s) = set(OK);
    as_configmap_volume(&d.0);
    let t = Templates::load(&s).expect("a ConfigMap volume loads");
    assert!(t.has_purpose(&Name::parse("purpose", "verify").unwrap()));
}

/// A ConfigMap's keys cannot hold '/': one mounted whole (as a
/// kustomize configMapGenerator's is, with no `items` list to keep)
/// holds `<purpose>.<locale>.<file>`, which loads and renders as the
/// nested layout does; shared files beside them stay shared.
#[test]
fn a_configmap_of_flat_names_loads_as_the_nested_layout() {
    let layout = ("layout.html", "<html>{% block body %}{% endblock %}</html>");
    let html = "{% extends 'layout.html' %}{% block body %}{{ code }}{% endblock %}";
    let mut nested = OK.to_vec();
    nested.extend([layout, ("verify/zh/body.html", html)]);
    let flat_names: Vec<String> = nested.iter().map(|(p, _)| p.replace('/', ".")).collect();
    let flat: Vec<(&str, &str)> = flat_names
        .iter()
        .zip(&nested)
        .map(|(name, (_, body))| (name.as_str(), *body))
        .collect();
    let (_n, n) = set(&nested);
    let (d, f) = set(&flat);
    as_configmap_volume(&d.0);
    let (nested, flat) = (Templates::load(&n).unwrap(), Templates::load(&f).unwrap());
    assert_eq!(
        flat.sets().collect::<Vec<_>>(),
        nested.sets().collect::<Vec<_>>()
    );
    assert_eq!(flat.with_html, nested.with_html);
    for (purpose, locale) in nested.sets() {
        let ctx = sample_context(purpose, locale, true);
        assert_eq!(
            flat.render_set(purpose, locale, &ctx).unwrap(),
            nested.render_set(purpose, locale, &ctx).unwrap()
        );
    }
    let ctx = sample_context("verify", "zh", true);
    let zh = flat.render_set("verify", "zh", &ctx).unwrap();
    assert_eq!(zh.html.as_deref(), Some("<html>123456</html>"));
}

/// One set given twice, nested and flat, or a flat set lacking a part,
/// is a layout error that names the files: never one silently chosen.
#[test]
fn a_flat_set_is_held_to_the_nested_rules() {
    let mut both = OK.to_vec();
    both.extend([("verify.en.subject.txt", "x"), ("verify.en.body.txt", "x")]);
    let (_d, s) = set(&both);
    let err = Templates::load(&s).unwrap_err().to_string();
    assert!(err.contains("nested and flat"), "{err}");
    assert!(err.contains("verify.en.*"), "{err}");

    let mut partial = OK.to_vec();
    partial.push(("verify.de.subject.txt", "x"));
    let (_d, s) = set(&partial);
    let err = Templates::load(&s).unwrap_err().to_string();
    assert!(err.contains("verify/de has no body.txt"), "{err}");
    assert!(err.contains("verify.de.*"), "{err}");

    for misspelt in [
        "verify.de.Subject.txt",
        "verify.en.body.htm",
        "verify.pt.BR.subject.txt",
    ] {
        let mut files = OK.to_vec();
        files.push((misspelt, "x"));
        let (_d, s) = set(&files);
        let err = Templates::load(&s).unwrap_err().to_string();
        assert!(
            err.contains(misspelt) && err.contains("named as a file of"),
            "{err}"
        );
    }
    let mut shared = OK.to_vec();
    shared.push(("email.base.html", "shared, of no set's name"));
    let (_d, s) = set(&shared);
    Templates::load(&s).expect("a shared file named after no purpose loads");

    let mut same_locale = OK.to_vec();
    same_locale.extend([
        ("verify.ZH_cn.subject.txt", "x"),
        ("verify.ZH_cn.body.txt", "x"),
    ]);
    let (_d, s) = set(&same_locale);
    let err = Templates::load(&s).unwrap_err().to_string();
    assert!(err.contains("are the same locale"), "{err}");
}
