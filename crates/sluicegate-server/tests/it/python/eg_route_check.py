"""Envoy in front of a route of Envoy Gateway: from the route's rate-limit actions (an
Envoy Gateway golden `*.routes.yaml`) and one HTTP request, the descriptors Envoy sends per
domain, sent to the rate-limit service with Python's grpcio as many times as asked.

Usage: eg_route_check.py HOST:PORT STEPS_JSON [CA], where STEPS_JSON is a list of steps played
in order on one channel, each
  {"routes": ROUTES_YAML, "route": NAME, "headers": {NAME: VALUE}, "remote_address": IP,
   "times": N}  (the request's pseudo-headers `:method` and `:path` among its headers, its
                 query in `:path`), or
  {"domain": D, "descriptors": [[[KEY, VALUE], ...], ...], "times": N}  (sent as given).
Over TLS, trusting the authority CA, when CA is given. Prints one JSON
list, per step a list of the domains called:
  [[{"domain": D, "descriptors": [[[KEY, VALUE], ...], ...],
     "codes": [overall code of each call, or the status name of a failed one],
     "limits": [[code, requests_per_unit or null] of each status of the last call]}]]
A domain whose actions yield no descriptor is not called (codes empty), as Envoy skips the
call.

The actions follow Envoy's `config.route.v3.RateLimit.Action`: a descriptor is the entries
of its actions in order, and an action that yields no entry drops the whole descriptor
(RequestHeaders with skip_if_absent only drops its entry). An action of a kind this does
not know is an error, never a guess.
"""
import ipaddress
import json
import pathlib
import re
import sys
import urllib.parse

import grpc
import yaml
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def string_match(spec, value):
    if value is None:
        return False
    pattern = spec["MatchPattern"]
    ((kind, wanted),) = pattern.items()
    if spec.get("ignore_case"):
        value = value.lower()
        if isinstance(wanted, str):
            wanted = wanted.lower()
    if kind == "Exact":
        return value == wanted
    if kind == "Prefix":
        return value.startswith(wanted)
    if kind == "Suffix":
        return value.endswith(wanted)
    if kind == "Contains":
        return wanted in value
    if kind == "SafeRegex":
        return re.fullmatch(wanted["regex"], value) is not None
    raise ValueError(f"unknown string match {kind}")


def matcher_matches(matcher, value):
    """A HeaderMatcher or QueryParameterMatcher, as Envoy's `MatchPattern` one-of."""
    known = {"name", "invert_match", "HeaderMatchSpecifier", "QueryParameterMatchSpecifier"}
    unknown = set(matcher) - known
    if unknown:
        raise ValueError(f"unknown matcher fields {sorted(unknown)}")
    specifier = matcher.get("HeaderMatchSpecifier") or matcher.get("QueryParameterMatchSpecifier")
    ((kind, spec),) = specifier.items()
    if kind == "StringMatch":
        matched = string_match(spec, value)
    elif kind == "PresentMatch":
        matched = (value is not None) == spec
    else:
        raise ValueError(f"unknown matcher {kind}")
    return matched != bool(matcher.get("invert_match", False))


def expected(action):
    if "expect_match" not in action:
        return True
    return bool((action["expect_match"] or {}).get("value", False))


def in_ranges(matcher, address):
    ip = ipaddress.ip_address(address)
    for entry in matcher["ranges"]:
        length = (entry.get("prefix_len") or {}).get("value", 0)
        network = ipaddress.ip_network(f"{entry['address_prefix']}/{length}", strict=False)
        if ip.version == network.version and ip in network:
            return True
    return False


def entry_of(action, request):
    """The entry an action yields: (key, value), None to drop the descriptor, or "skip" to
    leave only this entry out."""
    ((kind, spec),) = action["ActionSpecifier"].items()
    headers = request["headers"]
    if kind == "GenericKey":
        return (spec.get("descriptor_key") or "generic_key", spec["descriptor_value"])
    if kind == "RequestHeaders":
        value = headers.get(spec["header_name"])
        if value is None:
            return "skip" if spec.get("skip_if_absent") else None
        return (spec["descriptor_key"], value)
    if kind == "HeaderValueMatch":
        matched = all(matcher_matches(m, headers.get(m["name"])) for m in spec["headers"])
        if matched != expected(spec):
            return None
        return (spec.get("descriptor_key") or "header_match", spec["descriptor_value"])
    if kind == "QueryParameterValueMatch":
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(headers.get(":path", "")).query)
        matched = all(
            matcher_matches(m, (query.get(m["name"]) or [None])[0])
            for m in spec["query_parameters"]
        )
        if matched != expected(spec):
            return None
        return (spec.get("descriptor_key") or "query_match", spec["descriptor_value"])
    if kind == "RemoteAddressMatch":
        address = request["remote_address"]
        matcher = spec["address_matcher"]
        if in_ranges(matcher, address) == bool(matcher.get("invert_match", False)):
            return None
        value = spec["descriptor_value"].replace("%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%", address)
        return (spec["descriptor_key"], value)
    raise ValueError(f"unknown rate-limit action {kind}")


def descriptor_of(rate_limit, request):
    entries = []
    for action in rate_limit["actions"]:
        entry = entry_of(action, request)
        if entry is None:
            return None
        if entry != "skip":
            entries.append(entry)
    return entries or None


def open_channel(address, ca):
    if ca is None:
        return grpc.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(root_certificates=pathlib.Path(ca).read_bytes())
    return grpc.secure_channel(address, credentials)


def domains_of(step):
    """The (domain, descriptors) a step sends."""
    if "domain" in step:
        return [(step["domain"], step["descriptors"])]
    routes = [
        document for document in yaml.safe_load_all(pathlib.Path(step["routes"]).read_text())
        if document and document["routeName"] == step["route"]
    ]
    if len(routes) != 1:
        raise ValueError(f"route {step['route']} is in {len(routes)} documents of {step['routes']}")
    return [
        (domain, [d for d in (descriptor_of(r, step) for r in rate_limits) if d])
        for domain, rate_limits in routes[0]["rateLimitsByDomain"].items()
    ]


def play(stub, domain, descriptors, times):
    request = rls_pb2.RateLimitRequest(
        domain=domain,
        descriptors=[
            ratelimit_pb2.RateLimitDescriptor(
                entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in d]
            )
            for d in descriptors
        ],
        hits_addend=1,
    )
    codes, limits = [], []
    for _ in range(times if descriptors else 0):
        try:
            response = stub.ShouldRateLimit(request, timeout=5)
        except grpc.RpcError as error:
            codes.append(error.code().name)
            continue
        codes.append(response.overall_code)
        limits = [
            [s.code, s.current_limit.requests_per_unit if s.HasField("current_limit") else None]
            for s in response.statuses
        ]
    return {"domain": domain, "descriptors": descriptors, "codes": codes, "limits": limits}


def main():
    address, steps = sys.argv[1], json.loads(sys.argv[2])
    ca = sys.argv[3] if len(sys.argv) > 3 else None
    # Derived before the first call, so that the calls of all steps follow each other closely.
    planned = [(domains_of(step), step["times"]) for step in steps]
    with open_channel(address, ca) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        print(json.dumps([
            [play(stub, domain, [[tuple(e) for e in d] for d in descriptors], times)
             for domain, descriptors in domains]
            for domains, times in planned
        ]))


if __name__ == "__main__":
    main()
