"""One grpc.health.v1.Health/Check call from Python's grpcio, through the stubs of PyPI's
grpcio-health-checking.

Usage: health_check.py HOST:PORT SERVICE [--watch]
Prints the serving status's name (SERVING, NOT_SERVING, ...) — with --watch, the first
message of a Watch — or the gRPC status code name of a failed call and its message on
the next line.
"""
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main():
    address, service = sys.argv[1], sys.argv[2]
    watch = sys.argv[3:] == ["--watch"]
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        try:
            if watch:
                answer = next(iter(stub.Watch(request, timeout=5)))
            else:
                answer = stub.Check(request, timeout=5)
        except grpc.RpcError as error:
            print(error.code().name)
            print(error.details())
            return
        print(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


if __name__ == "__main__":
    main()
