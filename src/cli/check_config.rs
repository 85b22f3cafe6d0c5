//! `mailgate check-config`: validate the settings, render every template,
//! and with `--connect` reach each service.

use anyhow::Context as _;

use super::{amqp, limiter};
use crate::ledger::Ledger;
use crate::mailer::Mailer;
use crate::redact::redact_url;
use crate::settings::Settings;
use crate::templates::Templates;

/// Checks settings and templates (and, with `connect`, the services),
/// printing a report. Returns whether everything checked out.
pub async fn check_config(settings: &Settings, connect: bool) -> anyhow::Result<bool> {
    let templates = Templates::load(&settings.templates).context("templates")?;
    templates.check_purposes(settings.limits.purpose.keys().map(String::as_str))?;
    // smtp.url and smtp.from are read by the mailer: checked before the
    // settings are said to be ok.
    let mailer = Mailer::new(&settings.smtp)?;
    let sets: Vec<String> = templates.sets().map(|(p, l)| format!("{p}/{l}")).collect();
    println!("settings: ok");
    println!(
        "templates: ok, {} sets rendered with sample data: {}",
        sets.len(),
        sets.join(", ")
    );
    for warning in settings.warnings() {
        println!("warning: {warning}");
    }
    for body in templates.without_code() {
        println!(
            "warning: {body} does not show the code ({{{{ code }}}}): its mails are of no use"
        );
    }
    if let Some(dir) = mailer.outbox() {
        println!(
            "warning: smtp.url is file://: mail is written to {} as .eml files, not sent",
            dir.display()
        );
    }
    if !connect {
        return Ok(true);
    }
    let mut ok = true;
    let mut report = |name: &str, r: anyhow::Result<()>| match r {
        Ok(()) => println!("{name}: ok"),
        Err(e) => {
            ok = false;
            println!("{name}: FAILED: {}", super::one_line(&e));
        }
    };
    report("rabbitmq", amqp(settings).await.map(|(c, _)| drop(c)));
    let redis = async {
        limiter(settings).await?.health().await?;
        anyhow::Ok(())
    };
    report("redis", redis.await);
    let several = settings.smtp.relay_list().is_ok_and(|r| r.len() > 1);
    // A TLS failure says what to set itself; another is pointed at the URL.
    let tls = |e: &crate::mailer::MailError| {
        let text = e.to_string();
        text.contains("certificate") || text.contains("TLS")
    };
    if !several {
        let at = redact_url(&settings.smtp.url);
        report(
            "smtp",
            (mailer.check().await).map_err(|e| {
                let hint = if tls(&e) {
                    ""
                } else {
                    " (set [smtp] url or MAILGATE__SMTP__URL)"
                };
                anyhow::Error::new(e).context(format!("SMTP at {at}{hint}"))
            }),
        );
    } else {
        // Every relay on its own: a standby that does not work is worth
        // knowing before it is needed.
        for (name, r) in mailer.check_each().await {
            let r = r.map_err(|e| match tls(&e) {
                true => anyhow::Error::new(e),
                false => anyhow::Error::new(e)
                    .context("set its url under [[smtp.relays]] or in smtp.url"),
            });
            report(&format!("smtp relay {name}"), r);
        }
    }
    Ok(ok)
}
