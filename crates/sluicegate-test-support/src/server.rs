//! One redis-server process on a loopback port, and the client calls tests make to it.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpListener;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::{AsyncConnectionConfig, Cmd, FromRedisValue, RedisResult, TlsCertificates, Value, cmd};

use crate::poll::poll_until;

/// What to do when redis-server cannot be started.
pub(crate) const HOW_TO_GET_REDIS: &str = "redis-server and redis-cli are needed: run \
     scripts/test (it installs them) or `apt-get install redis-server redis-tools`";

/// How long one client call may take: connecting, and waiting for its reply. Long enough
/// to outlast a `CLIENT PAUSE` a test sets, short enough that a hung server fails the test.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How a client reaches a server: in plain text or over TLS only, as the default user or
/// as an ACL user.
#[derive(Clone, Debug, Default)]
pub(crate) struct Access {
    /// For a server that speaks only TLS: the certificate (PEM) of the authority that
    /// signed the server's, to trust it.
    pub(crate) tls_ca: Option<Vec<u8>>,
    /// The user and password it requires of clients (URL-safe words).
    pub(crate) user: Option<(String, String)>,
}

/// One redis-server process listening on 127.0.0.1, with no persistence and a scratch
/// directory of its own. It is killed, and its directory removed, when this value is
/// dropped or the test process exits (a server in a `static` is never dropped).
pub struct RedisServer {
    /// The loopback port it listens on (its TLS port when it speaks only TLS).
    pub port: u16,
    /// How [`query`](Self::query) reaches it.
    access: Access,
    /// A cluster node's bus port, held as `port` is.
    cluster_bus: Option<u16>,
    /// The shell the server runs under ([`spawn_under_shell`]).
    shell: Child,
}

impl RedisServer {
    /// A server on a free port, with `extra` redis-server options (`["--requirepass",
    /// "secret"]`). Returns once it answers `PING`.
    pub fn start(extra: &[&str]) -> RedisServer {
        RedisServer::launch_new(free_port(), None, extra, Access::default())
    }

    /// A Redis Cluster node on a free port, with `extra` redis-server options. Its cluster
    /// bus listens on a second free port, held as the first is: by default it would listen
    /// on the port + 10000, which no one holds for it, so that another server, or a
    /// connection the kernel gave that port to, could keep the node from starting.
    pub(crate) fn start_cluster_node(extra: &[&str]) -> RedisServer {
        RedisServer::launch_cluster_node(free_port(), extra)
    }

    /// A cluster node's bus port (what `CLUSTER MEET` is told besides its port).
    pub(crate) fn cluster_bus(&self) -> Option<u16> {
        self.cluster_bus
    }

    /// Starts a cluster node on `port`, which the caller has counted in [`HELD_PORTS`].
    fn launch_cluster_node(port: u16, extra: &[&str]) -> RedisServer {
        let bus = free_port();
        let bus_arg = bus.to_string();
        let mut options = vec!["--cluster-enabled", "yes", "--cluster-port", &bus_arg];
        options.extend_from_slice(extra);
        let mut server = RedisServer::launch_new(port, None, &options, Access::default());
        server.cluster_bus = Some(bus);
        server
    }

    /// This server started again with `extra` options, on its port and in its directory
    /// (it finds what it saved there), once it was [shut down](Self::shutdown) or
    /// [killed](Self::kill): its directory is kept for the new process. For a server
    /// [`start`](Self::start)ed plain: the new one is started so, without the TLS, users,
    /// configuration file or cluster bus another kind would need again.
    pub fn restart(mut self, extra: &[&str]) -> RedisServer {
        let plain = self.cluster_bus.is_none()
            && self.access.tls_ca.is_none()
            && self.access.user.is_none()
            && !self.directory().join(CONFIG_FILE).exists();
        assert!(
            plain,
            "restart starts plain servers only (port {})",
            self.port
        );
        let port = self.port;
        *HELD_PORTS.lock().unwrap().entry(port).or_default() += 1;
        let mut pipe = self.shell.stdin.take().expect("the shell's pipe");
        pipe.write_all(KEEP_DIRECTORY)
            .expect("the shell reads its pipe until the server is dropped");
        drop(pipe);
        drop(self);
        RedisServer::launch(port, None, extra, Access::default())
    }

