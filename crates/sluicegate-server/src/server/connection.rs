//! One accepted connection served: TLS when configured, then HTTP/1.1 or HTTP/2 on the
//! same port (hyper-util's auto builder), with the header, idle and body timeouts
//! enforced, and a graceful close when the service stops.
//!
//! Told to go away (the service stops, or the gRPC port's maximum age), a connection
//! closes without losing a request: HTTP/2 gets GOAWAY at once and finishes its streams;
//! an HTTP/1.1 request in flight is answered with `connection: close` and the connection
//! closed after it. An idle HTTP/1.1 connection is not closed at once, since a client may
//! be writing its next request right then (the server would reset the connection under
//! it, the request lost): for [`IDLE_GRACE`] its next request is still taken, answered
//! with `connection: close`; a connection still idle then, no byte of a request received,
//! is closed.
//!
//! The header and idle timeouts are kept apart, as nginx keeps `client_header_timeout`
//! and `keepalive_timeout`: a connection with nothing in flight is idle until the first
//! byte of its next request arrives, and from then on its headers must arrive within the
//! header timeout. (hyper's own `header_read_timeout` counts from when the connection
//! starts waiting, so it would also cut idle keep-alive connections; it is off.)

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::http::{Request, Response, StatusCode, Version, header};
use axum::response::IntoResponse as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::Instant;

use super::tls::Tls;
use crate::http::ApiError;
use crate::metrics::{ConnectionTimeout, OpenConnection};
use crate::service::Service;

/// How long an idle HTTP/2 connection, told to go away, may take to close by itself.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// How long an idle HTTP/1.1 connection, told to go away, still takes a next request:
/// far longer than a client takes between reading an answer and sending its next request,
/// and short against the shutdown timeout.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// The first bytes of an HTTP/2 connection (RFC 9113, 3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// The limits and timeouts of every listener. A timeout of `None` is off.
#[derive(Clone, Debug)]
pub struct ConnectionOptions {
    /// Connections open at once, over every listener; beyond it new ones are closed at
    /// once. Lowered at start to what the descriptor limit allows.
    pub max_connections: usize,
    /// Of those, the most one client (an IPv4 address, an IPv6 /64) may hold; `None`: a
    /// quarter of `max_connections` as in force (after the descriptor limit).
    pub max_connections_per_address: Option<usize>,
    /// A request's headers must arrive within it of their first byte (HTTP/1.1), and the
    /// TLS handshake within it of the connection.
    pub header_timeout: Option<Duration>,
    /// A connection with no request in flight and nothing received is closed after it.
    pub idle_timeout: Option<Duration>,
    /// A request body not received within it of the request's headers is answered 408.
    pub body_timeout: Option<Duration>,
    /// HTTP/2 keep-alive pings this often (`None`: no pings).
    pub http2_keepalive_interval: Option<Duration>,
    /// An HTTP/2 connection whose ping is not answered within it is closed.
    pub http2_keepalive_timeout: Duration,
    /// On stop, requests in flight may finish for this long; then the rest are cut.
    pub shutdown_timeout: Duration,
    /// A connection this old, give or take 10% (so that connections opened together do
    /// not all go at once), is told to go away: HTTP/2's GOAWAY, or a close after the
    /// HTTP/1.1 request in flight. `None`: never. The gRPC listener's alone
    /// (`--grpc-max-connection-age`, envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE), so
    /// that clients spread over new instances.
    pub max_age: Option<Duration>,
    /// A connection told to go away for its age is cut this long after, calls in flight or
    /// not. `None`: they finish.
    pub max_age_grace: Option<Duration>,
}

/// What every connection of every listener shares.
pub(super) struct Connections {
    pub(super) options: ConnectionOptions,
    pub(super) service: Arc<Service>,
    tls: Option<Arc<Tls>>,
    http: auto::Builder<TokioExecutor>,
}

impl Connections {
    pub(super) fn new(
        options: ConnectionOptions,
        service: Arc<Service>,
        tls: Option<Arc<Tls>>,
    ) -> Self {
        let mut http = auto::Builder::new(TokioExecutor::new());
        // Off: see the module's comment; the header timeout is enforced here instead.
        http.http1().header_read_timeout(None);
        http.http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(options.http2_keepalive_interval)
            .keep_alive_timeout(options.http2_keepalive_timeout);
        Connections {
            options,
            service,
            tls,
            http,
        }
    }

