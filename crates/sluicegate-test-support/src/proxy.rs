//! A fault-injecting TCP proxy on a loopback port, for putting a bad network between a
//! client and a server: real sockets, faults switched on and off by the test while
//! traffic flows.
//!
//! ```no_run
//! use std::time::Duration;
//! use sluicegate_test_support::{FaultProxy, standalone};
//!
//! let proxy = FaultProxy::start(standalone().port);
//! // Connect the client under test to proxy.url() instead of the server's own, then:
//! proxy.set_latency(Duration::from_millis(20)); // each direction, each chunk
//! proxy.stall();                                // nothing forwarded, nothing lost …
//! proxy.resume();                               // … until now
//! proxy.reset();                                // every open connection: RST
//! ```
//!
//! Each accepted connection opens one to the upstream and copies bytes both ways, chunk
//! by chunk, in order. The faults:
//!
//! - **latency**: every chunk waits this long before it is forwarded, in each direction;
//! - **stall**: nothing is forwarded either way, on open or new connections, until
//!   [`FaultProxy::resume`]; what was sent meanwhile is held, not lost, and the sockets
//!   stay open (what a stopped server or a partitioned link looks like to a client);
//! - **drop**: every open connection is closed (FIN to both ends);
//! - **reset**: every open connection is aborted (RST to both ends);
//! - **half-close**: every open connection stops forwarding one direction and closes it
//!   (FIN to that direction's receiver), while the other direction still flows;
//! - **blackhole**: every open connection silently forwards nothing more, ever, its
//!   sockets left open (a peer gone without a FIN or RST, a NAT that forgot the flow),
//!   while new connections are proxied as before;
//! - **refuse**: every open connection is aborted (RST to both ends) and every new one is
//!   aborted as soon as it is accepted, never reaching the upstream, until
//!   [`FaultProxy::accept_again`] (a server down, its port closed).
//!
//! The proxy runs on a thread of its own (a single-threaded tokio runtime) and stops,
//! closing every connection, when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client that connected to the proxy, to the upstream server.
    ToServer,
    /// From the upstream server back to the client.
    ToClient,
}

/// The faults in force. One-shot faults (drop, reset, half-close) are counters: a
/// connection acts on each increase it sees.
#[derive(Clone, Debug, Default)]
struct Faults {
    latency: Duration,
    stalled: bool,
    drops: u64,
    resets: u64,
    half_closes_to_server: u64,
    half_closes_to_client: u64,
    blackholes: u64,
    refusing: bool,
    /// The proxy is being dropped.
    closing: bool,
}

impl Faults {
    fn half_closes(&self, direction: Direction) -> u64 {
        match direction {
            Direction::ToServer => self.half_closes_to_server,
            Direction::ToClient => self.half_closes_to_client,
        }
    }
}