    /// A server on a free port reading `config` as its configuration file first (Sentinel
    /// needs one it can rewrite), then `extra` options; reached as `access` says. A TLS
    /// one listens on its TLS port only: `extra` or `config` names its certificate files.
    pub(crate) fn start_configured(config: &str, extra: &[&str], access: Access) -> RedisServer {
        RedisServer::launch_new(free_port(), Some(config), extra, access)
    }

    /// [`launch`](Self::launch)es a new server on `port`, from an empty scratch directory: an
    /// earlier process of the same id may have left one for the port (its shell killed
    /// before it could remove it), and a new server must not start from what that holds (a
    /// cluster node would take up the old cluster from its nodes.conf).
    fn launch_new(port: u16, config: Option<&str>, extra: &[&str], access: Access) -> RedisServer {
        match std::fs::remove_dir_all(scratch_directory(port)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                panic!("the scratch directory of port {port}: {e}")
            }
            _ => {}
        }
        RedisServer::launch(port, config, extra, access)
    }

    /// Starts a server on `port`, which the caller has counted in [`HELD_PORTS`], in the
    /// port's scratch directory as it is (a restarted server finds what it saved there).
    fn launch(port: u16, config: Option<&str>, extra: &[&str], access: Access) -> RedisServer {
        let dir = scratch_directory(port);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        let mut args: Vec<String> = Vec::new();
        if let Some(config) = config {
            let file = dir.join(CONFIG_FILE);
            std::fs::write(&file, config).expect("a configuration file");
            args.push(file.display().to_string());
        }
        let port_arg = port.to_string();
        let dir_arg = dir.display().to_string();
        let listen = match access.tls_ca {
            Some(_) => vec!["--port", "0", "--tls-port", &port_arg],
            None => vec!["--port", &port_arg],
        };
        let defaults = [
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            &dir_arg,
        ];
        args.extend(
            listen
                .iter()
                .chain(&defaults)
                .chain(extra)
                .map(|s| (*s).to_owned()),
        );
        let server = RedisServer {
            port,
            access,
            cluster_bus: None,
            shell: spawn_under_shell(&dir, &args),
        };
        let answers = poll_until(Duration::from_secs(10), || {
            server
                .query::<String>(&cmd("PING"))
                .is_ok_and(|reply| reply == "PONG")
        });
        if !answers {
            let log = server.log();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            panic!(
                "redis-server did not start on port {port}. {HOW_TO_GET_REDIS}. \
                 Its log ends: {tail:?}"
            );
        }
        server
    }

    /// What it has written to standard output and error so far: for a test's failure
    /// message, where the server's own account of what it did says why.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.directory().join(LOG)).unwrap_or_default()
    }

    /// Its scratch directory, which holds its log and what it saves.
    pub fn directory(&self) -> PathBuf {
        scratch_directory(self.port)
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Sends one command on a connection of its own and converts the reply, e.g.
    /// `server.query::<u64>(cmd("EXISTS").arg(&key))`.
    pub fn query<T: FromRedisValue>(&self, command: &Cmd) -> RedisResult<T> {
        self.query_within(command, CALL_TIMEOUT)
    }

    /// [`query`](Self::query), for a command that may take up to `timeout` to answer
    /// (one with a timeout of its own, such as `MIGRATE`).
    pub(crate) fn query_within<T: FromRedisValue>(
        &self,
        command: &Cmd,
        timeout: Duration,
    ) -> RedisResult<T> {
        let user = self
            .access
            .user
            .as_ref()
            .map_or(String::new(), |(user, password)| {
                format!("{user}:{password}@")
            });
        let client = match &self.access.tls_ca {
            Some(ca) => {
                // rustls needs a process-wide cryptography provider; ring is the one the
                // workspace builds. Installing it again is a no-op.
                let _already_installed = rustls::crypto::ring::default_provider().install_default();
                redis::Client::build_with_tls(
                    format!("rediss://{user}127.0.0.1:{}", self.port),
                    TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.clone()),
                    },
                )?
            }
            None => redis::Client::open(format!("redis://{user}127.0.0.1:{}", self.port))?,
        };
        // The reply is awaited under a timer, not read from a socket with a timeout
        // (SO_RCVTIMEO): such a read fails with EINTR when the test process is stopped and
        // resumed, even with no signal handler (man 7 signal). On a thread of its own, with
        // a runtime of its own: the caller may be in a runtime.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(timeout));
        let reply = std::thread::scope(|scope| {
            scope
                .spawn(|| -> RedisResult<Value> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async {
                        let mut connection = client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await?;
                        command.query_async(&mut connection).await
                    })
                })
                .join()
                .expect("the client's thread does not panic")
        })?;
        Ok(redis::from_redis_value(reply)?)
    }

    /// Stops the server at once (no save): what a crash looks like to clients. Returns
    /// once it no longer answers.
    pub fn shutdown(&self) {
        // The server closes the connection instead of replying: there is nothing to read.
        let _ = self.query::<()>(cmd("SHUTDOWN").arg("NOSAVE"));
        let stopped = poll_until(Duration::from_secs(5), || {
            self.query::<()>(&cmd("PING")).is_err()
        });
        assert!(stopped, "redis-server on {} did not stop", self.port);
    }

    /// Stops the server's process (SIGSTOP) for `pause`, then lets it go on (SIGCONT):
    /// a stall as a stop-the-world pause, a swapped-out host or a frozen VM makes it. It
    /// keeps its connections and answers what it was sent once it resumes. Blocks the
    /// calling thread for `pause`.
    pub fn freeze(&self, pause: Duration) {
        let pid = self.pid();
        signal(pid, "STOP");
        std::thread::sleep(pause);
        signal(pid, "CONT");
    }

    /// Kills the server's process (SIGKILL): a crash that saves nothing and says nothing
    /// to anyone. Returns once it no longer answers.
    pub fn kill(&self) {
        signal(self.pid(), "KILL");
        let stopped = poll_until(Duration::from_secs(5), || {
            self.query::<()>(&cmd("PING")).is_err()
        });
        assert!(stopped, "redis-server on {} did not die", self.port);
    }

    /// How many replicas are online on it: connected and in sync (`INFO replication`'s
    /// `slaveN:` lines with `state=online`), so that they acknowledge writes.
    pub fn online_replicas(&self) -> usize {
        let info: String = self
            .query(cmd("INFO").arg("replication"))
            .expect("INFO replication answers");
        info.lines()
            .filter(|line| line.starts_with("slave") && line.contains("state=online"))
            .count()
    }

    /// The port of the master it replicates now (`ROLE`), if it is a replica.
    pub fn master_port(&self) -> Option<u16> {
        let role: Vec<Value> = self.query(&cmd("ROLE")).ok()?;
        match role.as_slice() {
            [Value::BulkString(name), _host, port, ..] if name == b"slave" => {
                redis::from_redis_value_ref(port).ok()
            }
            _ => None,
        }
    }

    /// The server's process id, as it reports it (`INFO server`).
    pub fn pid(&self) -> u32 {
        let info: String = self
            .query(cmd("INFO").arg("server"))
            .expect("INFO server answers");
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
            .expect("INFO server names the process_id")
    }

    /// Whether it is a master now (`ROLE`), as opposed to a replica.
    pub fn is_master(&self) -> bool {
        self.query::<Vec<Value>>(&cmd("ROLE")).is_ok_and(
            |role| matches!(role.first(), Some(Value::BulkString(name)) if name == b"master"),
        )
    }
}

