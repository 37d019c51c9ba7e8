#!/usr/bin/env python3
"""A gRPC server written with Python's grpcio, for tests/grpc/grpcio.rs.

It serves raw bytes (no protobuf: every handler is registered with no request
deserializer and no response serializer) on 127.0.0.1, on a port it picks, and
prints "PORT <n>" on stdout once it is serving.

Methods of the service test.Raw:

  Unary    unary-unary: echoes the request message.
  Collect  stream-unary (client streaming): reads every request message, then
           answers with them joined.
  Reply    unary-stream (server streaming): echoes the request message as one
           reply message (the only method that can fail after a message).

Each call of a test.Raw method takes the next step of the plan given on the
command line (--plan, comma-separated; "ok" once the plan is used up):

  ok                  answer as the method says
  fail:CODE           abort with CODE before any output
  pushback:CODE:MS    set trailing metadata grpc-retry-pushback-ms: MS, then
                      abort with CODE before any output (MS is sent as given)
  headers:CODE        send custom initial metadata (x-committed: yes), then
                      abort with CODE: headers first, no message
  after:CODE          Reply only: send the reply message, then abort with CODE
  sleep:MS:STEP       wait MS milliseconds (less if the call ends first), then
                      answer as STEP says
  meta                answer as the call's own "x-step" metadata says (one of
                      the steps above); "ok" without it. The record names the
                      step taken. So a client decides each call's answer
                      (tests/grpcio/client.py --step), whatever the retries
                      before it took from the plan.

CODE is a grpc.StatusCode name, such as UNAVAILABLE.

Every call of a test.Raw method is recorded before it is answered: its method,
its step, when it arrived (milliseconds since the server started), its metadata
as grpcio hands it to the handler, the time grpcio says is left before its
deadline, its request messages (hex), and whether the client cancelled it while a
sleep step held it. test.Control/Seen answers with the
records so far as JSON, and takes no step.

--option NAME=VALUE (repeatable) passes a channel option to grpc.server, an
integer when VALUE is one: --option grpc.max_connection_age_ms=300 makes the
server send GOAWAY on every connection 300 ms old.

The server stops when its stdin closes (the test holds the other end) or after
--lifetime seconds, whichever comes first.
"""

import argparse
import json
import os
import sys
import threading
import time
from concurrent import futures

import grpc


def parse_step(text):
    """A step of the plan as a tuple: ("ok",), ("fail", code), ..."""
    kind, _, rest = text.partition(":")
    if kind == "ok" and not rest:
        return ("ok",)
    if kind in ("fail", "headers", "after"):
        return (kind, grpc.StatusCode[rest])
    if kind == "pushback":
        code, _, value = rest.partition(":")
        return ("pushback", grpc.StatusCode[code], value)
    if kind == "sleep":
        millis, _, inner = rest.partition(":")
        return ("sleep", int(millis), parse_step(inner))
    if kind == "meta" and not rest:
        return ("meta",)
    raise ValueError(f"unknown step {text!r}")


def step_name(step):
    parts = []
    for part in step:
        if isinstance(part, tuple):
            parts.append(step_name(part))
        elif isinstance(part, grpc.StatusCode):
            parts.append(part.name)
        else:
            parts.append(str(part))
    return ":".join(parts)


class Script:
    """The plan and the records, shared by the handler threads."""

    def __init__(self, plan):
        self.lock = threading.Lock()
        self.plan = list(plan)
        self.records = []
        self.start = time.monotonic()

    def take(self, method, context, messages):
        arrived = (time.monotonic() - self.start) * 1000.0
        metadata = []
        for key, value in context.invocation_metadata() or ():
            if isinstance(value, bytes):
                value = value.hex()
            metadata.append([key, value])
        with self.lock:
            step = self.plan.pop(0) if self.plan else ("ok",)
            if step == ("meta",):
                said = dict(context.invocation_metadata() or ()).get("x-step")
                step = parse_step(said) if said else ("ok",)
                if step == ("meta",):
                    raise ValueError("x-step: meta names itself")
            record = {
                "method": method,
                "step": step_name(step),
                "arrived_ms": arrived,
                "metadata": metadata,
                "time_remaining": context.time_remaining(),
                "messages": [m.hex() for m in messages],
                "cancelled": False,
            }
            self.records.append(record)
        return step, record

    def cancelled(self, record):
        with self.lock:
            record["cancelled"] = True

    def seen(self):
        with self.lock:
            return json.dumps(self.records).encode()


def settle(script, taken, context):
    """Sleeps through "sleep" steps (bounded, and cut short when the call ends)
    and returns the step to answer with. A call that ended during the sleep (the
    client cancelled it: a hedge that lost, a deadline) is marked cancelled."""
    step, record = taken
    while step[0] == "sleep":
        deadline = time.monotonic() + step[1] / 1000.0
        while context.is_active():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.02))
        if not context.is_active():
            script.cancelled(record)
        step = step[2]
    return step


def fail(step, context):
    """Ends the call as a failing step says. context.abort raises."""
    kind = step[0]
    if kind == "pushback":
        context.set_trailing_metadata((("grpc-retry-pushback-ms", step[2]),))
    elif kind == "headers":
        context.send_initial_metadata((("x-committed", "yes"),))
    context.abort(step[1], f"scripted {step_name(step)}")


def serve(script, options=()):
    def unary(request, context):
        step = settle(script, script.take("Unary", context, [request]), context)
        if step[0] != "ok":
            fail(step, context)
        return request

    def collect(requests, context):
        messages = list(requests)
        step = settle(script, script.take("Collect", context, messages), context)
        if step[0] != "ok":
            fail(step, context)
        return b"".join(messages)

    def reply(request, context):
        step = settle(script, script.take("Reply", context, [request]), context)
        if step[0] == "after":
            yield request
            context.abort(step[1], f"scripted {step_name(step)}")
        if step[0] != "ok":
            fail(step, context)
        yield request

    def seen(_request, _context):
        return script.seen()

    raw = grpc.method_handlers_generic_handler(
        "test.Raw",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(unary),
            "Collect": grpc.stream_unary_rpc_method_handler(collect),
            "Reply": grpc.unary_stream_rpc_method_handler(reply),
        },
    )
    control = grpc.method_handlers_generic_handler(
        "test.Control", {"Seen": grpc.unary_unary_rpc_method_handler(seen)}
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16),
        handlers=(raw, control),
        options=list(options),
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="", help="comma-separated steps")
    parser.add_argument("--lifetime", type=float, default=120.0)
    parser.add_argument(
        "--option", action="append", default=[], help="NAME=VALUE for grpc.server"
    )
    args = parser.parse_args()
    plan = [parse_step(s) for s in args.plan.split(",") if s]
    options = []
    for option in args.option:
        name, _, value = option.partition("=")
        options.append((name, int(value) if value.lstrip("-").isdigit() else value))
    server, port = serve(Script(plan), options)
    print(f"PORT {port}", flush=True)

    # Whatever happens to the test, the server does not outlive its lifetime.
    def expire():
        sys.stderr.write("grpcio test server: lifetime over, exiting\n")
        os._exit(2)

    timer = threading.Timer(args.lifetime, expire)
    timer.daemon = True
    timer.start()
    sys.stdin.read()
    server.stop(grace=None)


if __name__ == "__main__":
    main()
