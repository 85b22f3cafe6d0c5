//! Mail templates: minijinja files under `<dir>/<purpose>/<locale>/`:
//! `subject.txt`, `body.txt` and optionally `body.html`. Files directly in
//! `<dir>` (e.g. `layout.html`) are shared: any template may
//! `{% extends "layout.html" %}` or `{% include %}` them. A set may also
//! lie flat in `<dir>`, as `<purpose>.<locale>.<file>` (`verify.en.body.txt`):
//! the form of a Kubernetes ConfigMap mounted whole, whose keys cannot hold
//! '/'. Purpose and locale names hold no '.', so the two forms cannot be
//! confused; one set in both is refused.
//!
//! Everything is loaded, compiled and test-rendered at start-up, so a broken
//! template stops the worker before it consumes anything; at run time no file
//! is read, so no job field can name a path. HTML templates are auto-escaped,
//! and job `vars` are values in the context, never template source, so
//! `{{ ... }}` in a variable is printed, not executed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use minijinja::{Environment, UndefinedBehavior, Value};

use crate::domain::{Job, Name, VarValue};
use crate::settings::TemplateSettings;

/// The parts of one mail, rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// One line, trimmed.
    pub subject: String,
    /// The plain-text body.
    pub text: String,
    /// The HTML body, when the template set has one.
    pub html: Option<String>,
    /// The locale whose templates were used, after fallback.
    pub locale: String,
}

/// Why templates could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template directory, or a file in it, could not be read.
    #[error("cannot read templates at {path}")]
    Read {
        /// The path that failed.
        path: String,
        /// The I/O error.
        #[source]
        error: std::io::Error,
    },
    /// The directory holds no template sets, or one lacks a required file.
    #[error("template layout: {0}")]
    Layout(String),
    /// A template does not compile or fails to render with sample data.
    #[error("template {name}")]
    Template {
        /// `<purpose>/<locale>/<file>`.
        name: String,
        /// What minijinja said (naming the expression at fault, with the
        /// environment's debug mode on, as while loading).
        #[source]
        error: minijinja::Error,
    },
    /// No template set has this purpose (the job is answered `invalid`).
    #[error("unknown purpose {0:?}: no template set has that name")]
    UnknownPurpose(String),
    /// `[limits.purpose.<name>]` names a purpose no template set has: a
    /// typo, whose rules would never apply.
    #[error(
        "limits.purpose.{purpose}: no template set is named {purpose:?}, so these rules would \
         never apply (template sets: {known}); fix the name, or add templates/{purpose}/"
    )]
    LimitsOfUnknownPurpose {
        /// The name in the settings.
        purpose: String,
        /// The purposes there are templates for, comma-separated.
        known: String,
    },
}

/// The loaded templates.
#[derive(Debug)]
pub struct Templates {
    env: Environment<'static>,
    /// purpose → (lower-case locale → locale directory name).
    locales: BTreeMap<String, BTreeMap<String, String>>,
    /// `<purpose>/<locale>` sets that have a `body.html`.
    with_html: BTreeSet<String>,
    default_locale: String,
}

/// One template set's files, as found on disk: `<purpose>/<locale>/<file>`
/// or, flat, `<purpose>.<locale>.<file>` directly in the template
/// directory (a Kubernetes ConfigMap's keys cannot hold '/', so a
/// ConfigMap mounted whole gives this form).
#[derive(Debug, Default)]
struct SetFiles {
    /// `<file>` (one of [`SUBJECT`], [`TEXT`], [`HTML`]) → its path.
    files: BTreeMap<&'static str, std::path::PathBuf>,
    /// Where the set is, for errors: its directory or its flat prefix.
    shown: String,
}

/// Adds the templates of the set `set` (`<purpose>/<locale>`) to `env`;
/// whether it has an HTML body.
fn add_set(
    env: &mut Environment<'static>,
    root: &std::path::Path,
    found: &SetFiles,
    set: &str,
) -> Result<bool, TemplateError> {
    for file in [SUBJECT, TEXT] {
        if !found.files.contains_key(file) {
            return Err(TemplateError::Layout(format!(
                "{set} has no {file}: a locale needs {SUBJECT} and {TEXT}, and may have \
                 {HTML} (in {})",
                found.shown
            )));
        }
    }
    for (file, path) in &found.files {
        let path = inside(root, path)?;
        let source = std::fs::read_to_string(&path).map_err(|error| TemplateError::Read {
            path: path.display().to_string(),
            error,
        })?;
        let name = format!("{set}/{file}");
        env.add_template_owned(name.clone(), source)
            .map_err(|error| TemplateError::Template { name, error })?;
    }
    Ok(found.files.contains_key(HTML))
}