/// Sends `SIG{name}` to `pid` with kill(1).
fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -{name} {pid} failed");
}

/// The scratch directory of this process's servers on `port`.
fn scratch_directory(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("sluicegate-redis-{port}-{}", std::process::id()))
}

/// A free loopback port, for a server started here or a process that must be told its port
/// before it starts (a service under test, one of its listeners), or one nothing must listen
/// on. It is counted in [`HELD_PORTS`] in the same step that found it free: the check's
/// listener is closed at once, so another thread's check would find the port free too until
/// the first server binds it. A port held for a server is freed when the server is dropped;
/// any other, never. It lies below the kernel's ephemeral range ([`ports_to_pick`]): a port
/// the kernel picks (for a bind to port 0, or for the local end of an outgoing connection)
/// and frees again may go to another test's connection or bind to port 0 before the process
/// told to listen on it has bound it.
pub fn free_port() -> u16 {
    let ports = ports_to_pick();
    let span = u32::from(ports.end - ports.start);
    // Processes start at different ports, so that two test processes at once seldom meet.
    let offset = std::process::id().wrapping_mul(7919);
    let mut held = HELD_PORTS.lock().unwrap();
    for _ in 0..span {
        let pick = NEXT_PICK
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(offset)
            % span;
        let port = ports.start + pick as u16;
        if !held.contains_key(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            held.insert(port, 1);
            return port;
        }
    }
    // Unlocked first, so that other tests fail with this message, not a poisoned lock.
    drop(held);
    panic!("no free loopback port in {ports:?}");
}

