#!/usr/bin/env python3
"""A small HTTPS server on loopback for the hub tests.

Generates a self-signed certificate for 127.0.0.1 with openssl, serves the
files under --root, and writes "<port>" to --port-file once listening
(--cert-dir receives cert.pem, the CA bundle clients must trust). Besides
plain files it answers:
  /__stats                 one "<count> <path>" line per path requested so far
  /cut/<path>              announces the full length of <path>, sends half, hangs up
  /flaky/<path>            HTTP 503 on the first request for <path>, then the file
  /redirect-http/<path>    302 to http://127.0.0.1:<port>/<path>
  /redirect-https/<path>   302 to https://127.0.0.1:<port>/<path>
  /slow/<path>             the file in 20 pieces 50 ms apart (a "long" download)
It exits when its parent closes stdin.
"""
import argparse
import collections
import http.server
import os
import ssl
import subprocess
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--cert-dir", required=True)
    args = p.parse_args()

    cert = os.path.join(args.cert_dir, "cert.pem")
    key = os.path.join(args.cert_dir, "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    counts = collections.Counter()
    flaky_seen = set()
    lock = threading.Lock()
    root = os.path.realpath(args.root)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send_bytes(self, code, body, headers=()):
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

        def file_bytes(self, rel):
            path = os.path.realpath(os.path.join(root, rel.lstrip("/")))
            if not path.startswith(root + os.sep) or not os.path.isfile(path):
                return None
            with open(path, "rb") as f:
                return f.read()

        def do_GET(self):
            path = self.path
            with lock:
                counts[path] += 1
            port = self.server.server_address[1]
            if path == "/__stats":
                with lock:
                    body = "".join(f"{n} {p}\n" for p, n in counts.items()).encode()
                return self.send_bytes(200, body)
            for prefix, scheme in (("/redirect-http/", "http"), ("/redirect-https/", "https")):
                if path.startswith(prefix):
                    loc = f"{scheme}://127.0.0.1:{port}/{path[len(prefix):]}"
                    return self.send_bytes(302, b"", [("Location", loc)])
            if path.startswith("/flaky/"):
                rel = path[len("/flaky/"):]
                with lock:
                    first = rel not in flaky_seen
                    flaky_seen.add(rel)
                if first:
                    return self.send_bytes(503, b"try again")
                path = "/" + rel
            if path.startswith("/slow/"):
                body = self.file_bytes(path[len("/slow"):])
                if body is None:
                    return self.send_bytes(404, b"not found")
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                step = (len(body) + 19) // 20
                for i in range(0, len(body), step):
                    self.wfile.write(body[i:i + step])
                    self.wfile.flush()
                    time.sleep(0.05)
                return
            cut = path.startswith("/cut/")
            if cut:
                path = path[len("/cut"):]
            body = self.file_bytes(path)
            if body is None:
                return self.send_bytes(404, b"not found")
            if not cut:
                return self.send_bytes(200, body)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(2)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()  # returns when the parent closes the pipe or dies
    server.shutdown()


if __name__ == "__main__":
    main()
