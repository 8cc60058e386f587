#!/usr/bin/env python3
"""A small forward HTTP proxy for deploy/fresh/check.sh.

The fresh root runs in a network namespace without NAT: this proxy, listening
on the host's end of the veth pair, is its only way out. It serves
  CONNECT host:443      (cargo and pip to their registries, over TLS)
  GET/HEAD http://...   (apt to the Debian mirror, plain HTTP)
and nothing else. One line per request goes to the log file.

    proxy.py LISTEN_ADDR PORT LOGFILE
"""

import select
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

CONNECT_TIMEOUT = 30  # seconds to reach the upstream server
IDLE_TIMEOUT = 300  # seconds without a byte either way before giving up
ALLOWED_CONNECT_PORTS = {443}

log_lock = threading.Lock()
log_file = None


def log(line):
    with log_lock:
        log_file.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        log_file.flush()


def pipe(a, b):
    """Copies bytes both ways until either side closes or stays idle too long."""
    socks = [a, b]
    while True:
        readable, _, _ = select.select(socks, [], [], IDLE_TIMEOUT)
        if not readable:
            return
        for s in readable:
            try:
                data = s.recv(65536)
            except OSError:
                return
            if not data:
                return
            other = b if s is a else a
            try:
                other.sendall(data)
            except OSError:
                return


class Handler(BaseHTTPRequestHandler):
    # HTTP/1.0: one request per client connection, then close. apt and cargo
    # open a new connection for the next request.
    protocol_version = "HTTP/1.0"

    def log_message(self, fmt, *args):  # silence the default stderr log
        pass

    def do_CONNECT(self):
        host, _, port = self.path.rpartition(":")
        if not host or not port.isdigit() or int(port) not in ALLOWED_CONNECT_PORTS:
            log(f"DENY CONNECT {self.path}")
            self.send_error(403, "only CONNECT to port 443")
            return
        try:
            upstream = socket.create_connection((host, int(port)), CONNECT_TIMEOUT)
        except OSError as e:
            log(f"FAIL CONNECT {self.path}: {e}")
            self.send_error(502, f"cannot reach {self.path}: {e}")
            return
        log(f"CONNECT {self.path}")
        self.send_response(200, "Connection established")
        self.end_headers()
        self.wfile.flush()
        upstream.settimeout(None)
        try:
            pipe(self.connection, upstream)
        finally:
            upstream.close()
        self.close_connection = True

    def forward(self):
        url = urlsplit(self.path)
        if url.scheme != "http" or not url.hostname:
            log(f"DENY {self.command} {self.path}")
            self.send_error(400, "absolute http:// URL expected")
            return
        port = url.port or 80
        path = url.path or "/"
        if url.query:
            path += "?" + url.query
        try:
            upstream = socket.create_connection((url.hostname, port), CONNECT_TIMEOUT)
        except OSError as e:
            log(f"FAIL {self.command} {self.path}: {e}")
            self.send_error(502, f"cannot reach {url.hostname}: {e}")
            return
        log(f"{self.command} {self.path}")
        head = [f"{self.command} {path} HTTP/1.1"]
        for name, value in self.headers.items():
            if name.lower() in ("connection", "proxy-connection", "keep-alive"):
                continue
            head.append(f"{name}: {value}")
        head.append("Connection: close")
        try:
            upstream.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                upstream.sendall(self.rfile.read(length))
            upstream.settimeout(None)
            # The server closes after its response (Connection: close): copy
            # everything it sends, then close the client's connection too.
            while True:
                readable, _, _ = select.select([upstream], [], [], IDLE_TIMEOUT)
                if not readable:
                    break
                data = upstream.recv(65536)
                if not data:
                    break
                self.wfile.write(data)
        except OSError as e:
            log(f"FAIL {self.command} {self.path}: {e}")
        finally:
            upstream.close()
        self.close_connection = True

    do_GET = forward
    do_HEAD = forward


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    global log_file
    if len(sys.argv) != 4:
        sys.exit("usage: proxy.py LISTEN_ADDR PORT LOGFILE")
    addr, port, logfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    log_file = open(logfile, "a", buffering=1)
    with Server((addr, port), Handler) as server:
        log(f"listening on {addr}:{port}")
        server.serve_forever()


if __name__ == "__main__":
    main()
