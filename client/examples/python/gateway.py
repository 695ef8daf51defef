#!/usr/bin/env python3
"""A small LLM gateway that enforces tokens per minute per API key with allot, over the
agent's HTTP/JSON lease API (docs/agent.md, "HTTP/JSON"). Standard library only.

Each call names its key in `Authorization: Bearer KEY` and sends `{"prompt": TEXT,
"max_tokens": N}`. The gateway reserves the prompt's tokens plus `max_tokens` before the
model runs (a lease of exactly that many units), runs the model, then settles the tokens
really used: the agent refunds the difference. A reservation the key's budget cannot cover is
answered 429 with Retry-After. Settles carry an idempotency key, so a settle retried after a
lost answer is counted once.

The "model" is a stand-in: it echoes the prompt's words, at most `max_tokens` of them, and a
token is a whitespace-separated word. Replace `run_model` with a real call.

    allot agent --config client/examples/python/limits.yaml --data /tmp/allot-py
    python3 client/examples/python/gateway.py --agent http://127.0.0.1:8080 --listen 127.0.0.1:9000
    curl -s -H 'Authorization: Bearer team-a' -d '{"prompt":"hello there","max_tokens":50}' \\
        http://127.0.0.1:9000/v1/completions

`--self-test` runs the reserve-then-settle checks against the agent instead of serving.
"""

import argparse
import json
import math
import sys
import time
import urllib.error
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# A reservation lives this long at most: a call that outlives it is charged in full.
RESERVATION_TTL_MS = 60_000
# Tries of one settle before giving up (the lease then expires, charged in full).
SETTLE_TRIES = 3
# Bounds on what a caller may send.
MAX_BODY_BYTES = 64 * 1024
MAX_TOKENS_LIMIT = 100_000
# Longest the gateway waits on its agent, in seconds.
AGENT_TIMEOUT_SECS = 2.0


class AgentError(Exception):
    """The agent answered with an error (its JSON `error` and HTTP status), or not at all."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Agent:
    """The agent's HTTP/JSON lease API."""

    def __init__(self, base_url, domain):
        self.base_url = base_url.rstrip("/")
        self.domain = domain

    def call(self, path, body):
        data = json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path,
            data=data,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=AGENT_TIMEOUT_SECS) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as e:
            try:
                message = json.load(e).get("error", "")
            except ValueError:
                message = e.reason
            raise AgentError(e.code, message) from None
        except (urllib.error.URLError, OSError) as e:
            raise AgentError(0, str(e)) from None

    def target(self, api_key):
        return {"domain": self.domain, "entries": [{"key": "api_key", "value": api_key}]}

    def reserve(self, api_key, tokens, request_id):
        """A lease of exactly `tokens` units, or the agent's refusal (lease None)."""
        return self.call(
            "/v1/lease",
            {
                "target": self.target(api_key),
                "units_wanted": tokens,
                "min_units": tokens,
                "ttl_ms": RESERVATION_TTL_MS,
                "idempotency_key": "reserve-" + request_id,
            },
        )

    def settle(self, lease_id, actual_tokens, request_id):
        """Reports what a reservation really used; retried with the same key on failure."""
        body = {
            "lease_id": lease_id,
            "actual_units": actual_tokens,
            "idempotency_key": "settle-" + request_id,
        }
        for attempt in range(SETTLE_TRIES):
            try:
                return self.call("/v1/settle", body)
            except AgentError as e:
                # A 4xx will not change on a retry; a lost answer might have been applied,
                # and the idempotency key makes the retry count once.
                if 400 <= e.status < 500 or attempt + 1 == SETTLE_TRIES:
                    raise
                time.sleep(0.05 * (2**attempt))
        raise AssertionError("unreachable")


def count_tokens(text):
    return len(text.split())


def run_model(prompt, max_tokens):
    """The stand-in model: echoes the prompt, at most `max_tokens` words."""
    return " ".join(prompt.split()[:max_tokens])


def parse_call(handler):
    """(api_key, prompt, max_tokens) from the request, or raises ValueError saying why."""
    auth = handler.headers.get("Authorization", "")
    if not auth.startswith("Bearer ") or not auth[7:].strip():
        raise ValueError("Authorization: Bearer API_KEY is required")
    length = int(handler.headers.get("Content-Length") or 0)
    if length <= 0 or length > MAX_BODY_BYTES:
        raise ValueError(f"a JSON body of 1 to {MAX_BODY_BYTES} bytes is required")
    try:
        body = json.loads(handler.rfile.read(length))
    except ValueError:
        raise ValueError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    prompt = body.get("prompt")
    max_tokens = body.get("max_tokens")
    if not isinstance(prompt, str):
        raise ValueError("prompt: a string is required")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        raise ValueError("max_tokens: an integer is required")
    if not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise ValueError(f"max_tokens: 1 to {MAX_TOKENS_LIMIT}")
    return auth[7:].strip(), prompt, max_tokens


