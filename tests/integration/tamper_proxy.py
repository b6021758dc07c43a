#!/usr/bin/env python3
"""A loopback HTTP proxy for test_downlink_init.sh: forwards every request to
the coordinator given as argv[1] and answers GET /v1/models/0/init with the
coordinator's recipe whose init_seed is raised by one (a tampered recipe).
Writes the port it listens on to argv[2]."""
import http.client
import http.server
import json
import sys
import urllib.parse

UP = urllib.parse.urlparse(sys.argv[1])


class Proxy(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def forward(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        conn = http.client.HTTPConnection(UP.hostname, UP.port, timeout=120)
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(self.command, self.path, body=body, headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        if self.path == "/v1/models/0/init" and resp.status == 200:
            doc = json.loads(data)
            doc["init_seed"] += 1
            data = json.dumps(doc, separators=(",", ":")).encode()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding", "date",
                                 "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_POST = do_HEAD = forward

    def log_message(self, *args):
        pass


srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
with open(sys.argv[2], "w") as f:
    f.write(str(srv.server_address[1]))
srv.serve_forever()
