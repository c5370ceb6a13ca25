# The code-context driver: one stateful Python interpreter per code context.
#
# Channels (set up before any cell runs):
#   requests   one JSON object per line on a private copy of fd 0, read by a thread:
#              {"op": "run", "token": T, "code": str, "envs": {str: str}}
#              {"op": "cancel", "token": T}   (drop a queued run that has not started)
#   frames     on a private copy of fd 1, each one write of "\n<T> <json>\n", where T is the
#              random token the host chose for that run. The host reads only lines that start
#              with the current run's token, so nothing a cell prints can pass for a frame.
#   output     fds 1 and 2 become pipes drained by a thread, and sys.stdout / sys.stderr are
#              line-buffered writers: everything a cell, its threads or its subprocesses write
#              arrives as base64 "stdout" / "stderr" frames, bytes unchanged.
#   diagnostics a private copy of fd 2, for the driver's own failures.
# Frame kinds: start, stdout, stderr, result, error, count, end, cancelled.
import ast
import base64
import collections
import json
import os
import selectors
import signal
import sys
import threading
import time
import traceback

DRIVER_FILE = "<sandcove-driver>"
CELL_FILE = "<cell>"
CHUNK = 32768
MAX_DATA = 2 << 20  # largest encoded value of one result entry
MAX_FRAME = 3 << 20  # the host drops longer lines; it reads at most 4 MiB per frame
MAX_TEXT = 1 << 20  # longest error value or traceback sent

_req_fd = os.dup(0)
_frame_fd = os.dup(1)
_diag_fd = os.dup(2)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_out_r, _out_w = os.pipe()
_err_r, _err_w = os.pipe()
os.dup2(_out_w, 1)
os.dup2(_err_w, 2)
os.close(_out_w)
os.close(_err_w)
os.set_blocking(_out_r, False)
os.set_blocking(_err_r, False)


class _State:
    token = None  # the run being executed; output outside a run is dropped
    busy = False  # a cell (user code) is executing on the main thread
    pending = False  # SIGINT arrived while the driver's own code ran
    count = 0


_S = _State()
_lock = threading.RLock()


def _write_all(data):
    view = memoryview(data)
    while view:
        n = os.write(_frame_fd, view)
        view = view[n:]


def _frame(token, obj):
    line = "\n" + token + " " + json.dumps(obj, separators=(",", ":")) + "\n"
    if len(line) > MAX_FRAME and obj.get("t") == "result":
        # Too large to cross as one frame: keep the plain text, shortened.
        text = obj["data"].get("text/plain", "")[:MAX_TEXT]
        obj = {"t": "result", "data": {"text/plain": text}, "main": obj["main"]}
        line = "\n" + token + " " + json.dumps(obj, separators=(",", ":")) + "\n"
    with _lock:
        _write_all(line.encode("utf-8"))


def _emit(obj):
    with _lock:
        if _S.token is not None:
            _frame(_S.token, obj)


def _output(kind, data):
    with _lock:
        if _S.token is None:
            return
        for i in range(0, len(data), CHUNK):
            piece = base64.b64encode(data[i:i + CHUNK]).decode("ascii")
            _frame(_S.token, {"t": kind, "data": piece, "ts": time.time_ns()})


def _drain(fd, kind):
    with _lock:
        while True:
            try:
                data = os.read(fd, CHUNK)
            except BlockingIOError:
                return
            if not data:
                return
            _output(kind, data)


def _sync():
    # Bytes already in the fd pipes were written before the Python-level text about to be
    # sent: send them first, so one thread's output keeps its order.
    _drain(_out_r, "stdout")
    _drain(_err_r, "stderr")


def _raise_pending():
    # A SIGINT that landed inside the driver's own frames is raised once back in the cell.
    if _S.pending and _S.busy and threading.current_thread() is threading.main_thread():
        _S.pending = False
        raise KeyboardInterrupt()


def _encode_text(text):
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


class _Binary:
    def __init__(self, stream):
        self._stream = stream

    def write(self, data):
        data = bytes(data)
        with _lock:
            self._stream._flush_text()
            _sync()
            _output(self._stream.kind, data)
        _raise_pending()
        return len(data)

    def flush(self):
        self._stream.flush()

    def writable(self):
        return True


class _Stream:
    encoding = "utf-8"
    errors = "surrogateescape"

    def __init__(self, kind, fd):
        self.kind = kind
        self._fd = fd
        self._buf = ""
        self.buffer = _Binary(self)

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not " + type(text).__name__)
        with _lock:
            self._buf += text
            if len(self._buf) >= CHUNK:
                self._flush_text()
            elif "\n" in text:
                head, _, self._buf = self._buf.rpartition("\n")
                _sync()
                _output(self.kind, _encode_text(head + "\n"))
        _raise_pending()
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def _flush_text(self):
        with _lock:
            if self._buf:
                text, self._buf = self._buf, ""
                _sync()
                _output(self.kind, _encode_text(text))

    def flush(self):
        self._flush_text()
        _raise_pending()

    def fileno(self):
        return self._fd

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    @property
    def closed(self):
        return False


_stdout = _Stream("stdout", 1)
_stderr = _Stream("stderr", 2)




