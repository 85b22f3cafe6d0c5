//! A scripted SMTP server (a tokio TcpListener on a free port) for tests of
//! the mailer's connection handling. It speaks just enough SMTP (greeting,
//! EHLO, AUTH, STARTTLS (always refused), MAIL, RCPT, DATA, the final dot,
//! RSET, NOOP, QUIT), answers with scripted codes and delays, and records
//! every connection: the commands it received, the mails whose final dot
//! arrived, how many connections were open at once.
//!
//! Unlike mailin (see `smtp.rs`) it can fault the end of data and keep the
//! session consistent, delay any reply, and close connections on cue.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// A scripted answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub code: u16,
    pub delay: Duration,
    /// Close the connection right after answering.
    pub close: bool,
    /// The reply's text, if not the default (e.g. an enhanced status code
    /// and a reason: `4.3.1 insufficient system storage`).
    pub text: Option<String>,
}

/// `code`, at once, connection kept.
pub(crate) fn reply(code: u16) -> Reply {
    Reply {
        code,
        delay: Duration::ZERO,
        close: false,
        text: None,
    }
}

impl Reply {
    /// Answer only after `delay`.
    pub(crate) fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Close the connection after answering.
    pub(crate) fn then_close(mut self) -> Self {
        self.close = true;
        self
    }

    /// Answer with this text after the code.
    pub(crate) fn saying(mut self, text: &str) -> Self {
        self.text = Some(text.to_owned());
        self
    }
}

struct Rule {
    verb: String,
    needle: Option<String>,
    reply: Reply,
}

/// A mail whose final dot the server received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    /// The connection (0-based, in accept order) it came on.
    pub conn: usize,
    pub to: Vec<String>,
    /// What the server answered to the final dot.
    pub code: u16,
}

struct State {
    greeting: u16,
    capabilities: Vec<String>,
    rules: Vec<Rule>,
    close_after_mail: bool,
    end_of_data_delay: Duration,
    sessions: Vec<Vec<String>>,
    mails: Vec<Received>,
    open: usize,
    max_open: usize,
}

/// The running server; it lives until the test's runtime ends.
#[derive(Clone)]
pub(crate) struct ScriptedSmtp {
    pub port: u16,
    state: Arc<Mutex<State>>,
}

