//! The example app as its docs say to try it: a burst of 8 on `/slow` at once is shaped
//! by its leaky bucket (2 per second, a queue of 5) — answered half a second apart, the
//! two beyond the queue refused by it — and no per-client limit answers first.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example on a free port, killed when dropped.
struct App(Child);

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start() -> (App, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_axum-app-example"))
        .env("LISTEN", "127.0.0.1:0")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .strip_prefix("listening on http://")
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    (App(child), address)
}

/// One `GET path` on a connection of its own: the whole response, and how long it took.
fn get(address: &str, path: &str) -> (String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    (response, started.elapsed())
}

#[test]
fn a_burst_on_slow_waits_in_its_queue() {
    let (_app, address) = start();
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let address = address.clone();
            std::thread::spawn(move || get(&address, "/slow"))
        })
        .collect();
    let answers: Vec<(String, Duration)> = burst.into_iter().map(|t| t.join().unwrap()).collect();
    let served: Vec<Duration> = answers
        .iter()
        .filter(|(response, _)| response.starts_with("HTTP/1.1 200"))
        .map(|(_, took)| *took)
        .collect();
    let refused: Vec<&String> = answers
        .iter()
        .map(|(response, _)| response)
        .filter(|response| response.starts_with("HTTP/1.1 429"))
        .collect();
    // One goes at once and five wait in the queue; the queue refuses the rest itself (on
    // a machine so loaded that the burst spreads over half a second, one more drains in).
    assert_eq!(served.len() + refused.len(), 8, "{answers:?}");
    assert!(served.len() >= 6 && !refused.is_empty(), "{answers:?}");
    for response in refused {
        assert!(response.contains("\"shaped\""), "{response}");
        assert!(!response.contains("per-client"), "{response}");
    }
    // The last of the queue waited its 5 × 0.5 s (a loaded machine only adds to it).
    let longest = served.iter().max().unwrap();
    assert!(*longest >= Duration::from_millis(2400), "{served:?}");
}
