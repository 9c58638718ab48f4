//! The fault proxy between a raw TCP client and a real redis-server: each fault does what
//! it says, and the proxy forwards faithfully without one.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluicegate_test_support::{Direction, FaultProxy, RedisServer, cmd};

/// A client connection through `proxy`, reads bounded to 5 s.
fn client(proxy: &FaultProxy) -> TcpStream {
    let stream = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
}

/// Sends an inline command and reads one reply line.
fn ask(stream: &mut TcpStream, command: &str) -> std::io::Result<String> {
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    read_line(stream)
}

fn read_line(stream: &mut TcpStream) -> std::io::Result<String> {
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        if stream.read(&mut byte)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        reply.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&reply).trim_end().to_owned())
}

fn exists(redis: &RedisServer, key: &str) -> bool {
    redis.query::<u64>(cmd("EXISTS").arg(key)).unwrap() == 1
}

#[test]
fn without_faults_it_forwards_and_counts_connections() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut stream = client(&proxy);
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    assert_eq!(proxy.connections(), 1);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(5);
    while proxy.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(proxy.connections(), 0);
}

#[test]
fn latency_delays_each_direction() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut stream = client(&proxy);
    proxy.set_latency(Duration::from_millis(100));
    let started = Instant::now();
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    proxy.set_latency(Duration::ZERO);
    let started = Instant::now();
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    assert!(started.elapsed() < Duration::from_millis(100));
}

#[test]
fn a_stall_holds_traffic_until_resumed_and_loses_nothing() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut stream = client(&proxy);
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    proxy.stall();
    stream.write_all(b"SET stalled yes\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(!exists(&redis, "stalled"), "forwarded during the stall");
    let started = Instant::now();
    proxy.resume();
    assert_eq!(read_line(&mut stream).unwrap(), "+OK");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(exists(&redis, "stalled"));
}

#[test]
fn reset_aborts_and_drop_closes_open_connections() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut reset = client(&proxy);
    assert_eq!(ask(&mut reset, "PING").unwrap(), "+PONG");
    proxy.reset();
    let err = read_line(&mut reset).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");

    let mut dropped = client(&proxy);
    assert_eq!(ask(&mut dropped, "PING").unwrap(), "+PONG");
    proxy.drop_connections();
    let err = read_line(&mut dropped).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
    // New connections are proxied as before.
    assert_eq!(ask(&mut client(&proxy), "PING").unwrap(), "+PONG");
}

#[test]
fn a_half_close_ends_one_direction_only() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    // Replies stop (the client reads end of stream), requests still arrive.
    let mut stream = client(&proxy);
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    proxy.half_close(Direction::ToClient);
    let err = ask(&mut stream, "SET to_server_still yes").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UnexpectedEof, "{err}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !exists(&redis, "to_server_still") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(exists(&redis, "to_server_still"));
    // Requests stop: the server is told the client is done, and answers nothing more.
    let mut stream = client(&proxy);
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    proxy.half_close(Direction::ToServer);
    let answer = ask(&mut stream, "SET never_arrives yes");
    assert!(answer.is_err(), "{answer:?}");
    assert!(!exists(&redis, "never_arrives"));
}

#[test]
fn a_blackhole_silences_open_connections_but_not_new_ones() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut stream = client(&proxy);
    assert_eq!(ask(&mut stream, "PING").unwrap(), "+PONG");
    proxy.blackhole();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let err = ask(&mut stream, "SET blackholed yes").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WouldBlock, "{err}");
    assert!(!exists(&redis, "blackholed"));
    assert_eq!(proxy.connections(), 1, "still open");
    assert_eq!(ask(&mut client(&proxy), "PING").unwrap(), "+PONG");
}

#[test]
fn refusing_aborts_open_and_new_connections_until_accepting_again() {
    let redis = RedisServer::start(&[]);
    let proxy = FaultProxy::start(redis.port);
    let mut open = client(&proxy);
    assert_eq!(ask(&mut open, "PING").unwrap(), "+PONG");
    proxy.refuse();
    let err = read_line(&mut open).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    // A new connection is accepted by the listener, then aborted before it reaches Redis.
    let answer = ask(&mut client(&proxy), "SET refused yes");
    assert!(answer.is_err(), "{answer:?}");
    assert!(!exists(&redis, "refused"));
    proxy.accept_again();
    assert_eq!(ask(&mut client(&proxy), "PING").unwrap(), "+PONG");
}