    /// Serves one accepted connection until it ends, a timeout closes it, or (after
    /// `stopping`) it has drained. `open` keeps it counted (and its slot taken) until then.
    pub(super) async fn serve(
        &self,
        stream: TcpStream,
        router: Router,
        stopping: watch::Receiver<bool>,
        open: OpenConnection,
    ) {
        let activity = Arc::new(Activity::new());
        // Who is asking, for the routes that answer loopback peers only.
        let peer = stream.peer_addr().ok();
        match &self.tls {
            None => {
                self.serve_http(stream, router, peer, activity, stopping)
                    .await;
            }
            Some(tls) => {
                let handshake = tls.acceptor().accept(stream);
                let stream = match self.options.header_timeout {
                    Some(limit) => match tokio::time::timeout(limit, handshake).await {
                        Ok(stream) => stream,
                        Err(_) => {
                            self.timed_out(ConnectionTimeout::Handshake);
                            return;
                        }
                    },
                    None => handshake.await,
                };
                match stream {
                    Ok(stream) => {
                        self.serve_http(stream, router, peer, activity, stopping)
                            .await;
                    }
                    Err(e) => {
                        self.service.metrics().connections().handshake_failed();
                        tracing::debug!(error = %e, "TLS handshake failed");
                    }
                }
            }
        }
        drop(open);
    }

    async fn serve_http<I>(
        &self,
        io: I,
        router: Router,
        peer: Option<SocketAddr>,
        activity: Arc<Activity>,
        mut stopping: watch::Receiver<bool>,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Over TLS, what is watched is what the TLS layer has decrypted: HTTP's own bytes.
        let io = Watched {
            inner: io,
            activity: Arc::clone(&activity),
            fresh: true,
        };
        let answer = {
            let activity = Arc::clone(&activity);
            let service = Arc::clone(&self.service);
            let body_timeout = self.options.body_timeout;
            hyper::service::service_fn(move |mut request: Request<Incoming>| {
                if let Some(peer) = peer {
                    request.extensions_mut().insert(ConnectInfo(peer));
                }
                let in_flight = activity.request_started(request.version() == Version::HTTP_2);
                answer(
                    router.clone(),
                    request,
                    body_timeout,
                    Arc::clone(&service),
                    in_flight,
                )
            })
        };
        let connection = self.http.serve_connection(TokioIo::new(io), answer);
        tokio::pin!(connection);
        // hyper was told (graceful_shutdown): HTTP/2's GOAWAY sent, or an idle HTTP/1.1
        // connection closed.
        let mut told = false;
        // An HTTP/1.1 connection going away is closed then, if still idle.
        let mut idle_close_at = None;
        let mut aged_at = self
            .options
            .max_age
            .map(|age| activity.opened + jittered(age));
        let mut cut_at = None;
        loop {
            if !told && activity.going_away() && activity.http2.load(Ordering::Relaxed) {
                told = true;
                connection.as_mut().graceful_shutdown();
            }
            let deadline = activity.deadline(&self.options);
            tokio::select! {
                ended = connection.as_mut() => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                    return;
                }
                () = activity.changed.notified() => {}
                () = sleep_until(deadline.map(|(at, _)| at)) => {
                    let Some((at, timeout)) = activity.deadline(&self.options) else { continue };
                    if at > Instant::now() {
                        continue;
                    }
                    self.timed_out(timeout);
                    if timeout == ConnectionTimeout::Idle {
                        // Nothing is in flight: an HTTP/2 client hears GOAWAY first.
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await;
                    }
                    return;
                }
                () = stopped(&mut stopping), if !activity.going_away() => {
                    activity.go_away();
                    idle_close_at = Some(Instant::now() + IDLE_GRACE);
                }
                () = sleep_until(idle_close_at) => {
                    idle_close_at = None;
                    // A request in flight closes the connection after its answer; one whose
                    // bytes have begun to arrive is waited for (its headers have the header
                    // timeout): closing now would lose it.
                    if !told && activity.is_idle() {
                        told = true;
                        connection.as_mut().graceful_shutdown();
                    }
                }
                () = sleep_until(aged_at) => {
                    aged_at = None;
                    if !activity.going_away() {
                        activity.go_away();
                        idle_close_at = Some(Instant::now() + IDLE_GRACE);
                    }
                    cut_at = self.options.max_age_grace.map(|grace| Instant::now() + grace);
                }
                () = sleep_until(cut_at) => {
                    tracing::debug!("connection cut: its calls outlasted the grace after its maximum age");
                    return;
                }
            }
        }
    }

    fn timed_out(&self, timeout: ConnectionTimeout) {
        self.service.metrics().connections().timed_out(timeout);
        tracing::debug!(?timeout, "connection closed by a timeout");
    }
}

