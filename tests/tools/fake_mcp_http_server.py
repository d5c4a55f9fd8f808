#!/usr/bin/env python3
"""A deterministic MCP server over Streamable HTTP for tests/tools/mcp_http_client_test.cpp.

Listens on 127.0.0.1 at a free port and prints the port on its first stdout line. POST /mcp takes
one JSON-RPC message: initialize opens a session (Mcp-Session-Id: sess-N); any other message
without a known session id is 404 (400 without one); notifications and replies get 202.
tools/list answers application/json; tools/call answers text/event-stream: a notifications/progress
event, a ping request (its reply comes back as a POST), then the result. Tools: echo, add, sleep
(answers after ms milliseconds), forget (drops every session), http500, garbage (a JSON body that
is not JSON), exit (the process ends mid-call), change (adds the tool `extra`; its stream carries
notifications/tools/list_changed instead of progress and ping), change_later (adds `extra2` and
sends list_changed on the GET streams, answering how many got it). GET /mcp opens a session's event
stream. DELETE /mcp ends the session.
--record FILE appends one JSON line per notification, reply, GET, DELETE and tools/call received,
with the session and MCP-Protocol-Version headers it carried.
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
record = args[args.index("--record") + 1] if "--record" in args else None
lock = threading.Lock()
sessions = set()
counter = [0]
listeners = []  # the GET streams' wfiles


def note(obj):
    if record:
        with lock, open(record, "a") as f:
            f.write(json.dumps(obj) + "\n")


def tool(name, props=None, required=None):
    schema = {"type": "object", "properties": props or {}}
    if required:
        schema["required"] = required
    return {"name": name, "description": "test tool " + name, "inputSchema": schema}


TOOLS = [tool("echo", {"text": {"type": "string"}}, ["text"]),
         tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
         tool("sleep", {"ms": {"type": "integer"}})] + [tool(n) for n in ("forget", "http500", "garbage", "exit", "change", "change_later")]


def text(t):
    return {"content": [{"type": "text", "text": t}], "isError": False}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, body=b"", ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def rpc(self, rid, result, headers=()):
        self.reply(200, json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode(), headers=headers)

    def do_GET(self):
        sid = self.headers.get("Mcp-Session-Id")
        with lock:
            known = sid in sessions
        if not known:
            return self.reply(404)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b": open\n\n")
        self.wfile.flush()
        with lock:
            listeners.append(self.wfile)
        note({"get": sid})
        threading.Event().wait()  # held open; the tools write to it

    def do_DELETE(self):
        sid = self.headers.get("Mcp-Session-Id")
        note({"deleted": sid})
        with lock:
            known = sid in sessions
            sessions.discard(sid)
        self.reply(200 if known else 404)

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        sid = self.headers.get("Mcp-Session-Id")
        version = self.headers.get("MCP-Protocol-Version")
        method, rid = msg.get("method"), msg.get("id")
        if method == "initialize":
            with lock:
                counter[0] += 1
                sid = "sess-%d" % counter[0]
                sessions.add(sid)
            note({"initialize": sid})
            return self.rpc(rid, {"protocolVersion": msg["params"]["protocolVersion"],
                                  "capabilities": {"tools": {}}, "serverInfo": {"name": "fake-http", "version": "1"}},
                            headers=[("Mcp-Session-Id", sid)])
        if sid is None:
            return self.reply(400, b'{"error": "no session"}')
        with lock:
            known = sid in sessions
        if not known:
            return self.reply(404, b'{"error": "unknown session"}')
        if method is None or rid is None:
            note({"notification": method, "params": msg.get("params"), "session": sid, "version": version,
                  "reply": method is None, "id": rid, "result": msg.get("result")})
            return self.reply(202)
        if method == "tools/list":
            return self.rpc(rid, {"tools": TOOLS})
        if method != "tools/call":
            return self.reply(200, json.dumps({"jsonrpc": "2.0", "id": rid, "error": {
                "code": -32601, "message": "no " + method}}).encode())
        name, a = msg["params"]["name"], msg["params"].get("arguments") or {}
        note({"call": name, "session": sid, "version": version, "meta": msg["params"].get("_meta")})
        if name == "http500":
            return self.reply(500, b"server exploded", "text/plain")
        if name == "garbage":
            return self.reply(200, b"this is not json")
        if name == "exit":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b": going away\n\n")
            self.wfile.flush()
            os._exit(3)
        if name == "forget":
            with lock:
                sessions.clear()
            return self.rpc(rid, text("forgotten"))
        if name == "sleep":
            time.sleep(a.get("ms", 2000) / 1000)
            return self.rpc(rid, text("late"))
        if name == "change_later":
            with lock:
                if not any(t["name"] == "extra2" for t in TOOLS):
                    TOOLS.append(tool("extra2"))
                n = 0
                for w in listeners:
                    try:
                        w.write(b'data: {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}\n\n')
                        w.flush()
                        n += 1
                    except OSError:
                        pass
            return self.rpc(rid, text("notified %d" % n))
        if name == "change":
            with lock:
                if not any(t["name"] == "extra" for t in TOOLS):
                    TOOLS.append(tool("extra"))
            return self.stream(rid, text("changed"), {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result = text("echo: " + a["text"]) if name == "echo" else text(str(a["a"] + a["b"]))
        self.stream(rid, result, {"jsonrpc": "2.0", "method": "notifications/progress",
                                  "params": {"progressToken": rid, "progress": 1, "total": 2}},
                    {"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"})

    def stream(self, rid, result, *before):
        """Answers on an event stream: the messages `before`, then the result."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        events = list(before) + [{"jsonrpc": "2.0", "id": rid, "result": result}]
        for e in events:
            # split over two writes and two data lines, as a stream may
            data = json.dumps(e)
            half = data.index(", ") + 1
            self.wfile.write(("event: message\ndata: " + data[:half]).encode())
            self.wfile.flush()
            self.wfile.write(("\ndata: " + data[half:] + "\n\n").encode())
            self.wfile.flush()
        self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