impl ScriptedSmtp {
    pub(crate) async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(Mutex::new(State {
            greeting: 220,
            capabilities: vec!["8BITMIME".into()],
            rules: Vec::new(),
            close_after_mail: false,
            end_of_data_delay: Duration::ZERO,
            sessions: Vec::new(),
            mails: Vec::new(),
            open: 0,
            max_open: 0,
        }));
        let server = Self { port, state };
        let s = server.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                tokio::spawn(async move { s.session(stream).await });
            }
        });
        server
    }

    /// `smtp://127.0.0.1:<port>` (opportunistic STARTTLS, never offered).
    pub(crate) fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// The greeting code for new connections (220; e.g. 421 to refuse them).
    pub(crate) fn greet_with(&self, code: u16) {
        self.state().greeting = code;
    }

    /// EHLO keywords besides `8BITMIME`, e.g. `STARTTLS`, `AUTH PLAIN LOGIN`.
    pub(crate) fn advertise(&self, keywords: &[&str]) {
        let mut s = self.state();
        s.capabilities
            .extend(keywords.iter().map(|k| k.to_string()));
    }

    /// The next `verb` (`MAIL`, `RCPT`, `DATA`, `NOOP`, `AUTH`, or `.` for
    /// the end of data) whose line (for `.`: whose message) contains
    /// `needle` gets `reply`, once.
    pub(crate) fn on(&self, verb: &str, needle: Option<&str>, reply: Reply) {
        self.state().rules.push(Rule {
            verb: verb.into(),
            needle: needle.map(Into::into),
            reply,
        });
    }

    /// Close each connection right after accepting a mail on it, as a
    /// server does with idle clients.
    pub(crate) fn close_after_mail(&self, yes: bool) {
        self.state().close_after_mail = yes;
    }

    /// Every end of data is answered after `delay`.
    pub(crate) fn slow_end_of_data(&self, delay: Duration) {
        self.state().end_of_data_delay = delay;
    }

    /// Connections accepted so far.
    pub(crate) fn connections(&self) -> usize {
        self.state().sessions.len()
    }

    /// The most connections open at the same time.
    pub(crate) fn max_open(&self) -> usize {
        self.state().max_open
    }

    /// The command lines connection `n` received, in order.
    pub(crate) fn commands(&self, n: usize) -> Vec<String> {
        self.state().sessions[n].clone()
    }

    /// The first word of each command connection `n` received.
    pub(crate) fn verbs(&self, n: usize) -> Vec<String> {
        self.commands(n)
            .iter()
            .map(|c| c.split(' ').next().unwrap_or("").to_ascii_uppercase())
            .collect()
    }

    /// Every mail whose final dot arrived, accepted or not.
    pub(crate) fn mails(&self) -> Vec<Received> {
        self.state().mails.clone()
    }

    /// The mails answered 250 whose recipient contains `needle`.
    pub(crate) fn accepted_to(&self, needle: &str) -> Vec<Received> {
        self.mails()
            .into_iter()
            .filter(|m| m.code == 250 && m.to.iter().any(|t| t.contains(needle)))
            .collect()
    }

    fn scripted(&self, verb: &str, text: &str) -> Option<Reply> {
        let mut s = self.state();
        let i = s
            .rules
            .iter()
            .position(|r| r.verb == verb && r.needle.as_deref().is_none_or(|n| text.contains(n)))?;
        Some(s.rules.remove(i).reply)
    }

    async fn session(&self, stream: TcpStream) {
        let conn = {
            let mut s = self.state();
            s.sessions.push(Vec::new());
            s.open += 1;
            s.max_open = s.max_open.max(s.open);
            s.sessions.len() - 1
        };
        let _ = self.converse(stream, conn).await;
        self.state().open -= 1;
    }

    async fn converse(&self, stream: TcpStream, conn: usize) -> std::io::Result<()> {
        // Replies to pipelined commands go out at once, as from a server that
        // flushes its replies when its input runs dry (RFC 2920): without this,
        // Nagle would hold the second reply for the client's delayed ACK.
        stream.set_nodelay(true)?;
        let (r, mut w) = stream.into_split();
        let mut r = BufReader::new(r);
        let greeting = self.state().greeting;
        w.write_all(format!("{greeting} scripted.test ESMTP\r\n").as_bytes())
            .await?;
        if greeting != 220 {
            return Ok(());
        }
        let mut mail = Mail::default();
        let mut line = String::new();
        loop {
            line.clear();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            if mail.in_data {
                if line != ".\r\n" {
                    mail.data.push_str(&line);
                    continue;
                }
                mail.in_data = false;
                if !self.end_of_data(&mut w, conn, &mail).await? {
                    return Ok(());
                }
                continue;
            }
            let command = line.trim_end().to_owned();
            self.state().sessions[conn].push(command.clone());
            if !self.answer(&mut w, &command, &mut mail).await? {
                return Ok(());
            }
        }
    }

    /// Answers one command; `false` once the connection is to be closed.
    async fn answer(
        &self,
        w: &mut tokio::net::tcp::OwnedWriteHalf,
        command: &str,
        mail: &mut Mail,
    ) -> std::io::Result<bool> {
        let verb = command.split(' ').next().unwrap_or("").to_ascii_uppercase();
        let (default, text) = match verb.as_str() {
            "EHLO" => return self.ehlo(w).await.map(|()| true),
            "HELO" | "RSET" | "NOOP" => (250, "ok"),
            "MAIL" => (250, "sender ok"),
            "RCPT" => (250, "recipient ok"),
            "DATA" => (354, "go on"),
            "AUTH" => (235, "authenticated"),
            "STARTTLS" => (454, "TLS not available"),
            "QUIT" => (221, "bye"),
            _ => (502, "not implemented"),
        };
        let reply = self.scripted(&verb, command).unwrap_or(Reply {
            code: default,
            delay: Duration::ZERO,
            close: verb == "QUIT",
            text: None,
        });
        let ok = reply.code < 400;
        match verb.as_str() {
            "MAIL" => *mail = Mail::default(),
            "RCPT" if ok => mail.to.push(command.to_owned()),
            "DATA" if reply.code == 354 => mail.in_data = true,
            _ => {}
        }
        let text = if ok { text } else { "scripted failure" };
        respond(w, &reply, text).await
    }

    /// Answers the final dot and records the mail.
    async fn end_of_data(
        &self,
        w: &mut tokio::net::tcp::OwnedWriteHalf,
        conn: usize,
        mail: &Mail,
    ) -> std::io::Result<bool> {
        let (delay, close) = {
            let s = self.state();
            (s.end_of_data_delay, s.close_after_mail)
        };
        let reply = self.scripted(".", &mail.data).unwrap_or(Reply {
            code: 250,
            delay,
            close,
            text: None,
        });
        self.state().mails.push(Received {
            conn,
            to: mail.to.clone(),
            code: reply.code,
        });
        respond(w, &reply, "queued").await
    }

    async fn ehlo(&self, w: &mut tokio::net::tcp::OwnedWriteHalf) -> std::io::Result<()> {
        let mut out = String::from("250-scripted.test\r\n");
        let caps = self.state().capabilities.clone();
        for (i, c) in caps.iter().enumerate() {
            let sep = if i + 1 == caps.len() { ' ' } else { '-' };
            out.push_str(&format!("250{sep}{c}\r\n"));
        }
        w.write_all(out.as_bytes()).await
    }
}

#[derive(Default)]
struct Mail {
    to: Vec<String>,
    data: String,
    in_data: bool,
}

async fn respond(
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    reply: &Reply,
    text: &str,
) -> std::io::Result<bool> {
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let text = reply.text.as_deref().unwrap_or(text);
    w.write_all(format!("{} {text}\r\n", reply.code).as_bytes())
        .await?;
    if reply.close {
        let _ = w.shutdown().await;
        return Ok(false);
    }
    Ok(true)
}

/// Standard base64 (with padding), to check what AUTH PLAIN carried.
pub(crate) fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Composes a code mail to `to` and sends it with `m`, as the worker does
/// (a slot first, then the send).
pub(crate) async fn send_code(
    m: &mailgate::mailer::Mailer,
    to: &str,
) -> Result<(), mailgate::mailer::MailError> {
    let to = mailgate::domain::EmailAddress::parse(to).expect("address");
    let mail = m
        .compose(&mailgate::mailer::Outgoing {
            to: &to,
            subject: "Your code",
            text: "Your code is 493817",
            html: None,
        })
        .expect("compose");
    let slot = m.reserve().await;
    m.send(
        slot,
        mail,
        &mailgate::domain::JobId::parse("script").unwrap(),
    )
    .await
}

/// The verbs the server received, over every connection.
pub(crate) fn all_verbs(server: &ScriptedSmtp) -> Vec<String> {
    (0..server.connections())
        .flat_map(|c| server.verbs(c))
        .collect()
}
