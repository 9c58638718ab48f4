# Sourced by the scripts that start a redis-server in cluster mode (bench-cluster,
# redis-instructions).

# cluster_port: a free loopback port for a redis-server in cluster mode, on standard output.
# Such a server also listens on its port + 10,000 (the cluster bus), and will not start on a
# port above 55535; a port the kernel picks (up to 60999 on Linux) may be one.
cluster_port() {
  python3 -c '
import random, socket
while True:
    port = random.randrange(20000, 55536)
    try:
        socket.socket().bind(("127.0.0.1", port))
        socket.socket().bind(("127.0.0.1", port + 10000))
    except OSError:
        continue
    print(port)
    break'
}
