#!/usr/bin/env python3
"""Writes the seed inputs of fuzz/corpus/ that are built rather than copied (docs/fuzzing.md):
protobuf messages of the sync stream and the lease API, JSON bodies of the HTTP routes, and
the limits examples in the limits target's input format. The log target's seeds are segments
an agent wrote (see docs/fuzzing.md), not built here.

Protobuf is written by hand (varints and length-delimited fields): the field numbers are
those of proto/allot/sync/v1/sync.proto and proto/allot/lease/v1/lease.proto."""

import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def uint(field, n):
    return varint(field << 3) + varint(n) if n else b""


def sint(field, n):
    return varint(field << 3) + varint((n << 1) ^ (n >> 63))


def msg(field, body):
    if isinstance(body, str):
        body = body.encode()
    return varint(field << 3 | 2) + varint(len(body)) + body


def write(target, name, data):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# ---- sync stream (SyncUp: selector 0, SyncDown: selector 1) -----------------------------
NOW_NS = 1_767_225_600_000_000_000
HOUR_WINDOW = NOW_NS // 1_000_000_000 // 3600


def counter(limit, key, window):
    return msg(1, limit) + msg(2, key) + uint(3, window)


def entry(limit, key, window, region, granted, refunded):
    return msg(1, counter(limit, key, window)) + msg(2, region) + uint(3, granted) + uint(4, refunded)


sync_up = (
    msg(1, "eu-west") + uint(2, 1) + uint(3, 7) + uint(4, NOW_NS) + uint(5, 1)
    + msg(6, entry("llm/tenant", "acme", HOUR_WINDOW, "eu-west", 120_000, 3_000))
    + msg(6, entry("llm/tenant", "globex", HOUR_WINDOW, "eu-west", 5_000, 0))
    + msg(7, msg(1, counter("llm/tenant", "acme", HOUR_WINDOW)) + uint(3, 300_000) + uint(4, 40_000_000_000))
    + msg(8, uint(1, 3) + msg(2, counter("llm/tenant", "acme", HOUR_WINDOW)) + uint(3, 1000) + uint(4, 299_000))
    + msg(9, sint(1, -1_500_000) + uint(2, 800_000))
    + msg(10, msg(1, "llm/tenant") + uint(2, HOUR_WINDOW) + msg(3, uint(1, 2) + uint(2, 500) + uint(3, 10)))
    + msg(13, uint(1, NOW_NS - 5_000_000_000) + uint(2, 2_000_000))
    + uint(14, 1)
)
write("sync_messages", "sync_up", b"\x00" + sync_up)
write("sync_messages", "sync_up_minimal", b"\x00" + msg(1, "us-east") + uint(3, 1))

with open(os.path.join(ROOT, "examples", "limits", "llm_tokens.yaml"), "rb") as f:
    llm = f.read()
sync_down = (
    uint(1, 7) + uint(2, 1) + uint(3, NOW_NS) + uint(4, NOW_NS + 1_000_000) + uint(5, 2)
    + msg(6, entry("llm/tenant", "acme", HOUR_WINDOW, "us-east", 90_000, 1_000))
    + msg(7, msg(1, counter("llm/tenant", "acme", HOUR_WINDOW)) + msg(2, "eu-west") + uint(3, 400_000) + uint(4, 2))
    + msg(8, uint(1, 4) + msg(2, counter("llm/tenant", "globex", HOUR_WINDOW)) + uint(3, 2000) + uint(4, 1))
    + uint(9, 1)
    + msg(10, uint(1, 2) + msg(3, msg(1, "llm_tokens.yaml") + msg(2, llm)))
)
write("sync_messages", "sync_down", b"\x01" + sync_down)
write("sync_messages", "sync_down_minimal", b"\x01" + uint(1, 1) + uint(9, 1))

# ---- lease API: calls of `selector | len u16 LE | body` ---------------------------------
ACQUIRE, LEASE, BATCH, RENEW, RELEASE, SETTLE, SLOT, UNSLOT, RLS = range(9)
HTTP = 9  # then the routes in the order of lease_requests.rs's ROUTES


# The ids a fresh agent hands out on the target's clock: its first lease's, then one up each.
FIRST_LEASE = 1_809_639_014_400_000


def call(selector, body, step=0):
    if isinstance(body, str):
        body = body.encode()
    return bytes([step << 4 | selector]) + struct.pack("<H", len(body)) + body


def target(value, key="generic_key", domain="default"):
    return msg(1, domain) + msg(2, msg(1, key) + msg(2, value))


