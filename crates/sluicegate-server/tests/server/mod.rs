//! A `sluicegate serve` process on a free loopback port, for end-to-end tests.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};

pub struct Server {
    pub child: Child,
    pub address: String,
    /// With --grpc-listen: the gRPC-only address.
    pub grpc_address: Option<String>,
}

impl Server {
    /// Starts `sluicegate serve --listen 127.0.0.1:0 ARGS` and waits for its addresses.
    pub fn start(args: &[&str]) -> Server {
        let wants_grpc = args.contains(&"--grpc-listen");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluicegate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut address, mut grpc_address) = (None, None);
        for line in lines.by_ref().map_while(Result::ok) {
            for word in line.split_whitespace() {
                if let Some(a) = word.strip_prefix("grpc_address=") {
                    grpc_address = Some(a.to_owned());
                } else if let Some(a) = word.strip_prefix("address=") {
                    address = Some(a.to_owned());
                }
            }
            if address.is_some() && (grpc_address.is_some() || !wants_grpc) {
                break;
            }
        }
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Server {
            child,
            address: address.expect("the server logs its address"),
            grpc_address,
        }
    }

    /// One HTTP/1.1 request on a fresh connection: the status and the body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(&self.address).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.address,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response[9..12].parse().unwrap();
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    /// SIGTERM, and the exit status.
    pub fn stop(mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(killed.success());
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
