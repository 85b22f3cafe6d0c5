//! A real SMTP server inside the test (mailin-embedded) on a free port. It
//! records every accepted mail and answers on demand with 4xx/5xx replies,
//! or slowly.

use std::collections::VecDeque;

use std::net::{IpAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mailin_embedded::{Handler, Response, Server, response};

/// A mail the sink accepted.
#[derive(Debug, Clone)]
pub(crate) struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

#[derive(Default)]
struct State {
    mails: Vec<Mail>,
    /// Replies to give to the next RCPT commands, in order; 250 once empty.
    /// (Faults are injected at RCPT, as greylisting does: mailin's state
    /// machine stays in DATA after an error reply to the end of data, which
    /// would wedge the connection.)
    rcpt_replies: VecDeque<u16>,
    /// Recipients (substring) refused at RCPT with this code and text.
    refuse_rcpt: Vec<(String, u16, String)>,
    /// How long to take before answering the end of DATA.
    delay: Duration,
    transactions: u64,
    /// Going down: EHLO and MAIL FROM are answered 421 (the server is
    /// closing the session), so no new transaction begins; those past MAIL
    /// FROM finish.
    down: bool,
}

#[derive(Clone)]
struct Session {
    state: Arc<Mutex<State>>,
    from: String,
    to: Vec<String>,
    data: Vec<u8>,
}

impl Handler for Session {
    fn helo(&mut self, _ip: IpAddr, _domain: &str) -> Response {
        if self.state.lock().unwrap().down {
            return Response::custom(421, "going down (the test)".to_owned());
        }
        response::OK
    }

    fn mail(&mut self, _ip: IpAddr, _domain: &str, from: &str) -> Response {
        if self.state.lock().unwrap().down {
            return Response::custom(421, "going down (the test)".to_owned());
        }
        self.from = from.to_owned();
        self.to.clear();
        self.data.clear();
        response::OK
    }

    fn rcpt(&mut self, to: &str) -> Response {
        let refused = {
            let mut s = self.state.lock().unwrap();
            s.transactions += 1;
            let planned =
                (s.rcpt_replies.pop_front()).map(|c| (c, "refused by the test".to_owned()));
            planned.or_else(|| {
                s.refuse_rcpt
                    .iter()
                    .find(|(n, ..)| to.contains(n.as_str()))
                    .map(|(_, code, text)| (*code, text.clone()))
            })
        };
        match refused {
            Some((code, text)) => Response::custom(code, text),
            None => {
                self.to.push(to.to_owned());
                response::OK
            }
        }
    }

    fn data(&mut self, buf: &[u8]) -> std::io::Result<()> {
        self.data.extend_from_slice(buf);
        Ok(())
    }

    fn data_end(&mut self) -> Response {
        let delay = self.state.lock().unwrap().delay;
        std::thread::sleep(delay);
        let mail = Mail {
            from: self.from.clone(),
            to: self.to.clone(),
            data: String::from_utf8_lossy(&self.data).into_owned(),
        };
        self.state.lock().unwrap().mails.push(mail);
        response::OK
    }
}

/// The running sink. Its threads live until the test process ends (each
/// test binary's tests run in their own processes under nextest).
pub(crate) struct SmtpSink {
    state: Arc<Mutex<State>>,
    pub port: u16,
}

impl SmtpSink {
    pub(crate) fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State::default()));
        let handler = Session {
            state: state.clone(),
            from: String::new(),
            to: Vec::new(),
            data: Vec::new(),
        };
        let mut server = Server::new(handler);
        server
            .with_name("sink.test")
            .with_num_threads(32)
            .with_tcp_listener(listener);
        std::thread::spawn(move || {
            let _ = server.serve();
        });
        Self { state, port }
    }

    pub(crate) fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// The next RCPT commands are answered with these codes (then as usual).
    pub(crate) fn reply_with(&self, codes: &[u16]) {
        self.state.lock().unwrap().rcpt_replies.extend(codes);
    }

    /// Recipients containing `needle` are refused at RCPT with `code`.
    pub(crate) fn refuse(&self, needle: &str, code: u16) {
        self.refuse_saying(needle, code, "refused by the test");
    }

    /// Recipients containing `needle` are refused at RCPT with `code` and
    /// `text` (which may begin with an enhanced status code).
    pub(crate) fn refuse_saying(&self, needle: &str, code: u16, text: &str) {
        self.state
            .lock()
            .unwrap()
            .refuse_rcpt
            .push((needle.to_owned(), code, text.to_owned()));
    }

    /// Down (`true`): every new session and transaction is refused with
    /// 421, as by a server shutting down; back up with `false`.
    pub(crate) fn set_down(&self, down: bool) {
        self.state.lock().unwrap().down = down;
    }

    /// Each mail takes this long to accept.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.state.lock().unwrap().delay = delay;
    }

    pub(crate) fn mails(&self) -> Vec<Mail> {
        self.state.lock().unwrap().mails.clone()
    }

    /// Mails whose recipient contains `needle`.
    pub(crate) fn mails_to(&self, needle: &str) -> Vec<Mail> {
        self.mails()
            .into_iter()
            .filter(|m| m.to.iter().any(|t| t.contains(needle)))
            .collect()
    }

    /// Transactions (RCPT commands) seen, accepted or not.
    pub(crate) fn transactions(&self) -> u64 {
        self.state.lock().unwrap().transactions
    }

    /// Waits until `n` mails were accepted, or panics after `timeout`.
    pub(crate) fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Mail> {
        let deadline = Instant::now() + timeout;
        loop {
            let mails = self.mails();
            if mails.len() >= n {
                return mails;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} mails, got {}",
                mails.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What the proxy in front of the sink does with new connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProxyMode {
    /// Pass them to the sink.
    Forward,
    /// Accept and close at once: the server is gone.
    Refuse,
    /// Accept the next `n` and never answer (hold them open); forward the rest.
    Stall(u32),
}

/// A TCP proxy in front of a [`SmtpSink`] that can make the server vanish or
/// stall, connection by connection. Runs on a thread of its own.
pub(crate) struct SmtpProxy {
    pub port: u16,
    mode: Arc<Mutex<ProxyMode>>,
    stalled: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl SmtpProxy {
    pub(crate) fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(Mutex::new(ProxyMode::Forward));
        let stalled: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let (m, st) = (mode.clone(), stalled.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { continue };
                let action = {
                    let mut mode = m.lock().unwrap();
                    let now = *mode;
                    if let ProxyMode::Stall(n) = now {
                        *mode = if n > 1 {
                            ProxyMode::Stall(n - 1)
                        } else {
                            ProxyMode::Forward
                        };
                    }
                    now
                };
                match action {
                    ProxyMode::Refuse => drop(client),
                    ProxyMode::Stall(_) => st.lock().unwrap().push(client),
                    ProxyMode::Forward => {
                        std::thread::spawn(move || {
                            let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", upstream))
                            else {
                                return;
                            };
                            let (mut c2, mut s2) =
                                (client.try_clone().unwrap(), server.try_clone().unwrap());
                            let up = std::thread::spawn(move || {
                                let _ = std::io::copy(&mut c2, &mut s2);
                                let _ = s2.shutdown(std::net::Shutdown::Write);
                            });
                            let (mut s3, mut c3) = (server, client);
                            let _ = std::io::copy(&mut s3, &mut c3);
                            let _ = c3.shutdown(std::net::Shutdown::Write);
                            let _ = up.join();
                        });
                    }
                }
            }
        });
        Self {
            port,
            mode,
            stalled,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    pub(crate) fn set(&self, mode: ProxyMode) {
        *self.mode.lock().unwrap() = mode;
    }

    /// Connections being held without an answer.
    pub(crate) fn stalled(&self) -> usize {
        self.stalled.lock().unwrap().len()
    }
}
