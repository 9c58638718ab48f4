# Sourced by the scripts that start servers of their own on loopback ports: a redis-server,
# the service under measurement, limitador beside it. Each such script defines die MESSAGE.

# pick_port OFFSET [TAKEN…]: a loopback port P that is free, with P + OFFSET free too when
# OFFSET is not 0, and is none of the TAKEN ports (picked for servers that have not bound them
# yet), on standard output. Every port lies below the kernel's ephemeral range (Linux:
# net.ipv4.ip_local_port_range, 32768 to 60999 by default), as the tests' do: a port the
# kernel picks for a bind to port 0 or an outgoing connection could be taken between this
# check and the server's start. (The tests pick from the same range, checked free the same
# way: a script run beside scripts/test shares only that moment's race.)
pick_port() {
  python3 - "$@" <<'PY'
import random, socket, sys

offset = int(sys.argv[1])
taken = {int(port) for port in sys.argv[2:]}
try:
    first_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    first_ephemeral = 32768
end = min(first_ephemeral, 65536) - offset
if end - 10000 < 1000:
    raise SystemExit(f"no free port below the ephemeral range, which starts at {first_ephemeral}")
while True:
    port = random.randrange(10000, end)
    if port in taken:
        continue
    try:
        socket.socket().bind(("127.0.0.1", port))
        if offset:
            socket.socket().bind(("127.0.0.1", port + offset))
    except OSError:
        continue
    print(port)
    break
PY
}

# free_port [TAKEN…]: a free loopback port, none of the TAKEN ones (pick_port).
free_port() {
  pick_port 0 "$@"
}

# cluster_port: a free loopback port for a redis-server in cluster mode. Such a server also
# listens on its port + 10,000 (the cluster bus), free too, and below the ephemeral range.
cluster_port() {
  pick_port 10000
}

# start_redis PORT DIR [OPTION…]: a redis-server on 127.0.0.1:PORT (free_port's or
# cluster_port's), without persistence, its files and its log (DIR/redis.log) in DIR, the
# OPTIONs after those; run by the command in the array on_servers (placement.sh's) when it is
# set. Sets redis_port and redis_pid (the server's own process, for the caller's cleanup to
# kill: it is set before the wait) and waits up to 10 s for it to answer PING; dies with the
# log's tail when it exits first or does not answer, the server stopped.
start_redis() {
  local dir=$2
  redis_port=$1
  shift 2
  [[ $redis_port =~ ^[1-9][0-9]*$ ]] || die "no port for a redis-server (got '$redis_port')"
  mkdir -p "$dir"
  ${on_servers[@]+"${on_servers[@]}"} redis-server --port "$redis_port" --bind 127.0.0.1 \
    --save '' --appendonly no --dir "$dir" --logfile "$dir/redis.log" "$@" &
  redis_pid=$!
  for _ in $(seq 100); do
    if redis-cli -h 127.0.0.1 -p "$redis_port" PING >/dev/null 2>&1; then return 0; fi
    kill -0 "$redis_pid" 2>/dev/null || break
    sleep 0.1
  done
  stop_process "$redis_pid"
  die "redis-server did not start on port $redis_port: $(tail -n 5 "$dir/redis.log")"
}

# stop_process PID: SIGTERM, SIGKILL after 5 s, and reaped.
stop_process() {
  kill "$1" 2>/dev/null || true
  for _ in $(seq 50); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}

# start_serve LOG COMMAND…: runs COMMAND, a `sluicegate serve --listen 127.0.0.1:0 …` (perhaps
# behind a launcher such as taskset), logging to LOG at RUST_LOG=info, and waits up to 10 s
# for the address= it logs: the port the service bound itself, which nothing could take
# first. Sets service_pid and service_address.
start_serve() {
  local log=$1
  shift
  : >"$log" # before the service opens it, so that the first look finds a file
  RUST_LOG=info NO_COLOR=1 "$@" >/dev/null 2>"$log" &
  service_pid=$!
  service_address=""
  for _ in $(seq 100); do
    service_address=$(sed 's/\x1b\[[0-9;]*m//g' "$log" |
      grep -o 'address=127\.0\.0\.1:[0-9]*' | head -n 1 | cut -d= -f2) || true
    [ -z "$service_address" ] || return 0
    kill -0 "$service_pid" 2>/dev/null || die "serve exited: $(tail -n 5 "$log")"
    sleep 0.1
  done
  die "serve did not log its address= within 10 s: $(tail -n 5 "$log")"
}

# stop_serve: stops start_serve's service (SIGTERM: it drains and exits; stop_process).
stop_serve() {
  stop_process "$service_pid"
  service_pid=""
}

# wait_for_port PORT PID LOG: waits up to 10 s for 127.0.0.1:PORT to take a connection; dies
# with LOG's tail when PID exits first, or when nothing does.
wait_for_port() {
  local port=$1 pid=$2 log=$3
  for _ in $(seq 100); do
    if python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' \
      "$port" 2>/dev/null; then
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || die "process $pid exited: $(tail -n 5 "$log")"
    sleep 0.1
  done
  die "nothing listens on $port after 10 s: $(tail -n 5 "$log")"
}

# start_limitador LOG BINARY LIMITS [STORAGE…]: limitador-server (Kuadrant's) serving RLS on
# a free loopback port, its HTTP API on another, with the limits file LIMITS and its storage
# arguments (`memory` when none: `redis URL`, `redis_cached URL`), logging to LOG; waits until
# its RLS port takes connections. Sets service_pid and service_address.
start_limitador() {
  local log=$1 binary=$2 limits=$3 port
  shift 3
  port=$(free_port)
  "$binary" -b 127.0.0.1 -p "$port" -B 127.0.0.1 -P "$(free_port "$port")" "$limits" \
    "${@:-memory}" >/dev/null 2>"$log" &
  service_pid=$!
  service_address="127.0.0.1:$port"
  wait_for_port "$port" "$service_pid" "$log"
}
