//! The listeners against hostile clients, over real sockets: idle connections, slowloris
//! headers, bodies never finished, more connections than allowed (in all, and from one
//! address), a low descriptor limit, and stopping with a request half-sent; the gRPC port's maximum connection age.

use crate::server;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use server::Server;

/// The longest any wait below lasts: far beyond the timeouts under test, for a loaded
/// 2-core machine.
const PATIENCE: Duration = Duration::from_secs(10);

fn connect(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(&server.address).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// A connection to `server` from the loopback address `from` (Linux answers the whole of
/// 127.0.0.0/8): a client of its own.
fn connect_from(server: &Server, from: [u8; 4]) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&std::net::SocketAddr::from((from, 0)).into())
        .unwrap();
    let to: std::net::SocketAddr = server.address.parse().unwrap();
    socket.connect(&to.into()).unwrap();
    let stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nhost: sluicegate\r\n\r\n")
}

/// A check whose body stops after its first bytes.
const HALF_SENT_CHECK: &[u8] = b"POST /v1/check HTTP/1.1\r\nhost: sluicegate\r\n\
    content-type: application/json\r\ncontent-length: 200\r\n\r\n{\"domain\":";

/// Sends a check whose body stops after its first bytes, once the server has taken its
/// request in: it asks `100-continue` and waits for the server to read the body, so that a
/// signal sent next finds a request in flight (not a connection still idle, which a drain
/// closes at once).
fn send_half_check_in_flight(stream: &mut TcpStream) {
    let (head, body) = HALF_SENT_CHECK.split_at(HALF_SENT_CHECK.len() - br#"{"domain":"#.len());
    let head = std::str::from_utf8(head).unwrap().replacen(
        "\r\n\r\n",
        "\r\nexpect: 100-continue\r\n\r\n",
        1,
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") {
        let read = stream.read(&mut byte).unwrap();
        assert_eq!(read, 1, "closed before 100 Continue: {answer:?}");
        answer.push(byte[0]);
    }
    assert!(answer.starts_with(b"HTTP/1.1 100 Continue"), "{answer:?}");
    stream.write_all(body).unwrap();
}

/// One request on a kept-alive connection: the answer's status and body.
fn exchange(stream: &mut TcpStream, request: &str) -> io::Result<(u16, String)> {
    let (head, body) = exchange_with_head(stream, request)?;
    Ok((head[9..12].parse().unwrap(), body))
}

/// One request on a kept-alive connection: the answer's head (in lower case) and body.
fn exchange_with_head(stream: &mut TcpStream, request: &str) -> io::Result<(String, String)> {
    stream.write_all(request.as_bytes())?;
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    let head_end = loop {
        if let Some(i) = received.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        received.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&received[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map_or(0, |l| l.trim().parse().unwrap());
    while received.len() < head_end + length {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        received.extend_from_slice(&buf[..n]);
    }
    let body = String::from_utf8_lossy(&received[head_end..head_end + length]).into_owned();
    Ok((head, body))
}

/// Reads until the server closes the connection: what it sent before. Panics if it is
/// still open after [`PATIENCE`].
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let start = Instant::now();
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return received,
            Err(e) => panic!("still open after {:?}: {e}", start.elapsed()),
        }
    }
}

/// Whether the server has closed the connection, looking for up to `wait`.
fn is_closed(mut stream: &TcpStream, wait: Duration) -> bool {
    stream.set_read_timeout(Some(wait)).unwrap();
    let closed = match stream.read(&mut [0; 64]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    };
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    closed
}

/// The value of one line of `/metrics` (`name{labels}` as written there).
fn metric(server: &Server, name: &str) -> f64 {
    let (_, text) = server.request("GET", "/metrics", "");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
}

