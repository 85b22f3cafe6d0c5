//! What the docs show works: every shipped config file, and every URL form
//! the README, the contract and the config files mention, is accepted by
//! `mailgate check-config` (which loads and checks the settings and the
//! templates, and parses every URL).

use std::process::Command;

/// Every `scheme://…` the docs mention for the three URLs mailgate takes,
/// with placeholders filled in, by the variable that sets it.
fn documented_urls() -> Vec<(&'static str, String)> {
    let mut text = String::new();
    for f in [
        "README.md",
        "docs/contract.md",
        "config/default.toml",
        "config/docker.toml",
    ] {
        text.push_str(&std::fs::read_to_string(f).expect("a doc"));
        text.push('\n');
    }
    let schemes = [
        ("amqp", "MAILGATE__AMQP__URL"),
        ("amqps", "MAILGATE__AMQP__URL"),
        ("redis", "MAILGATE__REDIS__URL"),
        ("rediss", "MAILGATE__REDIS__URL"),
        ("redis+sentinel", "MAILGATE__REDIS__URL"),
        ("rediss+sentinel", "MAILGATE__REDIS__URL"),
        ("redis+cluster", "MAILGATE__REDIS__URL"),
        ("rediss+cluster", "MAILGATE__REDIS__URL"),
        ("memory", "MAILGATE__REDIS__URL"),
        ("smtp", "MAILGATE__SMTP__URL"),
        ("smtps", "MAILGATE__SMTP__URL"),
        ("file", "MAILGATE__SMTP__URL"),
    ];
    let mut out = Vec::new();
    for (i, _) in text.match_indices("://") {
        let start = text[..i]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '+'))
            .map_or(0, |p| p + 1);
        let scheme = &text[start..i];
        let Some((_, var)) = schemes.iter().find(|(s, _)| *s == scheme) else {
            continue;
        };
        // A Sentinel URL lists its hosts with commas.
        let stops = if scheme.ends_with("+sentinel") || scheme.ends_with("+cluster") {
            "`|)\"'"
        } else {
            "`|)\"',"
        };
        let end = text[i..]
            .find(|c: char| c.is_whitespace() || stops.contains(c))
            .map_or(text.len(), |p| i + p);
        let url = text[start..end].trim_end_matches(['.', ';']);
        if url.contains("***") {
            continue; // a redacted example of an error message
        }
        let mut filled = url
            .replace("host:port", "mail.example.com:1025")
            .replace("DIR", "outbox")
            .replace("h1:p1,h2:p2", "127.0.0.1:7000,127.0.0.1:7001");
        // A scheme named alone: any host of that form.
        if filled.ends_with("://") && scheme.ends_with("+cluster") {
            filled.push_str("node.example.com:6379");
        } else if filled.ends_with("://") && scheme.ends_with("+sentinel") {
            filled.push_str("sentinel.example.com:26379/mymaster");
        } else if filled.ends_with("://") && scheme == "file" {
            // An outbox outside the checkout (check-config creates it).
            let dir = std::env::temp_dir().join("mailgate-docs-outbox");
            filled.push_str(&dir.to_string_lossy());
        } else if filled.ends_with("://") && scheme != "memory" {
            filled.push_str("service.example.com");
        }
        out.push((*var, filled));
    }
    out.sort();
    out.dedup();
    out
}

fn check_config(envs: &[(&str, &str)], config: &str) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mailgate"));
    c.args(["--config", config, "check-config"]);
    for (k, v) in envs {
        c.env(k, v);
    }
    c.output().expect("mailgate runs")
}

/// The environment docker-compose.yml gives the worker (config/docker.toml
/// keeps secrets out of the file).
fn compose_env() -> Vec<(&'static str, String)> {
    let compose = std::fs::read_to_string("docker-compose.yml").expect("the compose file");
    let mut env = Vec::new();
    for key in ["MAILGATE__AMQP__URL", "MAILGATE__SMTP__URL"] {
        let line = compose
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key}:")))
            .unwrap_or_else(|| panic!("docker-compose.yml sets {key}"));
        // `${VAR:-default}`: the default.
        let value = line
            .split_once(":-")
            .and_then(|(_, v)| v.rsplit_once('}'))
            .map(|(v, _)| v.to_owned())
            .unwrap_or_else(|| panic!("{line}"));
        env.push((key, value));
    }
    env
}

