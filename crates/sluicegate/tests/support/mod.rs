//! Real Redis servers for tests: started on free loopback ports by the tests themselves.
//!
//! Each server runs under a small shell that kills it when the test process exits (the
//! shell waits on a pipe from the test process; exiting closes it), so nothing outlives
//! the test run.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const HOW_TO_GET_REDIS: &str = "redis-server and redis-cli are needed: run scripts/test (it \
     installs them) or `apt-get install redis-server redis-tools`";

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    _guard: Child,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluicegate-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Sends one inline command and returns the raw reply.
pub fn command(port: u16, line: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(format!("{line}\r\n").as_bytes())?;
    let mut buf = [0u8; 65536];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

impl RedisServer {
    pub fn start(extra: &[&str]) -> RedisServer {
        RedisServer::start_at(free_port(), extra)
    }

    /// Stops the server at once (no save): what a crash looks like to clients.
    pub fn shutdown(&self) {
        let _ = command(self.port, "SHUTDOWN NOSAVE");
        let deadline = Instant::now() + Duration::from_secs(5);
        while command(self.port, "PING").is_ok() {
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not stop",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A server on a given port (to restart one that was shut down).
    pub fn start_at(port: u16, extra: &[&str]) -> RedisServer {
        let dir = scratch_dir(&format!("redis-{port}"));
        let mut args = vec![
            "--port".to_owned(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--save".into(),
            "''".into(),
            "--appendonly".into(),
            "no".into(),
            "--dir".into(),
            dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let script = format!(
            "command -v redis-server >/dev/null || exit 127; \
             redis-server {} >{}/log 2>&1 & server=$!; read _; kill $server 2>/dev/null",
            args.join(" "),
            dir.display()
        );
        let guard = Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .spawn()
            .expect("sh");
        let server = RedisServer {
            port,
            _guard: guard,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(reply) = command(port, "PING")
                && reply.starts_with("+PONG")
            {
                return server;
            }
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                panic!(
                    "redis-server did not start on port {port}. {HOW_TO_GET_REDIS}. \
                     Its log ends: {tail:?}"
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// A standalone server shared by every test of one test binary.
pub fn standalone() -> &'static RedisServer {
    static SERVER: OnceLock<RedisServer> = OnceLock::new();
    SERVER.get_or_init(|| RedisServer::start(&[]))
}

/// A three-master Redis Cluster shared by every test of one test binary.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.port))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }
}

pub fn cluster() -> &'static RedisCluster {
    static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| RedisCluster::start(3, 0))
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each; a node that stops answering is
    /// failed over after one second.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..masters * (1 + replicas))
            .map(|_| {
                RedisServer::start(&["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("redis-cli: {e}. {HOW_TO_GET_REDIS}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        for node in &nodes {
            while !command(node.port, "CLUSTER INFO")
                .is_ok_and(|info| info.contains("cluster_state:ok"))
            {
                assert!(
                    Instant::now() < deadline,
                    "the cluster did not become ready"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        RedisCluster { nodes }
    }

    /// The nodes that are masters now.
    pub fn current_masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|node| command(node.port, "ROLE").is_ok_and(|role| role.contains("master")))
            .collect()
    }
}