/// One request answered by the router, or 408 when its body is not received in time. An
/// HTTP/1.1 answer ready once its connection is going away says `connection: close`:
/// hyper closes the connection after it.
async fn answer(
    router: Router,
    request: Request<Incoming>,
    body_timeout: Option<Duration>,
    service: Arc<Service>,
    in_flight: InFlight,
) -> Result<Response<Body>, Infallible> {
    let http1 = request.version() < Version::HTTP_2;
    let answered = match body_timeout {
        // No body deadline: nothing to watch the body for.
        None => tower::ServiceExt::oneshot(router, request.map(Body::new)).await,
        Some(limit) => Ok(answer_within(router, request, limit, &service).await),
    };
    let mut response = match answered {
        Ok(response) => response,
        Err(never) => match never {},
    };
    if http1 && in_flight.0.going_away() {
        close_after(&mut response);
    }
    drop(in_flight);
    Ok(response)
}

/// The router's answer, or 408 when the request's body is not received within `limit`.
async fn answer_within(
    router: Router,
    request: Request<Incoming>,
    limit: Duration,
    service: &Service,
) -> Response<Body> {
    let http1 = request.version() < Version::HTTP_2;
    let (settled, body_settled) = oneshot::channel::<Infallible>();
    let request = request.map(|body| {
        Body::new(WatchedBody {
            inner: body,
            settled: Some(settled),
        })
    });
    let call = tower::ServiceExt::oneshot(router, request);
    let body_overdue = async {
        tokio::select! {
            // Received in full, failed, or dropped unread: the handler is not waiting on it.
            _ = body_settled => std::future::pending().await,
            () = tokio::time::sleep(limit) => {}
        }
    };
    tokio::select! {
        answered = call => match answered {
            Ok(response) => response,
            Err(never) => match never {},
        },
        () = body_overdue => {
            service.metrics().connections().timed_out(ConnectionTimeout::Body);
            body_timeout_response(http1)
        }
    }
}

/// 408 in the API's JSON error shape; an HTTP/1.1 connection is closed after it (the rest
/// of the body is never read).
fn body_timeout_response(http1: bool) -> Response<Body> {
    let mut response = ApiError::new(
        StatusCode::REQUEST_TIMEOUT,
        "the request body was not received within --body-timeout",
    )
    .into_response();
    if http1 {
        close_after(&mut response);
    }
    response
}

/// An HTTP/1.1 answer after which hyper closes the connection.
fn close_after(response: &mut Response<Body>) {
    response.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
}

/// Resolves once the service is told to stop.
pub(super) async fn stopped(stopping: &mut watch::Receiver<bool>) {
    // The guard wait_for returns is not Send: dropped here, not held by a caller's select.
    let _ = stopping.wait_for(|stop| *stop).await;
}

/// Resolves at `deadline`, never without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// `age` give or take 10%, at random.
fn jittered(age: Duration) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    // Each RandomState is keyed afresh: a random number without a generator.
    let random = std::hash::RandomState::new().build_hasher().finish();
    let share = 0.9 + 0.2 * (random >> 11) as f64 / (1u64 << 53) as f64;
    age.mul_f64(share)
}

/// `head_since` when no request has started arriving.
const NO_HEAD: u64 = u64::MAX;