/// A new connection answered, once the server has seen others close.
fn answered_on_a_new_connection(server: &Server) {
    let start = Instant::now();
    loop {
        match exchange(&mut connect(server), &get("/healthz")) {
            Ok((status, _)) => return assert_eq!(status, 200),
            Err(e) if start.elapsed() > PATIENCE => panic!("no answer: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn assert_between(took: Duration, at_least: Duration, at_most: Duration) {
    assert!(
        at_least <= took && took <= at_most,
        "took {took:?}, not between {at_least:?} and {at_most:?}"
    );
}

/// A connection that never sends anything, and one that asked once and keeps its
/// keep-alive connection, are both closed after --idle-timeout.
#[test]
fn idle_connections_are_closed_after_the_idle_timeout() {
    let server = Server::start(&["--idle-timeout", "300ms", "--header-timeout", "60s"]);
    let opened = Instant::now();
    let mut silent = connect(&server);
    let mut kept = connect(&server);
    assert_eq!(exchange(&mut kept, &get("/healthz")).unwrap().0, 200);
    let asked = Instant::now();
    assert!(read_until_closed(&mut silent).is_empty());
    assert_between(
        opened.elapsed(),
        Duration::from_millis(250),
        Duration::from_secs(5),
    );
    assert!(read_until_closed(&mut kept).is_empty());
    assert_between(
        asked.elapsed(),
        Duration::from_millis(250),
        Duration::from_secs(5),
    );
    assert_eq!(
        metric(
            &server,
            "sluicegate_connection_timeouts_total{timeout=\"idle\"}"
        ),
        2.0
    );
}

/// Headers dribbled a byte at a time are cut off --header-timeout after their first byte,
/// although the idle timeout is a minute.
#[test]
fn a_slowloris_is_closed_after_the_header_timeout() {
    let server = Server::start(&["--header-timeout", "400ms", "--idle-timeout", "60s"]);
    let mut stream = connect(&server);
    stream
        .set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let head = b"GET /healthz HTTP/1.1\r\nx-slow: "
        .iter()
        .chain([b'a'].iter().cycle());
    let started = Instant::now();
    for byte in head {
        assert!(
            started.elapsed() < PATIENCE,
            "still open after {PATIENCE:?}"
        );
        if stream.write_all(&[*byte]).is_err() {
            break;
        }
        match stream.read(&mut [0; 64]) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            _ => break,
        }
    }
    assert_between(
        started.elapsed(),
        Duration::from_millis(350),
        Duration::from_secs(5),
    );
    assert_eq!(
        metric(
            &server,
            "sluicegate_connection_timeouts_total{timeout=\"header\"}"
        ),
        1.0
    );
}

/// A request whose body never finishes is answered 408 in the API's JSON after
/// --body-timeout, and its connection closed.
#[test]
fn a_body_never_finished_is_answered_408() {
    let server = Server::start(&["--body-timeout", "400ms"]);
    let mut stream = connect(&server);
    let started = Instant::now();
    stream.write_all(HALF_SENT_CHECK).unwrap();
    let answer = String::from_utf8(read_until_closed(&mut stream)).unwrap();
    assert_between(
        started.elapsed(),
        Duration::from_millis(350),
        Duration::from_secs(5),
    );
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains(r#"{"error":"the request body was not received within --body-timeout"}"#),
        "{answer}"
    );
    assert_eq!(
        metric(
            &server,
            "sluicegate_connection_timeouts_total{timeout=\"body\"}"
        ),
        1.0
    );
}

/// Beyond --max-connections, new connections are closed at once and counted; the open
/// ones go on being answered, and once some close, new ones are served again.
#[test]
fn connections_beyond_the_maximum_are_closed_at_once() {
    // 0: no share per address, so that one address meets the whole cap.
    let server = Server::start(&[
        "--max-connections",
        "4",
        "--max-connections-per-address",
        "0",
    ]);
    let mut kept = connect(&server);
    assert_eq!(exchange(&mut kept, &get("/healthz")).unwrap().0, 200);
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect(&server)).collect();
    let mut excess: Vec<TcpStream> = (0..6).map(|_| connect(&server)).collect();
    for stream in &mut excess {
        assert!(
            is_closed(stream, Duration::from_secs(5)),
            "an excess connection is kept"
        );
    }
    for stream in &mut held {
        assert!(
            !is_closed(stream, Duration::from_millis(100)),
            "a held connection was closed"
        );
    }
    let (status, metrics) = exchange(&mut kept, &get("/metrics")).unwrap();
    assert_eq!(status, 200);
    for line in [
        "sluicegate_connections_refused_total 6",
        "sluicegate_connections_accepted_total 4",
        "sluicegate_connections_open 4",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    drop(held);
    answered_on_a_new_connection(&server);
}

/// One address holds its share of --max-connections (a quarter by default: 2 of 8), and
/// beyond it its new connections are closed at once and counted, while another address is
/// still served; once one of its own closes, the first address is served again.
#[test]
fn one_address_cannot_hold_more_than_its_share() {
    let server = Server::start(&["--max-connections", "8"]);
    const GREEDY: [u8; 4] = [127, 0, 0, 2];
    let mut held: Vec<TcpStream> = (0..2).map(|_| connect_from(&server, GREEDY)).collect();
    for stream in &mut held {
        assert_eq!(exchange(stream, &get("/healthz")).unwrap().0, 200);
    }
    let mut over = connect_from(&server, GREEDY);
    assert!(
        is_closed(&over, Duration::from_secs(5)),
        "a connection over its address's share is kept"
    );
    assert!(exchange(&mut over, &get("/healthz")).is_err());
    let mut other = connect_from(&server, [127, 0, 0, 3]);
    assert_eq!(exchange(&mut other, &get("/healthz")).unwrap().0, 200);
    for stream in &mut held {
        assert_eq!(exchange(stream, &get("/healthz")).unwrap().0, 200);
    }
    let (_, metrics) = exchange(&mut other, &get("/metrics")).unwrap();
    for line in [
        "sluicegate_connections_refused_per_address_total 1",
        "sluicegate_connections_refused_total 0",
        "sluicegate_connections_open 3",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    drop(held.pop());
    let start = Instant::now();
    loop {
        match exchange(&mut connect_from(&server, GREEDY), &get("/healthz")) {
            Ok((status, _)) => break assert_eq!(status, 200),
            Err(e) if start.elapsed() > PATIENCE => panic!("never served again: {e}"),
            // The server has not seen the close yet.
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// --max-connections-per-address sets the share: 3 of one address's connections are
/// served, the fourth closed at once.
#[test]
fn the_share_per_address_is_set_by_its_flag() {
    let server = Server::start(&["--max-connections-per-address", "3"]);
    const ADDRESS: [u8; 4] = [127, 0, 0, 4];
    let mut held: Vec<TcpStream> = (0..3).map(|_| connect_from(&server, ADDRESS)).collect();
    for stream in &mut held {
        assert_eq!(exchange(stream, &get("/healthz")).unwrap().0, 200);
    }
    assert!(is_closed(
        &connect_from(&server, ADDRESS),
        Duration::from_secs(5)
    ));
    assert_eq!(
        metric(&server, "sluicegate_connections_refused_per_address_total"),
        1.0
    );
}

/// The soft descriptor limit is raised to the hard one at start: with a soft limit of 64,
/// 150 connections are all served.
#[test]
fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
    let hard = std::process::Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .unwrap();
    let hard = String::from_utf8_lossy(&hard.stdout).trim().to_owned();
    assert!(
        hard == "unlimited" || hard.parse::<u64>().unwrap() >= 400,
        "this test needs a hard descriptor limit of 400 or more, not {hard}"
    );
    let server = Server::binary_with_ulimit("-Sn 64", &[]);
    let mut streams: Vec<TcpStream> = (0..150).map(|_| connect(&server)).collect();
    for stream in &mut streams {
        assert_eq!(exchange(stream, &get("/healthz")).unwrap().0, 200);
    }
}

/// Under a hard limit of 128 descriptors, a flood of 200 idle connections from one address
/// neither stalls accepting nor keeps a client from being answered: what does not fit is
/// closed at once, and other addresses still find room.
#[test]
fn a_flood_under_a_hard_descriptor_limit_is_refused_not_queued() {
    let server = Server::binary_with_ulimit("-n 128", &[]);
    let mut kept = connect(&server);
    assert_eq!(exchange(&mut kept, &get("/healthz")).unwrap().0, 200);
    let flood: Vec<TcpStream> = (0..200).map(|_| connect(&server)).collect();
    let closed = flood
        .iter()
        .filter(|stream| is_closed(stream, Duration::from_millis(100)))
        .count();
    // 64 connections fit (128 descriptors less 64 kept for the rest), and one address may
    // hold a quarter of them, 16: the kept one and 15 of the flood.
    assert_eq!(closed, 200 - 15, "connections closed at once");
    assert_eq!(exchange(&mut kept, &get("/healthz")).unwrap().0, 200);
    let mut others: Vec<TcpStream> = (2..=4)
        .map(|last| connect_from(&server, [127, 0, 0, last]))
        .collect();
    for stream in &mut others {
        assert_eq!(exchange(stream, &get("/healthz")).unwrap().0, 200);
    }
    drop(flood);
    answered_on_a_new_connection(&server);
}

/// SIGTERM while a client holds a half-sent body: the process drains for
/// --shutdown-timeout, then exits 0 anyway.
#[test]
fn sigterm_with_a_half_sent_body_exits_0_after_the_shutdown_timeout() {
    let mut server = Server::binary(&["--shutdown-timeout", "1s", "--body-timeout", "60s"]);
    let mut stream = connect(&server);
    send_half_check_in_flight(&mut stream);
    wait_for_open_connections(&server, 2);
    let signalled = Instant::now();
    server.signal("TERM");
    let code = server
        .exit_code_within(PATIENCE)
        .expect("the server exits after SIGTERM");
    assert_eq!(code, Some(0));
    assert_between(
        signalled.elapsed(),
        Duration::from_millis(900),
        Duration::from_secs(5),
    );
}

/// Stopping under load loses no request. Clients sending requests back to back on
/// kept-alive HTTP/1.1 connections each have every request answered — the one in flight at
/// the stop, and the next one sent while the connection was idle — the last with
/// `connection: close`, after which the server closes the connection; no request is
/// written on a connection the server closes unanswered. A client idle at the stop has its
/// connection closed, nothing written on it.
#[test]
fn stopping_under_load_answers_every_request_then_closes() {
    let server = Server::start(&[]);
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut idle = connect(&server);
    assert_eq!(exchange(&mut idle, &get("/healthz")).unwrap().0, 200);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let mut stream = connect(&server);
            let answered = std::sync::Arc::clone(&answered);
            std::thread::spawn(move || {
                let mut answers = 0;
                loop {
                    let (head, _) = exchange_with_head(&mut stream, &get("/v1/rules"))
                        .unwrap_or_else(|e| panic!("request {} lost: {e}", answers + 1));
                    assert!(head.starts_with("http/1.1 200"), "{head}");
                    answers += 1;
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if head.contains("\r\nconnection: close\r\n") {
                        let after = read_until_closed(&mut stream);
                        assert!(after.is_empty(), "sent after connection: close: {after:?}");
                        return answers;
                    }
                }
            })
        })
        .collect();
    let start = Instant::now();
    while answered.load(std::sync::atomic::Ordering::Relaxed) < 400 {
        assert!(start.elapsed() < PATIENCE, "the clients are not answered");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(server.stop().success());
    for client in clients {
        let answers = client.join().expect("every request answered");
        assert!(answers > 1, "{answers}");
    }
    assert!(read_until_closed(&mut idle).is_empty());
}

/// One HTTP/2 frame: its type, flags, stream and payload.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

const DATA: u8 = 0;
const HEADERS: u8 = 1;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;

impl Frame {
    fn bytes(&self) -> Vec<u8> {
        let length = u32::try_from(self.payload.len()).unwrap().to_be_bytes();
        let mut bytes = vec![length[1], length[2], length[3], self.kind, self.flags];
        bytes.extend_from_slice(&self.stream.to_be_bytes());
        bytes.extend_from_slice(&self.payload);
        bytes
    }

    fn read(stream: &mut TcpStream) -> io::Result<Frame> {
        let mut head = [0u8; 9];
        stream.read_exact(&mut head)?;
        let length = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0; length];
        stream.read_exact(&mut payload)?;
        Ok(Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        })
    }
}

/// An HPACK header block, every field a literal never indexed (RFC 7541, 6.2.3) with a
/// literal name: what any decoder reads.
fn hpack(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x10);
        for text in [name, value] {
            block.push(u8::try_from(text.len()).unwrap());
            block.extend_from_slice(text.as_bytes());
        }
    }
    block
}

