//! The shipped config file loads, and environment variables override it.

use std::path::Path;

use mailgate::settings::Settings;

#[test]
fn default_config_loads_with_env_overrides() {
    // This test binary has this one test, so changing the environment
    // cannot race another test.
    unsafe {
        std::env::set_var("MAILGATE__REDIS__KEY_PREFIX", "from-env:");
        std::env::set_var("MAILGATE__LIMITS__IPV6_PREFIX", "48");
    }
    let s = Settings::load(Path::new("config/default.toml")).expect("config/default.toml loads");
    assert_eq!(s.redis.key_prefix, "from-env:");
    assert_eq!(s.limits.ipv6_prefix, 48);
    assert_eq!(s.limits.email.rules.len(), 3);
    assert_eq!(s.limits.ip.rules[2].window_ms(), 3_600_000);
    // The domain scope is on, with the big providers exempt.
    assert_eq!(s.limits.domain.rules[0].window_ms(), 600_000);
    assert!(
        s.limits
            .domain
            .exempt
            .iter()
            .any(|d| d.as_str() == "gmail.com")
    );
    assert!(
        s.limits
            .domain
            .exempt
            .iter()
            .any(|d| d.as_str() == "qq.com")
    );
    unsafe {
        std::env::set_var("MAILGATE__REDIS__NO_SUCH_KEY", "x");
    }
    let err = Settings::load(Path::new("config/default.toml")).expect_err("unknown key refused");
    // As the CLI shows it: the error and its cause.
    let err = mailgate::report::one_line(&err);
    assert!(err.contains("no_such_key"), "{err}");
}