/// `dir` as an error names it: absolute, and, if the settings gave it
/// relative, saying what it is relative to.
fn where_is(dir: &std::path::Path) -> String {
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned());
    if dir.is_relative() {
        format!(
            "{} (templates.dir {:?} is relative to the current folder, not to the settings file)",
            absolute.display(),
            dir.display()
        )
    } else {
        absolute.display().to_string()
    }
}

const SUBJECT: &str = "subject.txt";
const TEXT: &str = "body.txt";
const HTML: &str = "body.html";

impl Templates {
    /// Loads every template set under `settings.dir`, compiles each template
    /// and renders it with sample data. Every purpose must have the default
    /// locale.
    pub fn load(settings: &TemplateSettings) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        // Printing an unknown name fails (a typo is caught by the start-up
        // check); testing one in `{% if %}` is allowed, for optional vars.
        env.set_undefined_behavior(UndefinedBehavior::SemiStrict);
        // While loading, errors name the expression at fault (`vars.nam`
        // is undefined); off once every set rendered.
        env.set_debug(true);
        let mut locales: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        let mut with_html = BTreeSet::new();
        let root = settings
            .dir
            .canonicalize()
            .map_err(|error| TemplateError::Read {
                path: where_is(&settings.dir),
                error,
            })?;
        let (shared, sets) = files(&settings.dir, &root)?;
        for (name, path) in shared {
            let source = std::fs::read_to_string(&path).map_err(|error| TemplateError::Read {
                path: path.display().to_string(),
                error,
            })?;
            env.add_template_owned(name.clone(), source)
                .map_err(|error| TemplateError::Template { name, error })?;
        }
        for ((purpose, locale), found) in &sets {
            // `zh_CN` and `zh-cn` name one locale: two such sets would hide
            // one another.
            if let Some(other) = locales
                .get(purpose)
                .and_then(|l| l.get(&locale_key(locale)))
            {
                let shown = &sets[&(purpose.clone(), other.clone())].shown;
                return Err(TemplateError::Layout(format!(
                    "{shown} and {} are the same locale (case and '_'/'-' do not matter); \
                     keep one",
                    found.shown
                )));
            }
            if add_set(&mut env, &root, found, &format!("{purpose}/{locale}"))? {
                with_html.insert(format!("{purpose}/{locale}"));
            }
            locales
                .entry(purpose.clone())
                .or_default()
                .insert(locale_key(locale), locale.clone());
        }
        if locales.is_empty() {
            return Err(TemplateError::Layout(format!(
                "no template sets in {} (expected <purpose>/<locale>/{SUBJECT})",
                settings.dir.display()
            )));
        }
        let default_locale = settings.default_locale.clone();
        for (purpose, sets) in &locales {
            if !sets.contains_key(&locale_key(&default_locale)) {
                return Err(TemplateError::Layout(format!(
                    "purpose {purpose:?} has no templates for the default locale {default_locale:?}"
                )));
            }
        }
        let mut templates = Self {
            env,
            locales,
            with_html,
            default_locale,
        };
        templates.check()?;
        templates.env.set_debug(false);
        Ok(templates)
    }

    /// Renders every template set with sample data, once with every optional
    /// value and once with none, so that a template that compiles but cannot
    /// render (an unknown variable, a bad filter) is found now and not on a
    /// user's job.
    fn check(&self) -> Result<(), TemplateError> {
        for (purpose, sets) in &self.locales {
            for locale in sets.values() {
                for full in [true, false] {
                    self.render_set(purpose, locale, &sample_context(purpose, locale, full))?;
                }
            }
        }
        Ok(())
    }

    /// The bodies that do not show the code (`{{ code }}`): a mail without
    /// it is of no use, which `check-config` and the worker warn of. Each
    /// as `<purpose>/<locale>/<file>`.
    pub fn without_code(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (purpose, sets) in &self.locales {
            for locale in sets.values() {
                let ctx = sample_context(purpose, locale, true);
                let Ok(r) = self.render_set(purpose, locale, &ctx) else {
                    continue;
                };
                let code = SAMPLE_CODE;
                if !r.text.contains(code) {
                    found.push(format!("{purpose}/{locale}/{TEXT}"));
                }
                if r.html.is_some_and(|h| !h.contains(code)) {
                    found.push(format!("{purpose}/{locale}/{HTML}"));
                }
            }
        }
        found
    }

    /// The purposes there are templates for.
    pub fn purposes(&self) -> impl Iterator<Item = &str> {
        self.locales.keys().map(String::as_str)
    }

    /// Refuses rules of their own (`limits.purpose.<name>`) for a purpose
    /// no template set has: no job of it could be mailed, so the rules
    /// could only be a misspelt name of another purpose, whose stricter
    /// rules would then silently not apply.
    pub fn check_purposes<'a>(
        &self,
        named: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), TemplateError> {
        match named.into_iter().find(|p| !self.locales.contains_key(*p)) {
            None => Ok(()),
            Some(purpose) => Err(TemplateError::LimitsOfUnknownPurpose {
                purpose: purpose.to_owned(),
                known: self.purposes().collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// Every `(purpose, locale)` template set.
    pub fn sets(&self) -> impl Iterator<Item = (&str, &str)> {
        self.locales
            .iter()
            .flat_map(|(p, ls)| ls.values().map(move |l| (p.as_str(), l.as_str())))
    }

    /// Whether a purpose has templates.
    pub fn has_purpose(&self, purpose: &Name) -> bool {
        self.locales.contains_key(purpose.as_str())
    }

    /// The locale used for `requested`: itself, else its language (`zh-TW` →
    /// `zh`), else the default locale. Matching ignores case and treats `_`
    /// as `-`.
    pub fn resolve_locale(&self, purpose: &Name, requested: Option<&Name>) -> Option<&str> {
        let sets = self.locales.get(purpose.as_str())?;
        let mut candidates = Vec::with_capacity(3);
        if let Some(l) = requested {
            let key = locale_key(l.as_str());
            if let Some((lang, _)) = key.split_once('-') {
                candidates.push(lang.to_owned());
            }
            candidates.insert(0, key);
        }
        candidates.push(locale_key(&self.default_locale));
        candidates
            .iter()
            .find_map(|k| sets.get(k))
            .map(String::as_str)
    }

    /// Renders the mail for `job` at `now`.
    pub fn render(&self, job: &Job, now: jiff::Timestamp) -> Result<Rendered, TemplateError> {
        let locale = self
            .resolve_locale(&job.purpose, job.locale.as_ref())
            .ok_or_else(|| TemplateError::UnknownPurpose(job.purpose.to_string()))?;
        let vars: BTreeMap<&str, Value> = job
            .vars
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    VarValue::Text(s) => Value::from(s.as_str()),
                    VarValue::Integer(n) => Value::from(*n),
                    VarValue::Float(n) => Value::from(*n),
                    VarValue::Number(n) => Value::from(n.as_str()),
                    VarValue::Bool(b) => Value::from(*b),
                };
                (k, v)
            })
            .collect();
        let expires_in_minutes = job
            .expires_at
            .map(|at| ((at.as_second() - now.as_second()).max(0) as u64).div_ceil(60));
        let ctx = minijinja::context! {
            code => job.code.expose(),
            email => job.email.as_str(),
            purpose => job.purpose.as_str(),
            locale => locale,
            expires_at => job.expires_at.map(|t| t.to_string()),
            expires_in_minutes => expires_in_minutes,
            vars => vars,
        };
        self.render_set(job.purpose.as_str(), locale, &ctx)
    }

    fn render_set(
        &self,
        purpose: &str,
        locale: &str,
        ctx: &Value,
    ) -> Result<Rendered, TemplateError> {
        let render = |file: &str| -> Result<String, TemplateError> {
            let name = format!("{purpose}/{locale}/{file}");
            self.env
                .get_template(&name)
                .and_then(|t| t.render(ctx))
                .map_err(|error| TemplateError::Template { name, error })
        };
        let subject = render(SUBJECT)?;
        // A subject is one line: line breaks in a template become spaces.
        let subject = subject.split_whitespace().collect::<Vec<_>>().join(" ");
        let text = render(TEXT)?;
        let html = if self.with_html.contains(&format!("{purpose}/{locale}")) {
            Some(render(HTML)?)
        } else {
            None
        };
        Ok(Rendered {
            subject,
            text,
            html,
            locale: locale.to_owned(),
        })
    }
}