/// Stopping with an HTTP/2 stream in flight: the client hears GOAWAY (no error) at once,
/// the stream still finishes — its body, sent after the GOAWAY, is read and the check
/// answered 200 — and the connection is then closed.
#[test]
fn stopping_sends_goaway_and_finishes_http2_streams() {
    let server = Server::start(&["--body-timeout", "60s"]);
    let mut stream = connect(&server);
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    let settings = Frame {
        kind: 4,
        flags: 0,
        stream: 0,
        payload: Vec::new(),
    };
    stream.write_all(&settings.bytes()).unwrap();
    let check = Frame {
        kind: HEADERS,
        flags: END_HEADERS,
        stream: 1,
        payload: hpack(&[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/v1/check"),
            (":authority", "sluicegate"),
            ("content-type", "application/json"),
        ]),
    };
    stream.write_all(&check.bytes()).unwrap();
    // The server's SETTINGS: the connection is taken in (a stop before would leave it in
    // the listener's backlog, reset).
    assert_eq!(Frame::read(&mut stream).unwrap().kind, 4);
    let stopped = std::thread::spawn(move || server.stop().success());
    let mut goaways = Vec::new();
    let mut status = None;
    loop {
        let frame = match Frame::read(&mut stream) {
            Ok(frame) => frame,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("{e}"),
        };
        eprintln!(
            "FRAME {} {} {} {:?}",
            frame.kind, frame.flags, frame.stream, frame.payload
        );
        match frame.kind {
            PING if frame.flags & ACK == 0 => {
                let pong = Frame {
                    flags: ACK,
                    ..frame
                };
                stream.write_all(&pong.bytes()).unwrap();
            }
            GOAWAY => {
                if goaways.is_empty() {
                    assert_eq!(status, None, "answered before the GOAWAY");
                    let body = br#"{"domain":"example","descriptors":[{"entries":[{"key":"remote_address","value":"h2"}]}]}"#;
                    let data = Frame {
                        kind: DATA,
                        flags: END_STREAM,
                        stream: 1,
                        payload: body.to_vec(),
                    };
                    stream.write_all(&data.bytes()).unwrap();
                }
                let last = u32::from_be_bytes(frame.payload[..4].try_into().unwrap());
                let code = u32::from_be_bytes(frame.payload[4..8].try_into().unwrap());
                goaways.push((last & 0x7fff_ffff, code));
            }
            // :status 200, indexed in the static table.
            HEADERS if frame.stream == 1 && status.is_none() => status = Some(frame.payload[0]),
            _ => {}
        }
    }
    assert_eq!(status, Some(0x88), "the stream in flight is answered 200");
    assert!(!goaways.is_empty(), "no GOAWAY");
    assert!(goaways.iter().all(|(_, code)| *code == 0), "{goaways:?}");
    assert_eq!(
        goaways.last().unwrap().0,
        1,
        "stream 1 was taken: {goaways:?}"
    );
    assert!(stopped.join().unwrap());
}

