# -*- coding: utf-8 -*-
"""A git smart-HTTP server on 127.0.0.1 for tests: git's own ``git http-backend`` behind HTTP basic
authentication, serving the bare repositories of one directory.

While it answers a request (the client's git is then running, waiting for it), it reads every
process's command line on the machine and keeps those that hold the password: a credential on a
command line is visible to every user of the machine (``ps``)."""
from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Tuple
from urllib.parse import quote


def command_lines_holding(secret: str) -> List[str]:
    """Every process's command line (``/proc/<pid>/cmdline``) that holds ``secret``, as it is or
    percent-encoded (as a URL carries it)."""
    forms = {secret, quote(secret, safe=""), quote(secret)}
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as fh:
                line = fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if any(form in line for form in forms):
            found.append(line)
    return found


class GitHTTPServer:
    """``with GitHTTPServer(root, "bot", "tok") as srv:`` serves ``root/<name>.git`` at
    ``srv.url("<name>.git")``; ``srv.requests`` lists (method, path, authorised) and
    ``srv.exposed`` the command lines that held the password while a request was answered."""

    def __init__(self, project_root: str, user: str, password: str) -> None:
        self.project_root = project_root
        self.expected = "Basic " + base64.b64encode(("%s:%s" % (user, password)).encode()).decode()
        self.password = password
        self.requests: List[Tuple[str, str, bool]] = []
        self.exposed: List[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, name: str, userinfo: str = "") -> str:
        return "http://%s127.0.0.1:%d/%s" % (userinfo + "@" if userinfo else "", self._server.server_address[1], name)

    def __enter__(self) -> "GitHTTPServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _serve(self) -> None:
                path, _sep, query = self.path.partition("?")
                ok = self.headers.get("Authorization") == srv.expected
                srv.requests.append((self.command, path, ok))
                srv.exposed.extend(command_lines_holding(srv.password))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                if not ok:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="ws"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                env = dict(os.environ, GIT_PROJECT_ROOT=srv.project_root, GIT_HTTP_EXPORT_ALL="1",
                           PATH_INFO=path, QUERY_STRING=query, REQUEST_METHOD=self.command, REMOTE_USER="bot",
                           REMOTE_ADDR="127.0.0.1", CONTENT_TYPE=self.headers.get("Content-Type") or "",
                           CONTENT_LENGTH=str(len(body)))
                for header, var in (("Content-Encoding", "HTTP_CONTENT_ENCODING"), ("Git-Protocol", "HTTP_GIT_PROTOCOL")):
                    if self.headers.get(header):
                        env[var] = self.headers[header]
                out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60,
                                     check=False).stdout
                head, _sep, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode("latin-1").split("\r\n"):
                    name, _sep, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _serve
            do_POST = _serve

        return Handler
