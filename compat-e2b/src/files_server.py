# The file-transfer server of the e2b facade: E2B's envd `/files` endpoint (GET downloads a
# file, POST uploads multipart `file` parts or a raw body) on the sandbox's loopback. The
# runtime's private preview in front of it checks the URL's `signature` token.
import email.parser
import email.policy
import json
import os
import sys
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOME = os.environ.get("HOME", "/")


def resolve(path):
    if not path:
        return HOME
    if path == "~" or path.startswith("~/"):
        path = HOME + path[1:]
    return path if path.startswith("/") else os.path.join(HOME, path)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        if isinstance(body, str):
            body = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def target(self):
        url = urllib.parse.urlparse(self.path)
        if url.path != "/files":
            self.reply(404, json.dumps({"code": 404, "message": "not found"}))
            return None, None
        query = urllib.parse.parse_qs(url.query)
        return True, query.get("path", [None])[0]

    def do_GET(self):
        ok, path = self.target()
        if not ok:
            return
        full = resolve(path)
        if os.path.isdir(full):
            return self.reply(400, json.dumps({"code": 400, "message": "path is a directory"}))
        try:
            with open(full, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return self.reply(404, json.dumps({"code": 404, "message": "file not found"}))
        except PermissionError:
            return self.reply(401, json.dumps({"code": 401, "message": "permission denied"}))
        self.reply(200, data, "application/octet-stream")

    def do_POST(self):
        ok, path = self.target()
        if not ok:
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        ctype = self.headers.get("Content-Type", "")
        files = []
        if ctype.startswith("multipart/form-data"):
            head = ("Content-Type: " + ctype + "\r\nMIME-Version: 1.0\r\n\r\n").encode()
            msg = email.parser.BytesParser(policy=email.policy.default).parsebytes(head + body)
            for part in msg.iter_parts():
                if part.get_param("name", header="content-disposition") != "file":
                    continue
                dest = path or part.get_filename()
                files.append((dest, part.get_payload(decode=True) or b""))
        else:
            files.append((path, body))
        written = []
        for dest, data in files:
            if not dest:
                return self.reply(400, json.dumps({"code": 400, "message": "no path"}))
            full = resolve(dest)
            os.makedirs(os.path.dirname(full) or "/", exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
            written.append({"path": full, "name": os.path.basename(full), "type": "file"})
        self.reply(200, json.dumps(written))


server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
print("ready", flush=True)
server.serve_forever()