/// How many ports [`free_port`] has tried in this process.
static NEXT_PICK: AtomicU32 = AtomicU32::new(0);

/// The ports tests pick from: 10000 up to the kernel's ephemeral range (Linux:
/// net.ipv4.ip_local_port_range, 32768 to 60999 by default), none of which the kernel
/// hands out by itself.
fn ports_to_pick() -> Range<u16> {
    const FIRST: u16 = 10000;
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    assert!(
        first_ephemeral > FIRST,
        "the kernel's ephemeral ports start at {first_ephemeral}: tests pick ports from \
         {FIRST} up to them (net.ipv4.ip_local_port_range)"
    );
    FIRST..first_ephemeral
}

/// The ports [`free_port`] gave out: a server's as many times as servers hold it, any other
/// for good. A server that was shut down keeps its port until it is dropped, since a test may
/// restart it there, and a free port picked meanwhile for another server must not be that one
/// (two servers would then answer for each other).
static HELD_PORTS: Mutex<BTreeMap<u16, usize>> = Mutex::new(BTreeMap::new());

impl Drop for RedisServer {
    fn drop(&mut self) {
        // Closing the pipe has the shell kill the server and remove its directory (unless
        // a restart kept it); once the shell is done, the port is free for another server.
        drop(self.shell.stdin.take());
        if let Err(e) = self.shell.wait() {
            eprintln!("the shell of redis-server on {}: {e}", self.port);
        }
        let mut held = HELD_PORTS.lock().unwrap_or_else(|e| e.into_inner());
        for port in std::iter::once(self.port).chain(self.cluster_bus) {
            if let Some(count) = held.get_mut(&port) {
                *count -= 1;
                if *count == 0 {
                    held.remove(&port);
                }
            }
        }
    }
}

/// The file in a server's directory that its output goes to.
const LOG: &str = "log";

/// The configuration file in a server's directory, for a server started with one.
const CONFIG_FILE: &str = "redis.conf";

/// What [`RedisServer::restart`] writes to the shell's pipe, so that the shell leaves the
/// directory to the server that starts in it next.
const KEEP_DIRECTORY: &[u8] = b"keep\n";

