"""C-core's verdict on gRPC service configs, through Python's grpcio.

Reads a JSON list of service config strings on stdin and prints, on stdout, a JSON list
with one {"accepted": bool, "message": str} for each, in the same order.

grpcio (gRPC's C core underneath) parses the service config given in the
"grpc.service_config" channel option when the channel is created. When C-core refuses
it, the channel cannot be built and grpcio hands back a lame channel instead: every
call on it fails at once with INVALID_ARGUMENT and a message starting "Failed to create
channel to '<target>':", followed by C-core's reasons. A channel whose config was
accepted is a real one: its calls go on to try the target (a closed port here) and fail
with UNAVAILABLE or DEADLINE_EXCEEDED. So one call per config, all of them started at
once with a short deadline, gives every verdict in a fraction of a second.
"""

import json
import os
import sys

# C-core logs each refused config at ERROR level; the verdict carries the message.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc  # noqa: E402

# A closed port on loopback: a call on an accepted config fails without waiting long.
TARGET = "127.0.0.1:1"
PREFIX = "Failed to create channel to '%s':" % TARGET
# The call's deadline. A lame channel answers at once; this only bounds accepted ones.
DEADLINE = 0.5


def main():
    configs = json.load(sys.stdin)
    if not isinstance(configs, list) or not all(isinstance(c, str) for c in configs):
        sys.exit("config_verdict.py: stdin must be a JSON list of strings")
    channels = []
    calls = []
    for config in configs:
        channel = grpc.insecure_channel(
            TARGET,
            options=[
                ("grpc.service_config", config),
                ("grpc.enable_retries", 1),
                # No resolver-provided config may replace the one under test.
                ("grpc.service_config_disable_resolution", 1),
            ],
        )
        call = channel.unary_unary(
            "/config.Verdict/Check",
            request_serializer=None,
            response_deserializer=None,
        )
        channels.append(channel)
        calls.append(call.future(b"", timeout=DEADLINE))
    verdicts = []
    for future in calls:
        try:
            future.result()
            verdicts.append({"accepted": True, "message": "the call succeeded"})
            continue
        except grpc.RpcError as error:
            code, details = error.code(), error.details() or ""
        if code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(PREFIX):
            verdicts.append({"accepted": False, "message": details[len(PREFIX):].strip()})
        else:
            verdicts.append({"accepted": True, "message": "%s: %s" % (code.name, details)})
    for channel in channels:
        channel.close()
    json.dump(verdicts, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