fn locale_key(locale: &str) -> String {
    locale.to_ascii_lowercase().replace('_', "-")
}

/// `path` resolved (symlinks followed), refused unless it lies inside the
/// template directory `root` (itself resolved): a link may not make the
/// worker read files from elsewhere.
fn inside(root: &Path, path: &Path) -> Result<std::path::PathBuf, TemplateError> {
    let resolved = path.canonicalize().map_err(|error| TemplateError::Read {
        path: path.display().to_string(),
        error,
    })?;
    if resolved.starts_with(root) {
        Ok(resolved)
    } else {
        Err(TemplateError::Layout(format!(
            "{} points to {}, outside the template directory {}",
            path.display(),
            resolved.display(),
            root.display()
        )))
    }
}

/// The template sets by `(purpose, locale)`.
type Sets = BTreeMap<(String, String), SetFiles>;

/// Every file of the template directory `dir`: the shared ones directly
/// in it, which templates may extend or include, by name; and the template
/// sets, nested (`<purpose>/<locale>/<file>`) or flat
/// (`<purpose>.<locale>.<file>`). One set in both forms is a layout error:
/// one would silently hide the other.
fn files(
    dir: &Path,
    root: &Path,
) -> Result<(Vec<(String, std::path::PathBuf)>, Sets), TemplateError> {
    let read = |error| TemplateError::Read {
        path: dir.display().to_string(),
        error,
    };
    let mut shared = Vec::new();
    let mut sets = Sets::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let entry = entry.map_err(read)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let path = inside(root, &entry.path())?;
        if !path.is_file() {
            continue;
        }
        match flat(&name) {
            Some((purpose, locale, file)) => {
                let set = sets
                    .entry((purpose.to_owned(), locale.to_owned()))
                    .or_default();
                set.shown = dir
                    .join(format!("{purpose}.{locale}.*"))
                    .display()
                    .to_string();
                set.files.insert(file, entry.path());
            }
            None => shared.push((name, path)),
        }
    }
    shared.sort();
    for purpose in subdirs(dir, root)? {
        let purpose_dir = dir.join(&purpose);
        for locale in subdirs(&purpose_dir, root)? {
            let set_dir = purpose_dir.join(&locale);
            let found: BTreeMap<_, _> = [SUBJECT, TEXT, HTML]
                .into_iter()
                .map(|file| (file, set_dir.join(file)))
                .filter(|(_, path)| path.exists())
                .collect();
            let shown = set_dir.display().to_string();
            let key = (purpose.clone(), locale);
            if let Some(other) = sets.get(&key) {
                return Err(TemplateError::Layout(format!(
                    "{shown} and {} are one template set, nested and flat; keep one",
                    other.shown
                )));
            }
            sets.insert(
                key,
                SetFiles {
                    files: found,
                    shown,
                },
            );
        }
    }
    // A shared file named as a set's would be (`verify.de.Subject.txt`,
    // `verify.en.body.htm`) is a misspelt template: refused, or its set
    // would silently fall back to another locale.
    if let Some((name, _)) = shared.iter().find(|(name, _)| {
        let mut parts = name.splitn(3, '.');
        let purpose = parts.next().unwrap_or_default();
        parts.nth(1).is_some() && sets.keys().any(|(p, _)| p == purpose)
    }) {
        return Err(TemplateError::Layout(format!(
            "{}: named as a file of template set {}, but a set's files are \
             <purpose>.<locale>.{SUBJECT}, {TEXT} or {HTML}",
            dir.join(name).display(),
            name.split('.').next().unwrap_or_default()
        )));
    }
    Ok((shared, sets))
}