/// A second signal during the drain ends the process at once, with SIGTERM's status.
#[test]
fn a_second_signal_exits_at_once() {
    let mut server = Server::binary(&["--shutdown-timeout", "60s", "--body-timeout", "60s"]);
    let mut stream = connect(&server);
    send_half_check_in_flight(&mut stream);
    wait_for_open_connections(&server, 2);
    server.signal("TERM");
    // The first signal is taken once the listener is closed.
    let start = Instant::now();
    while TcpStream::connect(&server.address).is_ok() {
        assert!(start.elapsed() < PATIENCE, "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let signalled = Instant::now();
    server.signal("TERM");
    let code = server
        .exit_code_within(PATIENCE)
        .expect("the server exits after a second SIGTERM");
    assert_eq!(code, Some(128 + 15));
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "{:?}",
        signalled.elapsed()
    );
}

/// Waits until the server counts `n` open connections (the one asking included).
fn wait_for_open_connections(server: &Server, n: u32) {
    let start = Instant::now();
    while metric(server, "sluicegate_connections_open") < f64::from(n) {
        assert!(
            start.elapsed() < PATIENCE,
            "fewer than {n} connections open"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A connection to the gRPC-only port of `server`.
fn connect_grpc(server: &Server) -> TcpStream {
    let stream = TcpStream::connect(server.grpc_address.as_ref().expect("--grpc-listen")).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream
}

/// The types of the HTTP/2 frames in `bytes` (each behind its 9-byte header).
fn frame_types(bytes: &[u8]) -> Vec<u8> {
    let mut types = Vec::new();
    let mut at = 0;
    while at + 9 <= bytes.len() {
        let length = usize::from(bytes[at]) << 16
            | usize::from(bytes[at + 1]) << 8
            | usize::from(bytes[at + 2]);
        types.push(bytes[at + 3]);
        at += 9 + length;
    }
    types
}

/// An HTTP/2 connection to the gRPC port is told to go away (GOAWAY) once
/// --grpc-max-connection-age old, give or take 10%; the main port's connections have no
/// maximum age.
#[test]
fn grpc_connections_go_away_at_their_maximum_age() {
    let server = Server::start(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--grpc-max-connection-age",
        "300ms",
    ]);
    let mut plain = connect(&server);
    let mut stream = connect_grpc(&server);
    let opened = Instant::now();
    // The client preface and an empty SETTINGS frame.
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .unwrap();
    stream.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).unwrap();
    const GOAWAY: u8 = 7;
    let mut received = Vec::new();
    let mut buf = [0; 4096];
    while !frame_types(&received).contains(&GOAWAY) {
        let n = stream.read(&mut buf).expect("a GOAWAY before PATIENCE");
        assert_ne!(n, 0, "closed without a GOAWAY: {received:?}");
        received.extend_from_slice(&buf[..n]);
    }
    assert_between(opened.elapsed(), Duration::from_millis(270), PATIENCE);
    assert_eq!(exchange(&mut plain, &get("/healthz")).unwrap().0, 200);
}

/// A call still in flight --grpc-max-connection-age-grace after the connection was told
/// to go away is cut with it.
#[test]
fn grpc_calls_outlasting_the_grace_are_cut() {
    let server = Server::start(&[
        "--grpc-listen",
        "127.0.0.1:0",
        "--grpc-max-connection-age",
        "300ms",
        "--grpc-max-connection-age-grace",
        "300ms",
        "--body-timeout",
        "60s",
    ]);
    let mut stream = connect_grpc(&server);
    let opened = Instant::now();
    // A ShouldRateLimit whose body never comes in full: in flight until cut. It asks
    // 100-continue, answered once the service reads the body.
    stream
        .write_all(
            b"POST /envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit HTTP/1.1\r\n\
              host: sluicegate\r\ncontent-type: application/grpc\r\ncontent-length: 200\r\n\
              expect: 100-continue\r\n\r\n",
        )
        .unwrap();
    let mut continued = [0u8; 25];
    stream.read_exact(&mut continued).unwrap();
    assert!(
        continued.starts_with(b"HTTP/1.1 100 Continue"),
        "{continued:?}"
    );
    stream.write_all(&[0, 0, 0, 0, 100]).unwrap();
    read_until_closed(&mut stream);
    assert_between(opened.elapsed(), Duration::from_millis(540), PATIENCE);
}