/// What one connection is doing, shared between its reads, its requests and its
/// watchdog (the loop of [`Connections::serve_http`]). Times are µs after `opened`.
struct Activity {
    opened: Instant,
    /// Requests whose answer is not ready yet.
    in_flight: AtomicUsize,
    /// When it last went idle: opened, or an answer was ready.
    idle_since: AtomicU64,
    /// When the first byte of the next request arrived while idle, or [`NO_HEAD`].
    head_since: AtomicU64,
    /// It speaks HTTP/2 (learnt from its first bytes): its frames are not heads.
    http2: AtomicBool,
    /// Told to go away: HTTP/1.1 answers ready from now on close the connection.
    going_away: AtomicBool,
    /// Woken when a request starts or ends, or a head starts arriving.
    changed: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head_since: AtomicU64::new(NO_HEAD),
            http2: AtomicBool::new(false),
            going_away: AtomicBool::new(false),
            changed: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_micros()).unwrap_or(u64::MAX - 1)
    }

    fn at(&self, micros: u64) -> Instant {
        self.opened + Duration::from_micros(micros)
    }

    /// Bytes arrived: while idle on HTTP/1.1, the next request's head has begun. The first
    /// bytes of a connection say whether it speaks HTTP/2.
    fn received(&self, bytes: &[u8], first: bool) {
        if first && bytes.starts_with(HTTP2_PREFACE) {
            self.http2.store(true, Ordering::Relaxed);
        }
        if self.head_since.load(Ordering::Relaxed) == NO_HEAD
            && self.in_flight.load(Ordering::Acquire) == 0
            && !self.http2.load(Ordering::Relaxed)
        {
            self.head_since.store(self.now(), Ordering::Relaxed);
            self.changed.notify_one();
        }
    }

    fn request_started(self: &Arc<Self>, http2: bool) -> InFlight {
        if http2 {
            self.http2.store(true, Ordering::Relaxed);
        }
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NO_HEAD, Ordering::Relaxed);
        self.changed.notify_one();
        InFlight(Arc::clone(self))
    }

    /// Told to go away: from now on its HTTP/1.1 answers close it.
    fn go_away(&self) {
        self.going_away.store(true, Ordering::Release);
    }

    fn going_away(&self) -> bool {
        self.going_away.load(Ordering::Acquire)
    }

    /// No request in flight, and no byte of a next one received.
    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0 && !self.head_begun()
    }

    /// Bytes of a next HTTP/1.1 request have arrived, and it has not started yet.
    fn head_begun(&self) -> bool {
        self.head_since.load(Ordering::Relaxed) != NO_HEAD && !self.http2.load(Ordering::Relaxed)
    }

    /// When the connection times out if nothing changes, and by which timeout: none while
    /// a request is in flight (the body timeout is the request's own).
    fn deadline(&self, options: &ConnectionOptions) -> Option<(Instant, ConnectionTimeout)> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        if self.head_begun() {
            let limit = options.header_timeout?;
            let head = self.head_since.load(Ordering::Relaxed);
            return Some((self.at(head) + limit, ConnectionTimeout::Header));
        }
        let limit = options.idle_timeout?;
        let since = self.idle_since.load(Ordering::Relaxed);
        Some((self.at(since) + limit, ConnectionTimeout::Idle))
    }
}

/// A request in flight on its connection, until dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity.idle_since.store(activity.now(), Ordering::Relaxed);
        // Bytes read while it was in flight were its own, not the next request's.
        activity.head_since.store(NO_HEAD, Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
        activity.changed.notify_one();
    }
}

/// A connection's socket, telling its [`Activity`] when bytes arrive.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    /// No byte has arrived yet.
    fresh: bool,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity
                .received(&buf.filled()[before..], std::mem::take(&mut this.fresh));
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request body that says (by dropping `settled`) when nobody waits on it any more:
/// received in full, failed, or dropped.
struct WatchedBody {
    inner: Incoming,
    settled: Option<oneshot::Sender<Infallible>>,
}

impl http_body::Body for WatchedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        let settled = match &polled {
            Poll::Ready(None | Some(Err(_))) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Pending => false,
        };
        if settled {
            this.settled = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
