#!/usr/bin/env python3
"""gRPC's reference client (C-core, through Python's grpcio), for tests/grpc/differential.rs.

It makes one or more calls on one channel to the target and prints, on stdout, one JSON
object: {"calls": [{"code": NAME, "details": TEXT, "elapsed_ms": MS, "reply": HEX or
null}, ...]}, one entry per call, in order. CODE is a grpc.StatusCode name ("OK",
"UNAVAILABLE", ...); "elapsed_ms" is the time the call took as the caller saw it.

The channel is

    grpc.insecure_channel(target, options=[("grpc.service_config", CONFIG),
                                           ("grpc.enable_retries", 1)])

so every retry rule that applies is C-core's own, read from CONFIG. Messages are raw
bytes (no serializers), given in hex. The method's kind comes from its name, as
tests/grpcio/server.py serves them: Unary is unary-unary, Collect stream-unary (client
streaming: every --message is one message of the stream), Reply unary-stream.

Each call sends the metadata "x-call: N" (N counts from 0), and, with --step, "x-step:
STEP", which tests/grpcio/server.py's "meta" step answers as. One --step per call: the
number of calls is the number of --step options, else --calls.

The script exits after --lifetime seconds whatever happens (a call still running
included), with status 3.
"""

import argparse
import json
import os
import sys
import threading
import time

# C-core's log lines would mix with the answer on stdout's neighbour; keep them quiet.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port")
    parser.add_argument("--config", required=True, help="the service config, JSON")
    parser.add_argument("--method", required=True, help="/test.Raw/Unary, ...")
    parser.add_argument("--message", action="append", default=[], help="hex bytes")
    parser.add_argument("--timeout", type=float, default=None, help="seconds")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--step", action="append", default=[], help="x-step per call")
    parser.add_argument("--wait-for-ready", action="store_true")
    parser.add_argument("--pause-ms", type=float, default=0.0, help="between calls")
    parser.add_argument("--lifetime", type=float, default=30.0)
    args = parser.parse_args()

    def expire():
        sys.stderr.write("grpcio test client: lifetime over, exiting\n")
        os._exit(3)

    timer = threading.Timer(args.lifetime, expire)
    timer.daemon = True
    timer.start()

    messages = [bytes.fromhex(m) for m in args.message] or [b""]
    channel = grpc.insecure_channel(
        args.target,
        options=[
            ("grpc.service_config", args.config),
            ("grpc.enable_retries", 1),
        ],
    )
    kind = args.method.rsplit("/", 1)[-1]
    if kind == "Collect":
        stub = channel.stream_unary(args.method)
    elif kind == "Reply":
        stub = channel.unary_stream(args.method)
    else:
        stub = channel.unary_unary(args.method)

    steps = args.step or [None] * args.calls
    results = []
    for i, step in enumerate(steps):
        if i and args.pause_ms:
            time.sleep(args.pause_ms / 1000.0)
        metadata = [("x-call", str(i))]
        if step is not None:
            metadata.append(("x-step", step))
        options = dict(
            timeout=args.timeout,
            metadata=metadata,
            wait_for_ready=True if args.wait_for_ready else None,
        )
        start = time.monotonic()
        reply = None
        try:
            if kind == "Collect":
                reply = stub(iter(messages), **options)
            elif kind == "Reply":
                reply = b"".join(stub(messages[0], **options))
            else:
                reply = stub(messages[0], **options)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
        elapsed = (time.monotonic() - start) * 1000.0
        results.append(
            {
                "code": code.name,
                "details": details,
                "elapsed_ms": elapsed,
                "reply": None if reply is None else reply.hex(),
            }
        )
    channel.close()
    json.dump({"calls": results}, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
