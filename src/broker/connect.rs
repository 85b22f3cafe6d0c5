//! Reaching RabbitMQ: choosing a node that answers, and the [`Broker`]'s
//! connection and channels.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lapin::options::{BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::{Channel, Connection, ConnectionProperties};

use super::{BrokerError, Topology};
use crate::redact::redact_url;
use crate::settings::{AmqpSettings, Settings};
use crate::tls::LinkTls;

/// Connects to one of `amqp.url`'s nodes: the first that answers, each
/// within `amqp.timeout`, in the order listed. The first connection starts
/// at the first node; each later one at the node after the one used last,
/// so a node that went away (taking the connection with it) costs no
/// attempt, even one that never answers. With every node down, the error
/// is the last node's.
pub async fn connect_node(
    settings: &AmqpSettings,
    props: ConnectionProperties,
) -> Result<Connection, BrokerError> {
    /// The node to try first.
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let urls = settings.urls();
    let n = urls.len();
    let tls = settings
        .link_tls()
        .map_err(|e| BrokerError::Tls(crate::report::one_line(&e)))?;
    let first = NEXT.load(Ordering::Relaxed);
    let mut last = None;
    for i in (first..first + n).map(|i| i % n) {
        let url = urls[i];
        let quiet = match silence(url) {
            Some(Silence::Resting) => true,
            Some(Silence::Silent) => !speaks(url, settings.timeout).await,
            None => false,
        };
        if quiet {
            last = Some(BrokerError::Timeout(settings.timeout));
            continue;
        }
        let connect = open(url, props.clone(), &tls);
        match tokio::time::timeout(settings.timeout, connect).await {
            Ok(Ok(conn)) => {
                NEXT.store((i + 1) % n, Ordering::Relaxed);
                mark_silent(url, false);
                if n > 1 {
                    tracing::info!(node = redact_url(url), "connected to rabbitmq");
                }
                return Ok(conn);
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                mark_silent(url, true);
                last = Some(BrokerError::Timeout(settings.timeout));
            }
        }
    }
    Err(last.unwrap_or(BrokerError::Timeout(settings.timeout)))
}

/// Connects to the node at `url`: over TLS for `amqps://`, verified against
/// `tls`'s roots (lapin's own TLS would add the bundled roots to a
/// `ca_file`, and could not use the system store), with its client
/// certificate if one is set.
async fn open(
    url: &str,
    props: ConnectionProperties,
    tls: &LinkTls,
) -> Result<Connection, BrokerError> {
    use lapin::tcp::{AsyncTcpStream, RustlsConnector};
    use lapin::uri::{AMQPScheme, AMQPUri};
    let uri: AMQPUri = url
        .parse()
        .map_err(|e: String| lapin::Error::from(std::io::Error::other(e)))?;
    let unusable = |e| BrokerError::Tls(format!("amqp.tls: {}", crate::report::one_line(&e)));
    let config = match uri.scheme {
        AMQPScheme::AMQPS => Some(tls.client_config().map_err(unusable)?),
        AMQPScheme::AMQP => None,
    };
    let runtime = lapin::runtime::default_runtime()?;
    let connection = Connection::connector(
        uri,
        runtime,
        async move |uri, runtime| {
            let host = uri.authority.host.clone();
            let addr = runtime.to_socket_addrs((host.clone(), uri.authority.port));
            let plain = AsyncTcpStream::connect(&runtime, addr).await?;
            Ok(match &config {
                None => plain,
                Some(config) => {
                    plain
                        .into_rustls(&RustlsConnector::from(config.clone()), &host)
                        .await?
                }
            })
        },
        props,
    );
    Ok(connection.await?)
}

/// Nodes whose last connection attempt ran out of time: the URL, how many
/// times in a row lapin ran out of time on it after it answered the probe,
/// and until when it rests. lapin starts a thread for each attempt that
/// lives, with its socket, until the peer answers or closes; a peer that
/// accepts connections and never speaks (a load balancer without a
/// backend) would keep every attempt's. So such a node is asked first,
/// cheaply, whether it answers at all ([`speaks`]), and lapin tries it
/// again only once it does. A node that answers the probe and then stalls
/// lapin again (a login backend that hangs) rests, 10 s doubling up to
/// 10 min, between attempts: each still costs a thread, a few an hour at
/// most, where retrying it every 10 s would leave ~360 an hour.
static SILENT: std::sync::Mutex<Vec<(String, u32, Option<std::time::Instant>)>> =
    std::sync::Mutex::new(Vec::new());

/// What is known of a node whose last attempt ran out of time.
enum Silence {
    /// Probe it before lapin tries it.
    Silent,
    /// It stalled lapin after answering the probe: skip it for now.
    Resting,
}

fn silence(url: &str) -> Option<Silence> {
    // Nothing panics while holding it; a poisoned lock still holds a value.
    let silent = SILENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (_, _, until) = silent.iter().find(|(u, ..)| u == url)?;
    Some(match until {
        Some(t) if std::time::Instant::now() < *t => Silence::Resting,
        _ => Silence::Silent,
    })
}

/// Records that lapin ran out of time on `url` (`silent`), or connected.
fn mark_silent(url: &str, silent: bool) {
    let mut all = SILENT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = all
        .iter()
        .position(|(u, ..)| u == url)
        .map(|i| all.remove(i));
    if !silent {
        return;
    }
    // Silent before this attempt: it answered the probe, then stalled.
    let stalls = before.map_or(0, |(_, n, _)| n + 1);
    let until = (stalls > 0).then(|| {
        let rest = Duration::from_secs(10).saturating_mul(1 << (stalls - 1).min(6));
        std::time::Instant::now() + rest.min(Duration::from_secs(600))
    });
    all.push((url.to_owned(), stalls, until));
}

