//! Every socket the service accepts has Nagle's algorithm off, on the HTTP and the gRPC
//! listener: a small answer goes out at once rather than after the client's delayed ACK
//! (~40 ms, which with Nagle on puts a load's p999 near 45 ms). Read back from the kernel
//! on the service's own side of each connection, the service running in this process.

#![cfg(target_os = "linux")]

use crate::server;

use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use server::Server;
use sluicegate_test_support::{OwnSocket, own_tcp_sockets};

/// Connects to `address` and returns the service's end of that connection as the kernel
/// has it, once it shows TCP_NODELAY or after a bounded wait (the option is set right after
/// the accept, so a moment may pass between the two).
fn accepted(address: &str) -> Option<OwnSocket> {
    let client = TcpStream::connect(address).unwrap();
    let (listening, client_end): (SocketAddr, SocketAddr) =
        (address.parse().unwrap(), client.local_addr().unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let accepted = own_tcp_sockets()
            .into_iter()
            .find(|s| s.local == listening && s.peer == client_end);
        if accepted.is_some_and(|s| s.nodelay) || Instant::now() > deadline {
            return accepted;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn http_and_grpc_connections_are_accepted_with_tcp_nodelay() {
    let server = Server::start(&["--grpc-listen", "127.0.0.1:0"]);
    let grpc = server.grpc_address.clone().expect("a gRPC address");
    for (listener, address) in [("HTTP", &server.address), ("gRPC", &grpc)] {
        let socket = accepted(address);
        assert!(
            socket.is_some_and(|s| s.nodelay),
            "{listener}: the accepted socket {socket:?}"
        );
    }
}
