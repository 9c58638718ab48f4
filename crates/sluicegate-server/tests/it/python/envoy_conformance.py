"""The envoy conformance suite's second client: Python's grpcio, through the stubs PyPI's
xds-protos generates from Envoy's protos, playing the steps of the suite's case files.

Usage: envoy_conformance.py CASES_DIR. The Rust suite (tests/it/envoy_conformance/mod.rs) starts
a server per case and writes one JSON line per case to standard input,
{"case": ID, "mode": "envoy"|"default", "address": "HOST:PORT"}; this answers each with one
line, {"failure": null} or {"failure": "why"}, judged as tests/it/envoy_conformance/judge.rs
judges (the README of CASES_DIR describes the format).
"""
import json
import pathlib
import sys

import grpc
import yaml
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2

# As envoyproxy/ratelimit@f2fb157 src/utils/utilities.go:20-38 divides time.
UNIT_SECONDS = {
    "SECOND": 1,
    "MINUTE": 60,
    "HOUR": 3600,
    "DAY": 86400,
    "WEEK": 7 * 86400,
    "MONTH": 30 * 86400,
    "YEAR": 365 * 86400,
}
CODE = rls_pb2.RateLimitResponse.Code
UNIT = rls_pb2.RateLimitResponse.RateLimit.Unit


def load_cases(directory):
    cases = {}
    for path in sorted(pathlib.Path(directory, "cases").glob("*.yaml")):
        for case in yaml.safe_load(path.read_text())["cases"]:
            cases[case["id"]] = case
    return cases


def descriptor(spec, i):
    if isinstance(spec, list):
        spec = {"entries": spec}
    message = ratelimit_pb2.RateLimitDescriptor(
        entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v.replace("{i}", str(i)))
            for k, v in spec["entries"]
        ]
    )
    if spec.get("hits_addend") is not None:
        message.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=spec["hits_addend"]))
    if spec.get("limit") is not None:
        message.limit.requests_per_unit = spec["limit"]["requests_per_unit"]
        message.limit.unit = UNIT.Value(spec["limit"]["unit"])
    return message


def request(step, i):
    spec = step["request"]
    return rls_pb2.RateLimitRequest(
        domain=spec["domain"],
        descriptors=[descriptor(d, i) for d in spec["descriptors"]],
        hits_addend=spec.get("hits_addend", 1),
    )


def remaining_at(spec, i):
    if isinstance(spec, dict):
        return spec["start"] + i * spec["step"]
    return spec


def reset_difference(n, got, mode):
    at = f"statuses[{n}].duration_until_reset"
    has_reset = got.HasField("duration_until_reset")
    if not got.HasField("current_limit"):
        if has_reset:
            return f"{at}: {got.duration_until_reset} on a status without a limit"
        return None
    if not has_reset:
        return f"{at}: absent on a limited status"
    reset = got.duration_until_reset
    unit = UNIT_SECONDS.get(UNIT.Name(got.current_limit.unit))
    if reset.seconds < 0 or reset.nanos < 0:
        return f"{at}: negative: {reset}"
    if unit is not None and reset.seconds * 10**9 + reset.nanos > unit * 10**9:
        return f"{at}: {reset.seconds}s {reset.nanos}ns exceeds the unit, {unit} s"
    # envoy's CalculateReset: the unit less the time into it, whole seconds, never 0.
    if mode == "envoy" and (reset.nanos != 0 or reset.seconds == 0):
        return f"{at}: {reset.seconds}s {reset.nanos}ns, envoy sends whole seconds, at least 1"
    return None


def shown(name, requests_per_unit, unit):
    return f"{json.dumps(name)} {requests_per_unit}/{unit}"


def status_differences(n, want, got, i, mode):
    at = f"statuses[{n}]"
    differences = []
    code = CODE.Name(got.code)
    if code != want["code"]:
        differences.append(f"{at}.code {code}, want {want['code']}")
    have = None
    if got.HasField("current_limit"):
        limit = got.current_limit
        have = shown(limit.name, limit.requests_per_unit, UNIT.Name(limit.unit))
    need = None
    if want.get("current_limit") is not None:
        limit = want["current_limit"]
        need = shown(limit.get("name", ""), limit["requests_per_unit"], limit["unit"])
    if have != need:
        differences.append(f"{at}.current_limit {have or 'none'}, want {need or 'none'}")
    remaining = remaining_at(want.get("limit_remaining", 0), i)
    if got.limit_remaining != remaining:
        differences.append(f"{at}.limit_remaining {got.limit_remaining}, want {remaining}")
    reset = reset_difference(n, got, mode)
    if reset is not None:
        differences.append(reset)
    return differences


def header_fits(want, key, value):
    if key.lower() != want["key"].lower():
        return False
    if "value" in want and want["value"] != value:
        return False
    if "between" in want:
        low, high = want["between"]
        return value.isdigit() and low <= int(value) <= high
    return True


def header_difference(want, response):
    got = [(h.key, h.value) for h in response.response_headers_to_add]
    fits = len(want) == len(got) and all(
        sum(header_fits(w, k, v) for k, v in got) == 1 for w in want
    )
    return None if fits else f"response_headers_to_add {got}, want {want}"


def judge(step, i, mode, response, error):
    """None when the answer is the one expected, else every difference."""
    expect = step["expect"]
    if "grpc_error" in expect:
        if error is None:
            return f"answered {CODE.Name(response.overall_code)}, want gRPC {expect['grpc_error']}"
        if error.code().name != expect["grpc_error"]:
            return f"gRPC {error.code().name} ({error.details()}), want {expect['grpc_error']}"
        return None
    if error is not None:
        return f"gRPC {error.code().name}: {error.details()}"
    differences = []
    code = CODE.Name(response.overall_code)
    if code != expect["overall_code"]:
        differences.append(f"overall_code {code}, want {expect['overall_code']}")
    statuses = expect.get("statuses")
    if statuses is not None:
        if len(statuses) != len(response.statuses):
            differences.append(f"{len(response.statuses)} statuses, want {len(statuses)}")
        else:
            for n, (want, got) in enumerate(zip(statuses, response.statuses)):
                differences.extend(status_differences(n, want, got, i, mode))
    header = header_difference(expect.get("response_headers", []), response)
    if header is not None:
        differences.append(header)
    return "; ".join(differences) or None


def play(case, mode, address):
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for n, step in enumerate(case["steps"]):
            for i in range(step.get("repeat", 1)):
                response, error = None, None
                try:
                    response = stub.ShouldRateLimit(request(step, i), timeout=10)
                except grpc.RpcError as rpc_error:
                    error = rpc_error
                difference = judge(step, i, mode, response, error)
                if difference is not None:
                    return f"step {n}, request {i}: {difference}"
    return None


def main():
    cases = load_cases(sys.argv[1])
    for line in sys.stdin:
        ask = json.loads(line)
        failure = play(cases[ask["case"]], ask["mode"], ask["address"])
        print(json.dumps({"failure": failure}), flush=True)


if __name__ == "__main__":
    main()
