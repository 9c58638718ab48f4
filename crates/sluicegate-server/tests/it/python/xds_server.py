"""An xDS management server for the tests: state-of-the-world ADS over Python's grpcio,
serving envoyproxy/ratelimit's RateLimitConfig resources, as Envoy Gateway's management
server serves them to its rate-limit Deployment.

Usage: xds_server.py [--port N] [--node ID] [--tls CERT KEY] [--client-ca CA]

It listens on 127.0.0.1:N (0: a free port) and prints one JSON line per event on standard
output:
  {"event": "listening", "port": N}
  {"event": "request", "node": ID, "metadata": {...}, "version_info": V,
   "response_nonce": N, "error_detail": {"code": C, "message": M} or null,
   "type_url": T, "resource_names": [...], "headers": {NAME: VALUE}}  (each DiscoveryRequest)
  {"event": "response", "node": ID, "version_info": V, "nonce": N, "resources": K}
  {"event": "pushed", "version_info": V, "resources": K}
  {"event": "error", "message": M}  (a command it could not carry out)
and reads commands, one per line, on standard input:
  push VERSION FILE...  serve the RateLimitConfig documents of these YAML files (each
                        document one resource, as Envoy Gateway's golden files hold them)
                        as VERSION, to every stream open now and every stream to come
With --node, only streams whose node id is ID are served (a snapshot cache keyed by node,
as go-control-plane's is); with --tls, it speaks TLS only; with --client-ca too, it
requires a client certificate of that authority. It stops when standard input closes, so
it never outlives the test that started it.
"""
import argparse
import importlib
import json
import pathlib
import queue
import subprocess
import sys
import tempfile
import threading
from concurrent import futures

import grpc
import yaml
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, json_format

PROTO_DIR = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "envoy-ratelimit-api"
TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
# Fields of a newer RateLimitDescriptor than the vendored proto has; Envoy Gateway's golden
# files carry them, always false (the proto3 default, which the wire leaves out).
NEWER_FIELDS = ("value_to_metric", "share_threshold")

OUTPUT = threading.Lock()


def emit(event):
    with OUTPUT:
        print(json.dumps(event), flush=True)


def compile_rls_conf():
    """rls_conf_pb2, generated from the vendored proto into a directory of its own."""
    out = tempfile.mkdtemp(prefix="sluicegate-xds-proto-")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}",
         "rls_conf.proto"],
        check=True,
    )
    sys.path.insert(0, out)
    return importlib.import_module("rls_conf_pb2")


def without_newer_fields(node, where):
    if isinstance(node, list):
        return [without_newer_fields(item, where) for item in node]
    if not isinstance(node, dict):
        return node
    kept = {}
    for key, value in node.items():
        if key in NEWER_FIELDS:
            if value:
                raise ValueError(f"{where}: {key} is {value!r}; the vendored proto lacks it")
            continue
        kept[key] = without_newer_fields(value, where)
    return kept


def load_resources(rls_conf, paths):
    resources = []
    for path in paths:
        for document in yaml.safe_load_all(pathlib.Path(path).read_text()):
            if document is None:
                continue
            config = json_format.ParseDict(
                without_newer_fields(document, path), rls_conf.RateLimitConfig()
            )
            packed = any_pb2.Any()
            packed.Pack(config)
            resources.append(packed)
    return resources


class Snapshot:
    """The resources served now, and the streams they go to."""

    def __init__(self):
        self.lock = threading.Lock()
        self.version = None
        self.resources = []
        self.streams = []
        self.nonce = 0

    def response(self, node):
        """The current state as a DiscoveryResponse, or None before the first push."""
        if self.version is None:
            return None
        self.nonce += 1
        emit({"event": "response", "node": node, "version_info": self.version,
              "nonce": str(self.nonce), "resources": len(self.resources)})
        return discovery_pb2.DiscoveryResponse(
            version_info=self.version, resources=self.resources, type_url=TYPE_URL,
            nonce=str(self.nonce),
        )

    def push(self, version, resources):
        with self.lock:
            self.version, self.resources = version, resources
            emit({"event": "pushed", "version_info": version, "resources": len(resources)})
            for node, outbox in self.streams:
                outbox.put(self.response(node))


class AggregatedDiscovery(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, snapshot, node_served):
        self.snapshot = snapshot
        self.node_served = node_served

    def StreamAggregatedResources(self, request_iterator, context):
        headers = {key: value for key, value in context.invocation_metadata()}
        outbox = queue.Queue()
        registered = []

        def read():
            try:
                for request in request_iterator:
                    node = request.node.id
                    emit({
                        "event": "request",
                        "node": node,
                        "metadata": json_format.MessageToDict(request.node.metadata),
                        "version_info": request.version_info,
                        "response_nonce": request.response_nonce,
                        "error_detail": (
                            {"code": request.error_detail.code,
                             "message": request.error_detail.message}
                            if request.HasField("error_detail") else None
                        ),
                        "type_url": request.type_url,
                        "resource_names": list(request.resource_names),
                        "headers": headers,
                    })
                    served = self.node_served is None or node == self.node_served
                    if registered or not served:
                        continue
                    with self.snapshot.lock:
                        entry = (node, outbox)
                        self.snapshot.streams.append(entry)
                        registered.append(entry)
                        first = self.snapshot.response(node)
                        if first is not None:
                            outbox.put(first)
            except grpc.RpcError:
                pass
            finally:
                outbox.put(None)

        threading.Thread(target=read, daemon=True).start()
        try:
            while context.is_active():
                response = outbox.get()
                if response is None:
                    return
                yield response
        finally:
            with self.snapshot.lock:
                for entry in registered:
                    self.snapshot.streams.remove(entry)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--node")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    parser.add_argument("--client-ca")
    args = parser.parse_args()

    rls_conf = compile_rls_conf()
    snapshot = Snapshot()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(
        AggregatedDiscovery(snapshot, args.node), server
    )
    address = f"127.0.0.1:{args.port}"
    if args.tls:
        cert, key = (pathlib.Path(p).read_bytes() for p in args.tls)
        client_ca = pathlib.Path(args.client_ca).read_bytes() if args.client_ca else None
        credentials = grpc.ssl_server_credentials(
            [(key, cert)], root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise SystemExit(f"cannot listen on {address}")
    server.start()
    emit({"event": "listening", "port": port})

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "push" and len(words) >= 2:
                snapshot.push(words[1], load_resources(rls_conf, words[2:]))
            else:
                raise ValueError(f"unknown command {line.strip()!r}")
        except Exception as error:  # a bad command is told, and the server goes on
            emit({"event": "error", "message": str(error)})
    server.stop(0)


if __name__ == "__main__":
    main()
