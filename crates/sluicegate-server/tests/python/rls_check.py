"""One ShouldRateLimit call from Python's grpcio, the protobuf written by hand.

Usage: rls_check.py HOST:PORT DOMAIN KEY VALUE, or rls_check.py HOST:PORT --garbage
Prints the response's overall_code (1 OK, 2 OVER_LIMIT) and its headers to add, or the
gRPC status code name of a failed call.
"""
import sys

import grpc


def field(number, wire, payload):
    return varint(number << 3 | wire) + payload


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def string(number, text):
    data = text.encode()
    return field(number, 2, varint(len(data)) + data)


def message(number, data):
    return field(number, 2, varint(len(data)) + data)


def read_varint(data, i):
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, i


def fields(data):
    i = 0
    while i < len(data):
        key, i = read_varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = read_varint(data, i)
        elif wire == 2:
            length, i = read_varint(data, i)
            value, i = data[i:i + length], i + length
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield number, value


def main():
    address = sys.argv[1]
    if sys.argv[2] == "--garbage":
        # Bytes that are no RateLimitRequest: the status code, not a crash.
        request = bytes(range(256)) * 3
    else:
        domain, key, value = sys.argv[2:5]
        entry = string(1, key) + string(2, value)
        descriptor = message(1, entry)
        request = string(1, domain) + message(2, descriptor) + field(3, 0, varint(1))
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        try:
            response = call(request, timeout=5)
        except grpc.RpcError as error:
            print(error.code().name)
            return
    code = 0
    headers = []
    for number, value in fields(response):
        if number == 1:
            code = value
        elif number == 3:
            header = dict(fields(value))
            headers.append(f"{header[1].decode()}: {header[2].decode()}")
    print(code)
    for h in headers:
        print(h)


if __name__ == "__main__":
    main()
