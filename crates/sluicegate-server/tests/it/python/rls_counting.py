"""One ShouldRateLimit call of several descriptors from Python's grpcio, through the stubs
generated from Envoy's RLS v3 protos (PyPI's xds-protos), each descriptor with its own
hits_addend.

Usage: rls_counting.py HOST:PORT DOMAIN KEY=VALUE[,KEY=VALUE...][*HITS]...
Prints the overall code's name, then per descriptor its code's name and limit_remaining;
or the gRPC status code name of a failed call and its message on the next line.
"""
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2


def entry(pair):
    key, _, value = pair.partition("=")
    return ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)


def descriptor(text):
    pairs, _, hits = text.partition("*")
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[entry(pair) for pair in pairs.split(",")]
    )
    if hits:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=int(hits)))
    return d


def main():
    address, domain = sys.argv[1:3]
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=[descriptor(d) for d in sys.argv[3:]]
    )
    codes = rls_pb2.RateLimitResponse.Code
    with grpc.insecure_channel(address) as channel:
        try:
            stub = rls_pb2_grpc.RateLimitServiceStub(channel)
            response = stub.ShouldRateLimit(request, timeout=5)
        except grpc.RpcError as error:
            print(error.code().name)
            print(error.details())
            return
    print(codes.Name(response.overall_code))
    for status in response.statuses:
        print(codes.Name(status.code), status.limit_remaining)


if __name__ == "__main__":
    main()
