# The code-context kernel driver: one Jupyter kernel per code context, started inside the
# sandbox with the reference client (jupyter_client) and relayed as the built-in driver's
# frames, so the host reads both drivers alike.
#
# The kernelspec name follows the source on the command line. Channels, as the built-in driver's:
#   requests   one JSON object per line on fd 0 (run / cancel, see driver.py).
#   frames     on a private copy of fd 1, each one write of "\n<T> <json>\n".
#   diagnostics fd 2, for the driver's own failures and the kernel's log.
# The kernel's stdin and stdout are /dev/null: a cell never holds the frame channel nor a
# run's token, so it cannot fake frames. Its ports are on the sandbox's loopback only.
# Message mapping: stream -> stdout/stderr, execute_result -> result (main), display_data ->
# result, error -> error, the execution count -> count, then end.
# SIGINT to this driver interrupts the kernel's process group (the kernel runs the cell; the
# driver stays responsive). The kernel is killed with this driver (PR_SET_PDEATHSIG).
import base64
import collections
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback

KERNEL = sys.argv[2]  # argv[1] is this source (see the bootstrap)
CHUNK = 32768
MAX_DATA = 2 << 20  # largest encoded value of one result entry
MAX_FRAME = 3 << 20  # the host drops longer lines
MAX_TEXT = 1 << 20  # longest error value or traceback sent
START_TIMEOUT = 120
REPLY_TIMEOUT = 30

_req_fd = os.dup(0)
_frame_fd = os.dup(1)
_null = os.open(os.devnull, os.O_RDWR)
os.dup2(_null, 0)
os.dup2(_null, 1)
os.close(_null)

_lock = threading.RLock()


class _State:
    token = None
    busy = False
    pgid = None


_S = _State()


def _write_all(data):
    view = memoryview(data)
    while view:
        n = os.write(_frame_fd, view)
        view = view[n:]


def _frame(token, obj):
    line = "\n" + token + " " + json.dumps(obj, separators=(",", ":")) + "\n"
    if len(line) > MAX_FRAME and obj.get("t") == "result":
        text = str(obj["data"].get("text/plain", ""))[:MAX_TEXT]
        obj = {"t": "result", "data": {"text/plain": text}, "main": obj["main"]}
        line = "\n" + token + " " + json.dumps(obj, separators=(",", ":")) + "\n"
    with _lock:
        _write_all(line.encode("utf-8"))


def _emit(obj):
    with _lock:
        if _S.token is not None:
            _frame(_S.token, obj)


def _output(kind, data):
    for i in range(0, len(data), CHUNK):
        piece = base64.b64encode(data[i:i + CHUNK]).decode("ascii")
        _emit({"t": kind, "data": piece, "ts": time.time_ns()})


def _bundle(data):
    out = {}
    for mime, value in dict(data or {}).items():
        if isinstance(value, list):  # some kernels send text as a list of lines
            value = "".join(str(v) for v in value)
        size = len(json.dumps(value)) if mime == "application/json" else len(str(value))
        if size <= MAX_DATA:
            out[str(mime)] = value if mime == "application/json" else str(value)
    if "text/plain" not in out:
        out["text/plain"] = ""
    return out


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
    if _S.busy and _S.pgid is not None:
        try:
            os.killpg(_S.pgid, signal.SIGINT)
        except OSError:
            pass


def _die(why):
    os.write(2, ("sandcove kernel driver: " + why + "\n").encode("utf-8", "replace"))
    os._exit(70)


def _start():
    import ctypes

    from jupyter_client.manager import KernelManager

    libc = ctypes.CDLL(None, use_errno=True)

    def _die_with_parent():
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel ends with this driver

    km = KernelManager(kernel_name=KERNEL)
    km.start_kernel(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    proc = getattr(getattr(km, "provisioner", None), "process", None) or getattr(km, "kernel", None)
    if proc is not None:
        try:
            _S.pgid = os.getpgid(proc.pid)
        except OSError:
            _S.pgid = None
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=START_TIMEOUT)
    return km, kc


def _wait_idle(km, kc, msg_id, on_message):
    """Relay the iopub messages of request msg_id until the kernel is idle again."""
    while True:
        try:
            msg = kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            if not km.is_alive():
                _die("the kernel " + KERNEL + " ended")
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        content = msg["content"]
        if kind == "status" and content.get("execution_state") == "idle":
            return
        on_message(kind, content)


def _reply(kc, msg_id):
    """The shell reply of msg_id (so replies never pile up), or None."""
    deadline = time.monotonic() + REPLY_TIMEOUT
    while time.monotonic() < deadline:
        try:
            msg = kc.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg["content"]
    return None


def _silent(km, kc, code):
    msg_id = kc.execute(code, silent=True, store_history=False, allow_stdin=False)
    _wait_idle(km, kc, msg_id, lambda kind, content: None)
    _reply(kc, msg_id)


def _execute(km, kc, python, req):
    envs = {str(k): str(v) for k, v in dict(req.get("envs") or {}).items()}
    if envs and python:
        # A run's envs hold for that run only: set in the kernel, then put back.
        _silent(km, kc, "import os as _sc_os\n_sc_saved = {k: _sc_os.environ.get(k) for k in %r}\n_sc_os.environ.update(%r)" % (list(envs), envs))
    count = {"n": None}

    def relay(kind, content):
        if kind == "stream":
            name = "stderr" if content.get("name") == "stderr" else "stdout"
            _output(name, str(content.get("text", "")).encode("utf-8", "surrogateescape"))
        elif kind in ("execute_result", "display_data"):
            _emit({"t": "result", "data": _bundle(content.get("data")), "main": kind == "execute_result"})
        elif kind == "error":
            _emit({
                "t": "error",
                "name": str(content.get("ename", ""))[:MAX_TEXT],
                "value": str(content.get("evalue", ""))[:MAX_TEXT],
                "traceback": "\n".join(str(t) for t in content.get("traceback") or [])[-MAX_TEXT:],
            })
        elif kind == "execute_input" and content.get("execution_count") is not None:
            count["n"] = content["execution_count"]

    _S.busy = True
    try:
        msg_id = kc.execute(str(req.get("code", "")), store_history=True, allow_stdin=False, stop_on_error=False)
        _wait_idle(km, kc, msg_id, relay)
    finally:
        _S.busy = False
    reply = _reply(kc, msg_id)
    if reply is not None and reply.get("execution_count") is not None:
        count["n"] = reply["execution_count"]
    if envs and python:
        _silent(km, kc, "for _k, _v in _sc_saved.items():\n    _sc_os.environ.pop(_k, None) if _v is None else _sc_os.environ.__setitem__(_k, _v)\ndel _sc_saved")
    if count["n"] is not None:
        _emit({"t": "count", "n": int(count["n"])})
    _emit({"t": "end"})


def _main():
    signal.signal(signal.SIGINT, _on_sigint)
    threading.Thread(target=_requests, daemon=True).start()
    km, kc = _start()
    python = km.kernel_spec.language.lower() == "python"
    while True:
        with _queued:
            while not _queue:
                _queued.wait()
            req = _queue.popleft()
            with _lock:
                _S.token = str(req["token"])
                _emit({"t": "start"})
        try:
            _execute(km, kc, python, req)
        finally:
            with _lock:
                _S.token = None


try:
    _main()
except BaseException:
    os.write(2, traceback.format_exc().encode("utf-8", "replace"))
    os._exit(70)