def _pump():
    sel = selectors.DefaultSelector()
    sel.register(_out_r, selectors.EVENT_READ, "stdout")
    sel.register(_err_r, selectors.EVENT_READ, "stderr")
    while True:
        for key, _ in sel.select():
            _drain(key.fd, key.data)


_queue = collections.deque()
_queued = threading.Condition()


def _requests():
    reader = os.fdopen(_req_fd, "rb", buffering=0)
    buf = b""
    while True:
        chunk = reader.read(65536)
        if not chunk:
            os._exit(0)  # the host closed the channel: the context is gone
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            try:
                req = json.loads(line)
                token = str(req["token"])
                op = req["op"]
            except (ValueError, KeyError, TypeError):
                continue
            with _queued:
                if op == "run":
                    _queue.append(req)
                    _queued.notify()
                elif op == "cancel":
                    for queued in list(_queue):
                        if str(queued["token"]) == token:
                            _queue.remove(queued)
                            _frame(token, {"t": "cancelled"})


def _on_sigint(signum, frame):
    if not _S.busy:
        return
    if frame is not None and frame.f_code.co_filename == DRIVER_FILE:
        _S.pending = True
        return
    raise KeyboardInterrupt()


def _user_traceback(exc):
    # Drop the driver's frames: the traceback starts in the cell.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != CELL_FILE:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


_BINARY = ("image/png", "image/jpeg", "application/pdf")
_REPRS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)


def _mime_value(mime, value):
    if isinstance(value, tuple) and value:
        value = value[0]  # (data, metadata)
    if value is None:
        return None
    if mime == "application/json":
        text = json.dumps(value)
        return value if len(text) <= MAX_DATA else None
    if isinstance(value, (bytes, bytearray)):
        value = base64.b64encode(value).decode("ascii") if mime in _BINARY else bytes(value).decode("utf-8", "replace")
    value = str(value)
    return value if len(value) <= MAX_DATA else None


def _bundle(value):
    # Runs user code (__repr__, _repr_*_), so it is called while the cell is interruptible.
    text = repr(value)
    if len(text) > MAX_DATA:
        text = text[:MAX_DATA] + "..."
    data = {"text/plain": text}
    if isinstance(value, type):
        return data
    bundle = getattr(value, "_repr_mimebundle_", None)
    if callable(bundle):
        try:
            got = bundle()
            if isinstance(got, tuple):
                got = got[0]
            for mime, v in dict(got or {}).items():
                v = _mime_value(str(mime), v)
                if v is not None:
                    data[str(mime)] = v
        except Exception:
            pass
    for name, mime in _REPRS:
        method = getattr(value, name, None)
        if mime in data or not callable(method):
            continue
        try:
            v = _mime_value(mime, method())
        except Exception:
            continue
        if v is not None:
            data[mime] = v
    return data


def display(*objs):
    """Show each object as a result of the running cell (not its main result)."""
    for obj in objs:
        data = _bundle(obj)
        with _lock:
            _stdout._flush_text()
            _stderr._flush_text()
            _sync()
            _emit({"t": "result", "data": data, "main": False})
    _raise_pending()


_ns = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}


def _run(code):
    tree = ast.parse(code, CELL_FILE, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    code = compile(tree, CELL_FILE, "exec")
    _raise_pending()
    exec(code, _ns)
    if last is not None:
        value = eval(compile(last, CELL_FILE, "eval"), _ns)
        if value is not None:
            return _bundle(value)
    return None


def _execute(req):
    envs = {str(k): str(v) for k, v in dict(req.get("envs") or {}).items()}
    saved = {k: os.environ.get(k) for k in envs}
    signal.signal(signal.SIGINT, _on_sigint)
    sys.stdout, sys.stderr = _stdout, _stderr
    _S.count += 1
    result = error = None
    try:
        os.environ.update(envs)
        _S.pending = False
        _S.busy = True
        result = _run(str(req.get("code", "")))
        _S.busy = False
    except BaseException as exc:  # every kind of error in a cell is its result
        _S.busy = False
        error = exc
    _S.busy = False
    _S.pending = False
    for k, v in saved.items():
        try:
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        except ValueError:
            pass
    with _lock:
        _stdout._flush_text()
        _stderr._flush_text()
        _sync()
        if result is not None:
            _emit({"t": "result", "data": result, "main": True})
        if error is not None:
            try:
                shown = {
                    "t": "error",
                    "name": type(error).__name__,
                    "value": str(error)[:MAX_TEXT],
                    "traceback": _user_traceback(error)[-MAX_TEXT:],
                }
            except BaseException:
                shown = {"t": "error", "name": type(error).__name__, "value": "", "traceback": ""}
            _emit(shown)
        _emit({"t": "count", "n": _S.count})
        _emit({"t": "end"})
        _S.token = None


def _main():
    threading.Thread(target=_pump, daemon=True).start()
    threading.Thread(target=_requests, daemon=True).start()
    signal.signal(signal.SIGINT, _on_sigint)
    while True:
        with _queued:
            while not _queue:
                _queued.wait()
            req = _queue.popleft()
            with _lock:
                _S.token = str(req["token"])
                _emit({"t": "start"})
        _execute(req)


try:
    _main()
except BaseException:
    os.write(_diag_fd, traceback.format_exc().encode("utf-8", "replace"))
    os._exit(70)
