"""One ShouldRateLimit call from Python's grpcio, through the stubs generated from Envoy's
RLS v3 protos (PyPI's xds-protos).

Usage: rls_check.py HOST:PORT DOMAIN KEY VALUE, or rls_check.py HOST:PORT --garbage
Prints the response's overall_code (1 OK, 2 OVER_LIMIT) and its headers to add, or the
gRPC status code name of a failed call and its message on the next line. Over TLS when
RLS_CHECK_CA names the authority to trust; with RLS_CHECK_CERT and RLS_CHECK_KEY too, with
that client certificate.
"""
import os
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def should_rate_limit(channel, domain, key, value):
    request = rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)]
            )
        ],
        hits_addend=1,
    )
    return rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)


def send_garbage(channel):
    # Bytes that are no RateLimitRequest: the status code, not a crash. A generated stub
    # only sends valid messages, so this request goes out raw.
    call = channel.unary_unary(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        request_serializer=lambda raw: raw,
        response_deserializer=rls_pb2.RateLimitResponse.FromString,
    )
    return call(bytes(range(256)) * 3, timeout=5)


def open_channel(address):
    if "RLS_CHECK_CA" not in os.environ:
        return grpc.insecure_channel(address)

    def pem(name):
        path = os.environ.get(name)
        if path is None:
            return None
        with open(path, "rb") as file:
            return file.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=pem("RLS_CHECK_CA"),
        private_key=pem("RLS_CHECK_KEY"),
        certificate_chain=pem("RLS_CHECK_CERT"),
    )
    return grpc.secure_channel(address, credentials)


def main():
    address = sys.argv[1]
    with open_channel(address) as channel:
        try:
            if sys.argv[2] == "--garbage":
                response = send_garbage(channel)
            else:
                domain, key, value = sys.argv[2:5]
                response = should_rate_limit(channel, domain, key, value)
        except grpc.RpcError as error:
            print(error.code().name)
            print(error.details())
            return
    print(response.overall_code)
    for header in response.response_headers_to_add:
        print(f"{header.key}: {header.value}")


if __name__ == "__main__":
    main()