/// Whether the node at `url` answers an AMQP protocol header within
/// `timeout` (any byte, or closing the connection: a peer that is there).
/// The probe's socket is closed when it returns.
async fn speaks(url: &str, timeout: Duration) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(uri) = url.parse::<lapin::uri::AMQPUri>() else {
        return true;
    };
    let (host, port) = (uri.authority.host, uri.authority.port);
    let probe = async {
        let mut tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
        tcp.write_all(b"AMQP\x00\x00\x09\x01").await?;
        let mut byte = [0u8; 1];
        tcp.read(&mut byte).await
    };
    let answered = matches!(tokio::time::timeout(timeout, probe).await, Ok(Ok(_)));
    if !answered {
        tracing::warn!(
            node = redact_url(url),
            ?timeout,
            "a rabbitmq node accepts connections and does not answer"
        );
    }
    answered
}

/// One connection and channel to RabbitMQ, with publisher confirms on.
/// Cheap to clone; clones share the connection and channel.
#[derive(Clone, Debug)]
pub struct Broker {
    /// The connection every channel is on.
    pub(super) conn: std::sync::Arc<Connection>,
    /// Consumes `J` and publishes everything but replies, with confirms.
    pub(super) channel: Channel,
    /// Consumes `J.redelivered`, one message at a time.
    pub(super) one_by_one: Channel,
    /// Publishes to producer-named `reply_to` queues, one at a time (the
    /// lock): such a queue may not exist, and lapin gives a `basic.return`
    /// to whichever confirm completes next, so on a channel with several
    /// publishes in flight one job's return was taken for another's (one
    /// result published twice, one lost). Alone, a return is its publish's.
    pub(super) replies: (Channel, std::sync::Arc<tokio::sync::Mutex<()>>),
    /// The queues.
    pub(super) topology: Topology,
    /// `amqp.timeout`: the bound on every operation.
    pub(super) timeout: Duration,
}

impl Broker {
    /// Connects, opens a channel with publisher confirms and `prefetch`, and
    /// declares the queues, all within `amqp.timeout` (a peer that accepts
    /// the TCP connection and never finishes the handshake, such as a load
    /// balancer without a backend, is an outage to retry, not a wait).
    pub async fn connect(settings: &Settings) -> Result<Self, BrokerError> {
        let amqp = &settings.amqp;
        // Named after the queue it serves, so operators (and tests) can
        // find a pool's connections in `rabbitmqctl list_connections`.
        let name = format!(
            "mailgate worker {} pid {}",
            amqp.jobs_queue,
            std::process::id()
        );
        let props = ConnectionProperties::default().with_connection_name(name.as_str().into());
        let conn = connect_node(amqp, props).await?;
        let timeout = amqp.timeout;
        tokio::time::timeout(timeout, Self::open(conn, amqp, Topology::new(settings)))
            .await
            .unwrap_or(Err(BrokerError::Timeout(timeout)))
    }

    async fn open(
        conn: Connection,
        settings: &AmqpSettings,
        topology: Topology,
    ) -> Result<Self, BrokerError> {
        let channel = conn.create_channel().await?;
        channel
            .basic_qos(settings.prefetch, BasicQosOptions::default())
            .await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let one_by_one = conn.create_channel().await?;
        one_by_one.basic_qos(1, BasicQosOptions::default()).await?;
        let replies = conn.create_channel().await?;
        replies
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let broker = Self {
            conn: std::sync::Arc::new(conn),
            channel,
            one_by_one,
            replies: (replies, std::sync::Arc::new(tokio::sync::Mutex::new(()))),
            topology,
            timeout: settings.timeout,
        };
        for q in broker.topology.all() {
            broker.declare(&q).await?;
        }
        Ok(broker)
    }

    /// The queue names.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether RabbitMQ has blocked this connection from publishing (a
    /// memory or disk alarm): no result can go out until it clears.
    pub fn blocked(&self) -> bool {
        self.conn.status().blocked()
    }

    /// Runs one broker operation within `amqp.timeout`. One that runs out
    /// closes the connection (in the background, itself bounded), so the
    /// deliveries it holds go back to the queue and the consumer ends.
    pub(super) async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = Result<T, BrokerError>>,
    ) -> Result<T, BrokerError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(r) => r,
            Err(_) => {
                let conn = self.conn.clone();
                let timeout = self.timeout;
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(timeout, conn.close(320, "deadline".into())).await;
                });
                Err(BrokerError::Timeout(self.timeout))
            }
        }
    }

    /// Declares one of mailgate's queues. A queue that exists with other
    /// arguments, or a user without permission, is [`BrokerError::Refused`]
    /// with RabbitMQ's own reason; one of another type also says what to do.
    pub(super) async fn declare(&self, queue: &str) -> Result<(), BrokerError> {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable(),
                self.topology.arguments(queue),
            )
            .await
            .map_err(|e| match e.kind() {
                lapin::ErrorKind::ProtocolError(amqp) => BrokerError::Refused {
                    queue: queue.to_owned(),
                    why: self.topology.refusal(amqp.get_message().as_str()),
                },
                _ => BrokerError::Amqp(e),
            })?;
        Ok(())
    }

    /// Closes the connection, waiting at most `within`; unacknowledged jobs
    /// go back to the queue (when the socket closes, if not before).
    pub async fn close(&self, within: Duration) {
        let close = async {
            let _ = self.one_by_one.close(200, "bye".into()).await;
            let _ = self.replies.0.close(200, "bye".into()).await;
            let _ = self.channel.close(200, "bye".into()).await;
            let _ = self.conn.close(200, "bye".into()).await;
        };
        let _ = tokio::time::timeout(within, close).await;
    }
}