/// A TCP proxy from a free loopback port to `127.0.0.1:upstream`, injecting faults on
/// demand. See the [module](self).
pub struct FaultProxy {
    /// The loopback port it listens on.
    pub port: u16,
    faults: watch::Sender<Faults>,
    open: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `127.0.0.1:upstream`, with no fault.
    pub fn start(upstream: u16) -> FaultProxy {
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let (faults, watching) = watch::channel(Faults::default());
        let open = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = (Arc::clone(&open), Arc::clone(&accepted));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            runtime.block_on(accept(listener, upstream, watching, counted));
        });
        FaultProxy {
            port,
            faults,
            open,
            accepted,
            thread: Some(thread),
        }
    }

    /// `redis://127.0.0.1:PORT`: a Redis URL through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Every chunk waits `latency` before it is forwarded, in each direction (zero: none).
    pub fn set_latency(&self, latency: Duration) {
        self.faults.send_modify(|f| f.latency = latency);
    }

    /// Forwards nothing, either way, until [`FaultProxy::resume`]; connections stay open
    /// and what is sent meanwhile is held.
    pub fn stall(&self) {
        self.faults.send_modify(|f| f.stalled = true);
    }

    /// Ends a [stall](FaultProxy::stall): what was held is forwarded, in order.
    pub fn resume(&self) {
        self.faults.send_modify(|f| f.stalled = false);
    }

    /// Closes every open connection (FIN to both ends). New ones are accepted as before.
    pub fn drop_connections(&self) {
        self.faults.send_modify(|f| f.drops += 1);
    }

    /// Aborts every open connection (RST to both ends). New ones are accepted as before.
    pub fn reset(&self) {
        self.faults.send_modify(|f| f.resets += 1);
    }

    /// On every open connection, stops forwarding `direction` and closes it (FIN to its
    /// receiver); the other direction still flows.
    pub fn half_close(&self, direction: Direction) {
        self.faults.send_modify(|f| match direction {
            Direction::ToServer => f.half_closes_to_server += 1,
            Direction::ToClient => f.half_closes_to_client += 1,
        });
    }

    /// Every open connection forwards nothing more, in either direction, and is never
    /// closed; new connections are proxied as before.
    pub fn blackhole(&self) {
        self.faults.send_modify(|f| f.blackholes += 1);
    }

    /// Aborts every open connection (RST to both ends) and every new one as soon as it is
    /// accepted, until [`FaultProxy::accept_again`]: nothing reaches the upstream.
    pub fn refuse(&self) {
        self.faults.send_modify(|f| {
            f.refusing = true;
            f.resets += 1;
        });
    }

    /// Ends [refusing](FaultProxy::refuse): new connections are proxied again.
    pub fn accept_again(&self) {
        self.faults.send_modify(|f| f.refusing = false);
    }

    /// Connections open through the proxy now.
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the proxy started, open or closed since.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.faults.send_modify(|f| f.closing = true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections until the proxy closes, each proxied on a task of its own;
/// counts them in `(open, accepted)`.
async fn accept(
    listener: std::net::TcpListener,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    (open, accepted): (Arc<AtomicUsize>, Arc<AtomicUsize>),
) {
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    let mut links = tokio::task::JoinSet::new();
    let mut closing = faults.clone();
    loop {
        tokio::select! {
            connection = listener.accept() => {
                if let Ok((client, _)) = connection {
                    if faults.borrow().refusing {
                        // Closed with a zero linger: an RST, as a closed port answers.
                        let _ = client.set_zero_linger();
                        continue;
                    }
                    // Counted before anything is forwarded: a client that got an answer
                    // through a connection finds it counted.
                    accepted.fetch_add(1, Ordering::SeqCst);
                    links.spawn(link(client, upstream, faults.clone(), Arc::clone(&open)));
                }
            }
            _ = closing.wait_for(|f| f.closing) => break,
        }
    }
    // Dropping the tasks closes their sockets.
    links.abort_all();
}

/// Counts a connection open while it lives.
struct OpenGuard(Arc<AtomicUsize>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a connection was ended by a fault.
enum Ended {
    Dropped,
    Reset,
}

/// Proxies one connection until either end closes it or a fault ends it.
async fn link(
    mut client: TcpStream,
    upstream: SocketAddr,
    faults: watch::Receiver<Faults>,
    open: Arc<AtomicUsize>,
) {
    open.fetch_add(1, Ordering::SeqCst);
    let _open = OpenGuard(open);
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let seen = faults.borrow().clone();
    let ended = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let to_server = pump(
            client_read,
            server_write,
            Direction::ToServer,
            faults.clone(),
        );
        let to_client = pump(
            server_read,
            client_write,
            Direction::ToClient,
            faults.clone(),
        );
        let mut watching = faults.clone();
        let ended = async move {
            let fault = watching
                .wait_for(|f| f.drops > seen.drops || f.resets > seen.resets)
                .await;
            match fault {
                Ok(f) if f.resets > seen.resets => Ended::Reset,
                _ => Ended::Dropped,
            }
        };
        tokio::select! {
            _ = async { tokio::join!(to_server, to_client) } => None,
            ended = ended => Some(ended),
        }
    };
    if let Some(Ended::Reset) = ended {
        // Closing a socket with a zero linger sends RST instead of FIN.
        let _ = (client.set_zero_linger(), server.set_zero_linger());
    }
}

/// Copies `from` to `to` chunk by chunk under the faults in force, until `from` ends
/// (then closes `to` too) or `direction` is half-closed (then closes `to` and copies
/// nothing more).
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    direction: Direction,
    mut faults: watch::Receiver<Faults>,
) {
    let (half_closed_at, blackholed_at) = {
        let faults = faults.borrow();
        (faults.half_closes(direction), faults.blackholes)
    };
    let mut half_closes = faults.clone();
    let half_closed = half_closes.wait_for(|f| f.half_closes(direction) > half_closed_at);
    tokio::pin!(half_closed);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            biased;
            _ = &mut half_closed => break,
            read = from.read(&mut chunk) => read,
        };
        let n = match read {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // A half-close set before these bytes were sent is in the faults by now, even when
        // the read won the race above: the bytes are not forwarded.
        if faults.borrow().half_closes(direction) > half_closed_at {
            break;
        }
        let (latency, blackholed) = match faults.wait_for(|f| !f.stalled).await {
            Ok(f) => (f.latency, f.blackholes > blackholed_at),
            Err(_) => break,
        };
        if blackholed {
            std::future::pending::<()>().await;
        }
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            break;
        }
    }
    // The end of `from`, or a half-close: `to`'s receiver gets a FIN (the other
    // direction goes on until it ends too).
    let _ = to.shutdown().await;
}
