# The code-context driver of the e2b facade: a stateful Python REPL speaking line-delimited
# JSON. Each request line {"id", "code", "envs"} is executed in one namespace that persists
# between requests; the value of a trailing expression is reported as the main result.
# Replies go to the original stdout; user code's raw fd 1 writes are redirected to stderr.
import ast
import json
import os
import signal
import sys
import time
import traceback

_proto = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)


def _send(msg):
    _proto.write(json.dumps(msg) + "\n")
    _proto.flush()


class _Out:
    encoding = "utf-8"

    def __init__(self, kind, rid):
        self.kind = kind
        self.rid = rid
        self.buf = ""

    def write(self, s):
        if not isinstance(s, str):
            s = str(s)
        self.buf += s
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            self._emit(line + "\n")
        return len(s)

    def _emit(self, text):
        _send({"id": self.rid, "type": self.kind, "text": text, "timestamp": time.time_ns()})

    def flush(self):
        pass

    def finish(self):
        if self.buf:
            self._emit(self.buf)
            self.buf = ""

    def isatty(self):
        return False


_busy = False


def _user_traceback(exc):
    # Drop this driver's own frames: the traceback starts in the cell.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<cell>":
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _on_sigint(signum, frame):
    if _busy:
        raise KeyboardInterrupt()


signal.signal(signal.SIGINT, _on_sigint)

_ns = {"__name__": "__main__", "__builtins__": __builtins__}
_count = 0

while True:
    _line = sys.stdin.readline()
    if not _line:
        break
    try:
        _req = json.loads(_line)
    except ValueError:
        continue
    _rid = _req.get("id")
    _count += 1
    _envs = _req.get("envs") or {}
    _saved = {k: os.environ.get(k) for k in _envs}
    os.environ.update(_envs)
    _o, _e = _Out("stdout", _rid), _Out("stderr", _rid)
    sys.stdout, sys.stderr = _o, _e
    _busy = True
    try:
        _tree = ast.parse(_req.get("code", ""), "<cell>", "exec")
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        exec(compile(_tree, "<cell>", "exec"), _ns)
        if _last is not None:
            _value = eval(compile(_last, "<cell>", "eval"), _ns)
            if _value is not None:
                _o.finish()
                _send({"id": _rid, "type": "result", "text": repr(_value), "is_main_result": True})
    except BaseException as _exc:  # noqa: B902 - user code errors of every kind are reported
        _busy = False
        _o.finish()
        _e.finish()
        _send({
            "id": _rid,
            "type": "error",
            "name": type(_exc).__name__,
            "value": str(_exc),
            "traceback": _user_traceback(_exc),
        })
    finally:
        _busy = False
        _o.finish()
        _e.finish()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        for _k, _v in _saved.items():
            if _v is None:
                os.environ.pop(_k, None)
            else:
                os.environ[_k] = _v
        _send({"id": _rid, "type": "end", "execution_count": _count})