#[test]
fn every_shipped_config_file_is_accepted() {
    for config in ["config/default.toml", "config/docker.toml"] {
        let env = if config.contains("docker") {
            compose_env()
        } else {
            Vec::new()
        };
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let out = check_config(&env, config);
        assert!(
            out.status.success(),
            "{config}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn every_documented_url_form_is_accepted() {
    let urls = documented_urls();
    assert!(urls.len() >= 8, "found the documented URLs: {urls:?}");
    for (var, url) in &urls {
        // A cluster needs a hash tag in the key prefix.
        let mut env = vec![(*var, url.as_str())];
        if url.contains("+cluster://") {
            env.push(("MAILGATE__REDIS__KEY_PREFIX", "{mailgate}:"));
        }
        let out = check_config(&env, "config/default.toml");
        assert!(
            out.status.success(),
            "{var}={url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // And a malformed one (a Sentinel URL naming no service) is refused,
    // naming the key.
    let out = check_config(
        &[("MAILGATE__REDIS__URL", "redis+sentinel://a:26379")],
        "config/default.toml",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("redis.url"));
}

/// The compose file's Redis is patched against the Lua use-after-free
/// (CVE-2025-49844: 7.2.11, 7.4.6, 8.2.2 or later in their lines), and its
/// RabbitMQ is 4.x, where quorum queues are the norm.
#[test]
fn compose_pins_patched_images() {
    let compose = std::fs::read_to_string("docker-compose.yml").expect("the compose file");
    let version = |image: &str| -> Vec<u32> {
        let line = compose
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("image: {image}:")))
            .unwrap_or_else(|| panic!("docker-compose.yml pins {image}"));
        let tag = line.split(['-', ' ']).next().unwrap_or_default();
        let v: Vec<u32> = tag.split('.').map(|p| p.parse().expect(tag)).collect();
        assert_eq!(v.len(), 3, "{image}:{tag} pins a patch version");
        v
    };
    let redis = version("redis");
    let patched = match (redis[0], redis[1]) {
        (7, 2) => redis[2] >= 11,
        (7, 4) => redis[2] >= 6,
        (8, 2) => redis[2] >= 2,
        (major, minor) => major > 8 || (major == 8 && minor > 2),
    };
    assert!(
        patched,
        "redis {redis:?} is not patched against CVE-2025-49844"
    );
    assert!(version("rabbitmq")[0] >= 4);
}

/// The `[[smtp.relays]]` example commented in config/default.toml, and the
/// ones in the README and the contract, are accepted in place of
/// `smtp.url`.
#[test]
fn the_documented_relay_lists_are_accepted() {
    let default = std::fs::read_to_string("config/default.toml").expect("config/default.toml");
    // Uncomment the example and comment out `url` instead.
    let mut in_example = false;
    let mut lines = Vec::new();
    for line in default.lines() {
        if line.starts_with("# [[smtp.relays]]") {
            in_example = true;
        } else if !line.starts_with("# ") {
            in_example = false;
        }
        if in_example {
            lines.push(line.trim_start_matches("# ").to_owned());
        } else if line.starts_with("url = \"file://") {
            lines.push(format!("# {line}"));
        } else {
            lines.push(line.to_owned());
        }
    }
    let with_relays = lines.join("\n");
    assert!(
        with_relays.contains("\n[[smtp.relays]]\nurl = "),
        "{with_relays}"
    );
    let mut configs = vec![with_relays];
    // The docs' TOML blocks that list relays, in the default file's place.
    for doc in ["README.md", "docs/contract.md"] {
        let text = std::fs::read_to_string(doc).expect("a doc");
        let blocks: Vec<&str> = text
            .split("```toml\n")
            .skip(1)
            .filter_map(|b| b.split("```").next())
            .filter(|b| b.contains("[[smtp.relays]]"))
            .collect();
        assert!(!blocks.is_empty(), "{doc} shows [[smtp.relays]]");
        for block in blocks {
            // Indented in a list item: dedent.
            let block: String = block
                .lines()
                .map(|l| format!("{}\n", l.trim_start()))
                .collect();
            let mut base = default.replace("url = \"file://outbox\"", "# (relays below)");
            if block.contains("[smtp.circuit]") {
                // The block's own circuit settings replace the file's.
                base = base
                    .lines()
                    .filter(|l| {
                        !(l.starts_with("[smtp.circuit]")
                            || l.starts_with("failures =")
                            || l.starts_with("cool_down ="))
                    })
                    .collect::<Vec<_>>()
                    .join("\n");
            }
            // Appended after the last section, the block's tables stand alone.
            configs.push(format!("{base}\n{block}"));
        }
    }
    for (i, config) in configs.iter().enumerate() {
        let path = std::env::temp_dir().join(format!(
            "mailgate-docs-relays-{i}-{}.toml",
            std::process::id()
        ));
        std::fs::write(&path, config).unwrap();
        let out = check_config(&[], path.to_str().unwrap());
        let _ = std::fs::remove_file(&path);
        assert!(
            out.status.success(),
            "{config}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