/// `(purpose, locale, file)` of a flat template file's name
/// (`verify.en.body.txt`): both names valid, the file one of a set's.
/// Anything else directly in the directory is a shared file.
fn flat(name: &str) -> Option<(&str, &str, &'static str)> {
    let file = [SUBJECT, TEXT, HTML]
        .into_iter()
        .find(|file| name.ends_with(&format!(".{file}")))?;
    let prefix = &name[..name.len() - file.len() - 1];
    let (purpose, locale) = prefix.split_once('.')?;
    let valid = |n: &str| Name::parse("template name", n).is_ok();
    (valid(purpose) && valid(locale)).then_some((purpose, locale, file))
}

/// The names of the subdirectories of `dir` (symlinks to directories inside
/// `root` included) that are valid purpose or locale names; anything else
/// there is a layout error, so a typo does not vanish. Hidden ones are
/// skipped: a Kubernetes ConfigMap volume keeps its files in `..data` and
/// `..<timestamp>` beside the links to them.
fn subdirs(dir: &Path, root: &Path) -> Result<Vec<String>, TemplateError> {
    let read = |error| TemplateError::Read {
        path: dir.display().to_string(),
        error,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read)? {
        let entry = entry.map_err(read)?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !inside(root, &entry.path())?.is_dir() {
            continue;
        }
        if Name::parse("template directory", &name).is_err() {
            return Err(TemplateError::Layout(format!(
                "{}: directory names may hold only letters, digits, '-' and '_'",
                entry.path().display()
            )));
        }
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// What a job may give a template: with `full`, every optional value;
/// without, none of them.
/// The code the templates are rendered with when they are checked.
const SAMPLE_CODE: &str = "123456";

fn sample_context(purpose: &str, locale: &str, full: bool) -> Value {
    let vars = if full {
        minijinja::context! {
            app_name => "Example",
            support_email => "support@example.com",
        }
    } else {
        minijinja::context! {}
    };
    minijinja::context! {
        code => SAMPLE_CODE,
        email => "user@example.com",
        purpose => purpose,
        locale => locale,
        expires_at => full.then_some("2026-01-01T00:10:00Z"),
        expires_in_minutes => full.then_some(10),
        vars => vars,
    }
}

#[cfg(test)]
mod tests;
