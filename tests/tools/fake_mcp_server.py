#!/usr/bin/env python3
"""A deterministic MCP server over stdio for tests/tools/mcp_client_test.cpp.

Options: --protocol V (the version it answers initialize with, default: the client's),
--record FILE (appends each notification it receives and each start, one JSON line each).
Tools, listed over two pages (nextCursor): add, echo | crash, sleep, garbage, wrong_id, huge,
image, structured, fail, rpc_error, change. `change` adds the tool `extra` and sends
notifications/tools/list_changed.
"""
import json
import os
import sys
import threading
import time

args = sys.argv[1:]
protocol = args[args.index("--protocol") + 1] if "--protocol" in args else None
record = args[args.index("--record") + 1] if "--record" in args else None
out_lock = threading.Lock()
extra = []


def note(obj):
    if record:
        with open(record, "a") as f:
            f.write(json.dumps(obj) + "\n")


def send(obj):
    with out_lock:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()


def raw(text):
    with out_lock:
        sys.stdout.write(text)
        sys.stdout.flush()


def tool(name, props=None, required=None):
    schema = {"type": "object", "properties": props or {}}
    if required:
        schema["required"] = required
    return {"name": name, "description": "test tool " + name, "inputSchema": schema}


PAGE1 = [tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"]),
         tool("echo", {"text": {"type": "string"}}, ["text"])]
PAGE2 = [tool(n) for n in ("crash", "garbage", "wrong_id", "huge", "image", "structured", "fail",
                           "rpc_error", "change", "progress")] + [tool("sleep", {"ms": {"type": "integer"}})]


def text(t, is_error=False):
    return {"content": [{"type": "text", "text": t}], "isError": is_error}


def call(rid, name, a, meta=None):
    if name == "add":
        return send({"jsonrpc": "2.0", "id": rid, "result": text(str(a["a"] + a["b"]))})
    if name == "echo":
        return send({"jsonrpc": "2.0", "id": rid, "result": text("echo: " + a["text"])})
    if name == "crash":
        sys.stderr.write("crashing on purpose\n")
        sys.stderr.flush()
        os._exit(3)
    if name == "progress":
        token = (meta or {}).get("progressToken")
        if token is not None:
            for k in (1, 2):
                send({"jsonrpc": "2.0", "method": "notifications/progress",
                      "params": {"progressToken": token, "progress": k, "total": 2, "message": "step %d" % k}})
        return send({"jsonrpc": "2.0", "id": rid, "result": text("token " + json.dumps(token))})
    if name == "sleep":
        def late():
            time.sleep(a.get("ms", 2000) / 1000)
            send({"jsonrpc": "2.0", "id": rid, "result": text("late")})
        return threading.Thread(target=late, daemon=True).start()
    if name == "garbage":
        return raw("this is not json\n")
    if name == "wrong_id":
        return send({"jsonrpc": "2.0", "id": rid + 1000, "result": text("who?")})
    if name == "huge":
        return raw('{"jsonrpc": "2.0", "id": %d, "result": "%s"}\n' % (rid, "x" * 100000))
    if name == "image":
        return send({"jsonrpc": "2.0", "id": rid, "result": {"content": [
            {"type": "text", "text": "a picture:"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///r.txt", "text": "resource text"}}]}})
    if name == "structured":
        return send({"jsonrpc": "2.0", "id": rid, "result": {
            "content": [{"type": "text", "text": "{\"n\": 1}"}], "structuredContent": {"n": 1, "ok": True}}})
    if name == "fail":
        return send({"jsonrpc": "2.0", "id": rid, "result": text("it went wrong", True)})
    if name == "rpc_error":
        return send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "bad params here"}})
    if name == "change":
        extra.append(tool("extra"))
        send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        return send({"jsonrpc": "2.0", "id": rid, "result": text("changed")})
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "unknown tool " + name}})


note({"started": os.getpid()})
for line in sys.stdin:
    msg = json.loads(line)
    method, rid = msg.get("method"), msg.get("id")
    if rid is None:
        note({"notification": method, "params": msg.get("params")})
        continue
    if method == "initialize":
        version = protocol or msg["params"]["protocolVersion"]
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": version, "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "fake-mcp", "version": "1.0"}}})
    elif method == "tools/list":
        cursor = (msg.get("params") or {}).get("cursor")
        if cursor is None:
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": PAGE1, "nextCursor": "page2"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {"tools": PAGE2 + extra}})
    elif method == "tools/call":
        call(rid, msg["params"]["name"], msg["params"].get("arguments") or {}, msg["params"].get("_meta"))
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no " + method}})