/// Runs `redis-server ARGS` in `directory` (output to its [`LOG`]) under a shell that waits
/// on a pipe from this process: once the pipe closes (the returned child's stdin is closed
/// or this process exits, however it exits), the shell kills the server (SIGKILL: a stopped
/// or busy server too), waits for it, and removes `directory`, unless the pipe said
/// [`KEEP_DIRECTORY`] first.
fn spawn_under_shell(directory: &Path, args: &[String]) -> Child {
    let script = "command -v redis-server >/dev/null || exit 127; \
         dir=$1; log=$2; shift 2; redis-server \"$@\" >\"$log\" 2>&1 & server=$!; \
         read -r kept; kill -KILL $server 2>/dev/null; wait $server 2>/dev/null; \
         [ \"$kept\" = keep ] || rm -rf \"$dir\"";
    Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(directory)
        .arg(directory.join(LOG))
        .args(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port picked for a process lies below the kernel's ephemeral range, where neither a
    /// bind to port 0 nor an outgoing connection of another test can be given it before the
    /// process binds it; and no two picks are alike.
    #[cfg(target_os = "linux")]
    #[test]
    fn free_ports_lie_below_the_kernels_ephemeral_range() {
        let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap();
        let first_ephemeral: u16 = range.split_whitespace().next().unwrap().parse().unwrap();
        let picked: Vec<u16> = (0..64).map(|_| free_port()).collect();
        assert!(
            picked.iter().all(|&port| port < first_ephemeral),
            "{picked:?}: not all below {first_ephemeral}"
        );
        let distinct: std::collections::BTreeSet<u16> = picked.iter().copied().collect();
        assert_eq!(distinct.len(), picked.len(), "{picked:?}");
    }

    /// A cluster node starts where the port + 10000, its bus port unless told, is taken.
    #[test]
    fn a_cluster_node_starts_where_its_port_plus_10000_is_taken() {
        let port = free_port();
        // Taken here, unless it is taken already.
        let _taken = TcpListener::bind(("127.0.0.1", port + 10000));
        let node = RedisServer::launch_cluster_node(port, &[]);
        assert_eq!(
            node.query::<String>(&cmd("PING")).ok().as_deref(),
            Some("PONG")
        );
    }

    /// A new server on a port whose scratch directory is left over (from an earlier
    /// process of the same id) starts from nothing that directory holds.
    #[test]
    fn a_new_server_on_a_port_used_before_starts_empty() {
        let first = RedisServer::start(&[]);
        let port = first.port;
        first
            .query::<()>(cmd("SET").arg("left").arg("behind"))
            .expect("SET");
        first.query::<()>(&cmd("SAVE")).expect("SAVE");
        let saved = std::fs::read(first.directory().join("dump.rdb")).expect("the saved data");
        // Held on for the second server: a parallel test must not take the port meanwhile.
        *HELD_PORTS.lock().unwrap().entry(port).or_default() += 1;
        drop(first);
        std::fs::create_dir_all(scratch_directory(port)).expect("a leftover directory");
        std::fs::write(scratch_directory(port).join("dump.rdb"), saved).expect("leftover data");
        let second = RedisServer::launch_new(port, None, &[], Access::default());
        assert_eq!(second.query::<u64>(&cmd("DBSIZE")).ok(), Some(0));
    }

    /// A reply awaited while the test process is stopped and resumed still arrives. (A
    /// socket read with a timeout fails with EINTR when its process is stopped and then
    /// resumed, even with no signal handler installed: man 7 signal.)
    #[test]
    fn a_query_outlasts_the_test_process_being_stopped_and_resumed() {
        let server = RedisServer::start(&[]);
        let pid = std::process::id();
        // A process of its own stops this one while the reply is awaited, and resumes it.
        let mut stopper = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sleep 0.3; kill -STOP {pid}; sleep 0.2; kill -CONT {pid}"
            ))
            .spawn()
            .expect("sh");
        // BLPOP of a list that stays empty answers nil after a second on Redis' side.
        let reply = server.query::<Option<(String, String)>>(cmd("BLPOP").arg("empty").arg(1));
        assert_eq!(stopper.wait().ok().map(|s| s.success()), Some(true));
        assert!(matches!(reply, Ok(None)), "{reply:?}");
    }
}
