"""What grpcurl does, from Python's grpcio-reflection client: list the server's services
by reflection, resolve the rate-limit service's descriptors through it (no protos or
stubs of our own), and call ShouldRateLimit with a message built from them.

Usage: reflection_call.py HOST:PORT DOMAIN KEY VALUE
Prints one service name a line, then `method NAME` for each method of the rate-limit
service, then `overall_code N` of one call.
"""
import sys

import grpc
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

RLS = "envoy.service.ratelimit.v3.RateLimitService"


def main(address, domain, key, value):
    channel = grpc.insecure_channel(address)
    database = ProtoReflectionDescriptorDatabase(channel)
    for service in sorted(database.get_services()):
        print(service)
    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName(RLS)
    for method in service.methods:
        print("method", method.name)
    method = service.methods_by_name["ShouldRateLimit"]
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    request = json_format.ParseDict(
        {"domain": domain, "descriptors": [{"entries": [{"key": key, "value": value}]}]},
        request_class(),
    )
    call = channel.unary_unary(
        f"/{RLS}/ShouldRateLimit",
        request_serializer=request_class.SerializeToString,
        response_deserializer=response_class.FromString,
    )
    print("overall_code", call(request, timeout=5).overall_code)


if __name__ == "__main__":
    main(*sys.argv[1:5])