lease = msg(1, target("checkout")) + uint(2, 50) + uint(3, 1) + uint(4, 2000) + msg(5, "k-1")
write("lease_requests", "grpc_lease_renew_settle_release", b"".join([
    call(LEASE, lease),
    call(LEASE, lease),  # the same idempotency key: a replay
    call(RENEW, uint(1, FIRST_LEASE) + uint(2, 5000) + msg(3, "k-2"), step=3),
    call(SETTLE, uint(1, FIRST_LEASE) + uint(2, 20) + msg(3, "k-3")),
    call(RELEASE, uint(1, FIRST_LEASE) + uint(2, 30)),
]))
write("lease_requests", "grpc_acquire_batch_slots", b"".join([
    call(ACQUIRE, msg(1, target("10.0.0.1", key="remote_address")) + uint(2, 3)),
    call(BATCH, msg(1, msg(1, target("a")) + uint(2, 10)) + msg(1, msg(1, target("b")) + uint(2, 10) + msg(6, uint(1, FIRST_LEASE) + uint(2, 4)))),
    call(SLOT, msg(1, target("worker")) + msg(2, "s-1")),
    call(UNSLOT, uint(1, 1), step=1),
]))
rls = msg(1, "default") + msg(2, msg(1, msg(1, "remote_address") + msg(2, "10.0.0.9"))) + uint(3, 2)
write("lease_requests", "rls_should_rate_limit", call(RLS, rls) + call(RLS, rls, step=10))

J = lambda v: json.dumps(v, separators=(",", ":"))
tgt = {"domain": "default", "entries": [{"key": "generic_key", "value": "search"}]}
write("lease_requests", "http_lease_renew_settle_release", b"".join([
    call(HTTP + 1, J({"target": tgt, "units_wanted": 20, "min_units": 1, "ttl_ms": 1000, "idempotency_key": "h-1"})),
    call(HTTP + 3, J({"lease_id": FIRST_LEASE, "ttl_ms": 3000}), step=2),
    call(HTTP + 5, J({"lease_id": FIRST_LEASE, "actual_units": 7})),
    call(HTTP + 4, J({"lease_id": FIRST_LEASE, "unused_units": 3})),
]))
write("lease_requests", "http_acquire_batch_slots", b"".join([
    call(HTTP + 0, J({"target": tgt, "cost_units": 2})),
    call(HTTP + 2, J({"leases": [{"target": tgt, "units_wanted": 5}, {"target": tgt, "units_wanted": 5, "returns": [{"lease_id": FIRST_LEASE, "unused_units": 1}]}]})),
    call(HTTP + 6, J({"target": tgt, "idempotency_key": "s"})),
    call(HTTP + 7, J({"slot_id": 1})),
    call(HTTP + 1, "{\"target\": nul"),
]))

# ---- limits: flags byte (bit 0: merge domains), files separated by NUL ------------------
examples = os.path.join(ROOT, "examples", "limits")
for name in sorted(os.listdir(examples)):
    with open(os.path.join(examples, name), "rb") as f:
        write("limits_config", name.removesuffix(".yaml"), b"\x00" + f.read())
write("limits_config", "merged_domains", b"\x01" + b"\x00".join([
    b"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n",
    b"domain: d\ndescriptors:\n  - key: b\n    value: x*\n    rate_limit: {unit: minute, requests_per_unit: 7}\n    shadow_mode: true\n",
]))

# ---- RLQS: up to 16 messages, each `step | len: u16 LE | RateLimitQuotaUsageReports` ------
# Field numbers of envoy/service/rate_limit_quota/v3/rlqs.proto: reports {domain = 1,
# bucket_quota_usages = 2}, usage {bucket_id = 1, time_elapsed = 2, allowed = 3, denied = 4},
# bucket id {map<string, string> bucket = 1}.
def bucket(**entries):
    return b"".join(msg(1, msg(1, k) + msg(2, v)) for k, v in entries.items())


def usage(bucket_id, elapsed_s, allowed, denied=0):
    return msg(1, bucket_id) + msg(2, uint(1, elapsed_s)) + uint(3, allowed) + uint(4, denied)


def report(step, *usages):
    body = msg(1, "envoy") + b"".join(msg(2, u) for u in usages)
    return bytes([step]) + struct.pack("<H", len(body)) + body


ip = bucket(domain="default", remote_address="10.0.0.1")
generic = bucket(domain="default", generic_key="search")
unmatched = bucket(domain="other", path="/x")
write("rlqs_reports", "first_then_periodic", b"".join([
    report(0, usage(ip, 0, 1), usage(generic, 0, 1)),
    report(10, usage(ip, 1, 40, 3), usage(generic, 1, 9)),
    report(10, usage(ip, 1, 55, 20), usage(unmatched, 1, 5)),
    report(50, usage(generic, 5, 0)),
]))
write("rlqs_reports", "no_domain_entry", report(0, usage(bucket(remote_address="10.0.0.2"), 0, 1)))

# ---- callers file (D59) ------------------------------------------------------------------
SECRET_SHA256 = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"  # "secret"
write("callers_file", "tokens_and_certificates", J({"callers": [
    {"name": "edge", "certificate": True, "domains": ["default"], "max_calls_per_sec": 100},
    {"name": "py", "token_sha256": SECRET_SHA256, "domains": ["*"]},
]}).encode())
write("callers_file", "problems", J({"callers": [
    {"name": "a", "token_sha256": "zz", "domains": []},
    {"name": "a", "certificate": True, "domains": ["default"], "max_calls_per_sec": 0},
]}).encode())
