#!/usr/bin/env python3
"""A reference agent for the agentfleet bridge, standard library only.

Run it, then point the fleet at it:

    python3 agent.py --listen 127.0.0.1:8090
    agentfleet up --agent bridge   # with agent.bridge.url: http://127.0.0.1:8090/turn

The protocol (docs/agents.md): the worker POSTs each turn as JSON and reads
newline-delimited JSON events back while the agent works. Closing the
request is the cancellation: this agent notices when a write fails.

What it answers mirrors the fleet's echo agent, so the same tests run
against both: "echo: " and the turn's user lines, streamed line by line as
delta events. Lines starting with "!" are directives:

    !sleep DUR   wait DUR (e.g. 2s, 500ms), stopping when the turn is cancelled
    !tools N     N tool calls of a "clock" tool, each with its result
    !say TEXT    an interim message, delivered at once as its own reply
    !notes       list the turn's system notes, one per line, "note: " first
    !fail        end the turn with an error event

Replace answer() with a call to your model and tools.
"""

import argparse
import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Cancelled(Exception):
    """The worker closed the request: the turn is cancelled."""


class Turn:
    """Writes the events of one turn to the response."""

    def __init__(self, wfile):
        self.wfile = wfile

    def send(self, **event):
        self.write((json.dumps(event) + "\n").encode())

    def keepalive(self):
        # Blank lines are allowed between events: they show whether the
        # worker is still there.
        self.write(b"\n")

    def write(self, data):
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise Cancelled() from e


def parse_duration(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"!sleep {text!r}: want a duration such as 2s or 500ms")
    n, unit = float(m.group(1)), m.group(2)
    return n / 1000 if unit == "ms" else n * 60 if unit == "m" else n


def answer(req, turn):
    """Run one turn: stream the reply, then return the final event."""
    lines = []

    def say(line):
        piece = ("\n" if lines else "echo: ") + line
        lines.append(line)
        turn.send(type="delta", text=piece)

    show_notes = False
    for message in req["messages"]:
        for line in message["text"].split("\n"):
            stripped = line.strip()
            if not stripped.startswith("!"):
                say(line)
                continue
            verb, _, arg = stripped[1:].partition(" ")
            arg = arg.strip()
            if verb == "sleep":
                deadline = time.monotonic() + parse_duration(arg)
                while time.monotonic() < deadline:
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                    turn.keepalive()
            elif verb == "tools":
                for i in range(1, int(arg) + 1):
                    call_id = f"{req['turn_id']}-call-{i}"
                    turn.send(type="tool_call", id=call_id, name="clock", arguments=json.dumps({"i": i}))
                    turn.send(type="tool_result", id=call_id, name="clock", content=time.strftime("%H:%M:%S"))
            elif verb == "say":
                turn.send(type="message", text=arg)
            elif verb == "notes":
                show_notes = True
            elif verb == "fail":
                return {"type": "error", "message": "the agent was asked to fail (!fail)"}
            else:
                say(line)
    text = "echo: " + "\n".join(lines)
    if show_notes:
        text += "".join("\nnote: " + n for n in req.get("notes") or [])
    turn.send(type="usage", input_tokens=len(req["messages"]), output_tokens=1)
    return {"type": "final", "text": text, "finish_reason": "stop"}


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: the body ends when the connection closes, no framing needed.
    protocol_version = "HTTP/1.0"

    def do_POST(self):
        try:
            length = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(length))
            req["messages"], req["turn_id"]
        except (ValueError, KeyError, TypeError) as e:
            self.send_error(400, f"bad turn request: {e}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.end_headers()
        turn = Turn(self.wfile)
        try:
            try:
                final = answer(req, turn)
            except Cancelled:
                raise
            except Exception as e:  # an error of the agent ends the turn as failed
                final = {"type": "error", "message": str(e)}
            turn.send(**final)
        except Cancelled:
            self.log_message("turn %s cancelled by the worker", req.get("turn_id"))

    def log_message(self, fmt, *args):
        sys.stderr.write("bridge-agent: " + (fmt % args) + "\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT to listen on (port 0: any free port)")
    args = p.parse_args()
    host, _, port = args.listen.rpartition(":")
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    # The address actually bound, for whoever started us with port 0.
    print(f"listening on http://{server.server_address[0]}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
