# Sourced by the scripts that start a redis-server in cluster mode (bench-cluster,
# redis-instructions).

# cluster_port: a free loopback port for a redis-server in cluster mode, on standard output.
# Such a server also listens on its port + 10,000 (the cluster bus), and will not start on a
# port above 55535. Both ports lie below the kernel's ephemeral range (Linux:
# net.ipv4.ip_local_port_range, 32768 to 60999 by default), as the tests' do: a port the
# kernel picks for a bind to port 0 or an outgoing connection could be taken between this
# check and the server's start.
cluster_port() {
  python3 -c '
import random, socket
try:
    first_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except OSError:
    first_ephemeral = 32768
last = min(first_ephemeral, 55536) - 10000
if last <= 10000:
    raise SystemExit(f"no cluster port below the ephemeral range, which starts at {first_ephemeral}")
while True:
    port = random.randrange(10000, last)
    try:
        socket.socket().bind(("127.0.0.1", port))
        socket.socket().bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    print(port)
    break'
}