class Gateway(BaseHTTPRequestHandler):
    agent = None  # set by serve()
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        if self.path != "/v1/completions":
            return self.reply(404, {"error": "POST /v1/completions"})
        try:
            api_key, prompt, max_tokens = parse_call(self)
        except ValueError as e:
            return self.reply(400, {"error": str(e)})
        request_id = uuid.uuid4().hex
        reserved = count_tokens(prompt) + max_tokens
        try:
            answer = self.agent.reserve(api_key, reserved, request_id)
        except AgentError as e:
            # Tokens cost money: an agent that cannot be asked admits nothing.
            return self.reply(503, {"error": f"quota service: {e}"})
        lease, decision = answer["lease"], answer["decision"]
        if lease is None:
            retry_ms = decision["retry_after_ms"]
            headers = [("X-RateLimit-Remaining", str(decision["remaining_units"]))]
            if retry_ms is not None:
                headers.append(("Retry-After", str(max(1, math.ceil(retry_ms / 1000)))))
            return self.reply(429, {"error": "token budget exhausted", "decision": decision}, headers)
        completion = run_model(prompt, max_tokens)
        used = count_tokens(prompt) + count_tokens(completion)
        refunded = 0
        # Lease 0: no rule or an unlimited one, nothing to settle.
        if lease["lease_id"] != 0:
            try:
                refunded = self.agent.settle(lease["lease_id"], used, request_id)["refunded_units"]
            except AgentError as e:
                # The answer is already paid for; the reservation is charged in full.
                print(f"settle failed, {reserved} tokens charged: {e}", file=sys.stderr)
        self.reply(
            200,
            {
                "completion": completion,
                "usage": {
                    "prompt_tokens": count_tokens(prompt),
                    "completion_tokens": count_tokens(completion),
                    "total_tokens": used,
                },
                "reserved_tokens": reserved,
                "refunded_tokens": refunded,
            },
        )


def serve(agent, listen):
    host, _, port = listen.rpartition(":")
    Gateway.agent = agent
    server = ThreadingHTTPServer((host, int(port)), Gateway)
    addr = server.server_address
    print(f"ready http={addr[0]}:{addr[1]}", flush=True)
    server.serve_forever()


def key_view(agent, api_key):
    with urllib.request.urlopen(
        f"{agent.base_url}/v1/keys?domain={agent.domain}&descriptor=api_key={api_key}",
        timeout=AGENT_TIMEOUT_SECS,
    ) as resp:
        return json.load(resp)


def self_test(agent):
    """Reserve then settle against the agent: a settle refunds the difference, and the same
    settle sent again (a retry after a lost answer) is answered alike and counted once."""
    api_key = "self-test-" + uuid.uuid4().hex[:8]
    request_id = uuid.uuid4().hex
    answer = agent.reserve(api_key, 30, request_id)
    assert answer["lease"] is not None, f"reservation refused: {answer}"
    assert answer["lease"]["units"] == 30, answer
    again = agent.reserve(api_key, 30, request_id)
    assert again["lease"]["lease_id"] == answer["lease"]["lease_id"], "a retried reservation is the same lease"
    lease_id = answer["lease"]["lease_id"]
    first = agent.settle(lease_id, 12, request_id)
    assert first["refunded_units"] == 18, first
    retry = agent.settle(lease_id, 12, request_id)
    assert retry == first, f"a retried settle answers as the first: {retry} != {first}"
    view = key_view(agent, api_key)
    assert view["granted_units"] == 30 and view["refunded_units"] == 18, view
    try:
        agent.settle(lease_id, 13, request_id)
        raise AssertionError("the same key with another amount was accepted")
    except AgentError as e:
        assert e.status == 409, e
    print("self-test ok: reserved 30, settled 12, refunded 18 once")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="http://127.0.0.1:8080", help="the agent's HTTP address")
    p.add_argument("--domain", default="llm_gateway", help="the limits' domain")
    p.add_argument("--listen", default="127.0.0.1:9000", help="HOST:PORT (port 0: any)")
    p.add_argument("--self-test", action="store_true", help="check reserve-then-settle and exit")
    args = p.parse_args()
    agent = Agent(args.agent, args.domain)
    if args.self_test:
        self_test(agent)
    else:
        serve(agent, args.listen)


if __name__ == "__main__":
    main()
