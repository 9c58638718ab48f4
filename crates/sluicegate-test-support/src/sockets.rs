//! This process's own TCP sockets and their options, as the kernel holds them: every
//! descriptor of `/proc/self/fd` that is a socket is duplicated with `pidfd_getfd` (which
//! hands back an owned descriptor) and asked with getsockname, getpeername and
//! getsockopt. What a test uses to see, say, that the service set TCP_NODELAY on the
//! socket it accepted, or that a Redis client set it on the socket it connected.

use std::net::SocketAddr;

use rustix::net::sockopt;
use rustix::process::{PidfdFlags, PidfdGetfdFlags, getpid, pidfd_getfd, pidfd_open};

/// One TCP socket of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnSocket {
    /// This end.
    pub local: SocketAddr,
    /// The other end.
    pub peer: SocketAddr,
    /// Whether TCP_NODELAY is set (Nagle's algorithm off).
    pub nodelay: bool,
}

/// The connected TCP sockets this process holds now.
pub fn own_tcp_sockets() -> Vec<OwnSocket> {
    let process = pidfd_open(getpid(), PidfdFlags::empty()).expect("pidfd_open on this process");
    let descriptors = std::fs::read_dir("/proc/self/fd").expect("/proc/self/fd");
    descriptors
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            if !target.to_string_lossy().starts_with("socket:") {
                return None;
            }
            let number: i32 = entry.file_name().to_str()?.parse().ok()?;
            // Gone since the listing, or not ours to take: not a socket of interest.
            let socket = pidfd_getfd(&process, number, PidfdGetfdFlags::empty()).ok()?;
            let local = SocketAddr::try_from(rustix::net::getsockname(&socket).ok()?).ok()?;
            let peer = SocketAddr::try_from(rustix::net::getpeername(&socket).ok()??).ok()?;
            let nodelay = sockopt::tcp_nodelay(&socket).ok()?;
            Some(OwnSocket {
                local,
                peer,
                nodelay,
            })
        })
        .collect()
}
