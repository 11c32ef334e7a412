# sandcall's Python runner. It runs the submitted code, /run/sandcall/main.py, as
# __main__: for programs that call tools, with every declared tool as a global function;
# in a warm sandbox, started before the code exists, it first waits on fd 3 for
# {"args": [...], "tools": bool}. Nothing here shifts the program's line numbers: the
# code is compiled from its own file.
import builtins
import json
import os
import sys
import types

_MAIN = "/run/sandcall/main.py"
_SOCKET = "/run/sandcall/tools.sock"
_TOOLS = "/run/sandcall/tools.json"


_channel = None
_status_fd = None

def _tools_api():
    """The tool machinery, built only for runs that have tools: a plain run imports
    nothing it would not import as `python3 main.py`."""
    import asyncio
    import selectors
    import socket
    import threading

    global _channel
    class ToolError(Exception):
        """A tool call failed: the caller answered with is_error, or sandcall refused it."""


    class _Channel:
        """One connection to sandcall, shared by every call of the program."""

        def __init__(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(_SOCKET)
            self.send_lock = threading.Lock()
            self.read_lock = threading.Lock()
            self.cond = threading.Condition()
            # Replies may be megabytes: a bytearray grows in place, and the newline
            # search resumes where the last one stopped.
            self.buf = bytearray()
            self.scanned = 0
            self.next_id = 0
            self.replies = {}
            self.futures = {}
            self.loops = set()
            self.unflushed = False

        def send(self, message):
            data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
            with self.send_lock:
                self.sock.sendall(data)

        def new_call(self, name, arguments):
            with self.cond:
                self.next_id += 1
                call_id = "c%d" % self.next_id
            self.send({"op": "call", "id": call_id, "name": name, "arguments": arguments})
            return call_id

        def _take_lines(self):
            lines = []
            start = 0
            while True:
                end = self.buf.find(b"\n", max(start, self.scanned))
                if end < 0:
                    break
                lines.append(json.loads(self.buf[start:end]))
                start = end + 1
            if start:
                del self.buf[:start]
            self.scanned = len(self.buf)
            return lines

        def _deliver(self, reply):
            future = self.futures.pop(reply.get("id"), None)
            if future is not None:
                if not future.done():
                    try:
                        future.set_result(reply)
                    except Exception:
                        pass
                return
            with self.cond:
                self.replies[reply.get("id")] = reply
                self.cond.notify_all()

        def wait_sync(self, call_id):
            """Blocks until the reply to call_id arrives (plain, synchronous calls)."""
            while True:
                with self.cond:
                    if call_id in self.replies:
                        return self.replies.pop(call_id)
                if self.read_lock.acquire(blocking=False):
                    try:
                        chunk = self.sock.recv(1 << 16)
                        if not chunk:
                            raise ToolError("the connection to sandcall closed")
                        self.buf += chunk
                        for reply in self._take_lines():
                            self._deliver(reply)
                    finally:
                        self.read_lock.release()
                else:
                    with self.cond:
                        self.cond.wait(0.05)

        def on_readable(self):
            """Event-loop reader callback: the socket has replies for awaited calls."""
            with self.read_lock:
                try:
                    chunk = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    return
                if not chunk:
                    for future in list(self.futures.values()):
                        if not future.done():
                            future.set_exception(ToolError("the connection to sandcall closed"))
                    self.futures.clear()
                    for loop in list(self.loops):
                        loop.remove_reader(self.sock.fileno())
                    self.loops.clear()
                    return
                self.buf += chunk
                for reply in self._take_lines():
                    self._deliver(reply)



    def _get_channel():
        global _channel
        if _channel is None:
            _channel = _Channel()
        return _channel


    def _outcome(reply):
        if reply.get("ok"):
            return reply.get("result")
        message = reply.get("error") or "tool call failed"
        if reply.get("kind") == "timeout":
            raise TimeoutError(message)
        raise ToolError(message)


    class _Selector(selectors.DefaultSelector):
        """Tells sandcall that the program waits, at the moment the event loop would block:
        every call made until then (asyncio.gather, say) goes to the caller together."""

        def select(self, timeout=None):
            channel = _channel
            if channel is not None and channel.unflushed and (timeout is None or timeout > 0):
                channel.unflushed = False
                channel.send({"op": "flush"})
            return super().select(timeout)


    class _Loop(asyncio.SelectorEventLoop):
        def __init__(self):
            super().__init__(_Selector())


    class _Policy(asyncio.DefaultEventLoopPolicy):
        _loop_factory = _Loop


    def _arguments(name, params, required, args, kwargs):
        """The arguments object of a call: keyword arguments, one dict, or positional
        arguments in the order of `params` (required ones first, then optional ones);
        an optional argument left as None is not sent. One dict whose keys are all
        parameters (or for a tool without declared parameters) is the arguments object
        itself, as before positional arguments existed."""
        if len(args) == 1 and not kwargs and isinstance(args[0], dict):
            if not params or all(key in params for key in args[0]):
                return dict(args[0])
        if len(args) > len(params):
            raise TypeError(
                "%s() takes at most %d positional arguments (%s), %d given"
                % (name, len(params), ", ".join(params) or "none", len(args))
            )
        arguments = {}
        for index, value in enumerate(args):
            param = params[index]
            if param in kwargs:
                raise TypeError("%s() got multiple values for argument %r" % (name, param))
            arguments[param] = value
        arguments.update(kwargs)
        optional = set(params[required:])
        return {k: v for k, v in arguments.items() if not (v is None and k in optional)}

    def _call(name, params, required, args, kwargs):
        arguments = _arguments(name, params, required, args, kwargs)
        channel = _get_channel()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            call_id = channel.new_call(name, arguments)
            channel.send({"op": "flush"})
            return _outcome(channel.wait_sync(call_id))
        if loop not in channel.loops:
            loop.add_reader(channel.sock.fileno(), channel.on_readable)
            channel.loops.add(loop)
        future = loop.create_future()
        call_id = channel.new_call(name, arguments)
        channel.futures[call_id] = future
        channel.unflushed = True

        async def wait():
            return _outcome(await future)

        return wait()


    def _tool(declared, python, params, required):
        def tool(*args, **kwargs):
            return _call(declared, params, required, args, kwargs)

        tool.__name__ = python
        tool.__qualname__ = python
        tool.__doc__ = "Calls the tool %r. Arguments: %s." % (declared, ", ".join(params) or "none")
        return tool

    return ToolError, _tool, _Policy


def _hide_runner(te, seen):
    """Drops this runner's own frames from a traceback (and from its chained ones)."""
    import traceback

    if te is None or id(te) in seen:
        return
    seen.add(id(te))
    own = _report.__code__.co_filename
    te.stack = traceback.StackSummary.from_list([f for f in te.stack if f.filename != own])
    _hide_runner(te.__cause__, seen)
    _hide_runner(te.__context__, seen)


def _report(error):
    """Prints the traceback as python3 would for the program alone: from its first
    own frame, without the runner's frames."""
    import traceback

    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != _MAIN:
        tb = tb.tb_next
    te = traceback.TracebackException(type(error), error, tb or error.__traceback__)
    _hide_runner(te, set())
    sys.stderr.write("".join(te.format()))


def _finish(status):
    """Ends the process as Python would, minus tearing down every module: non-daemon
    threads are joined, atexit handlers run, output is flushed."""
    if isinstance(status, SystemExit):
        code = status.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code
        else:
            print(code, file=sys.stderr)
            status = 1
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
    except BaseException:
        pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    status &= 0xFF
    if _status_fd is not None:
        # Tells sandcall the run is over, so that it need not wait for the kernel to
        # end this process.
        try:
            os.write(_status_fd, b"exit %d\n" % status)
        except OSError:
            pass
    os._exit(status)


def _warm_up():
    """Runs a little code through the same paths a program takes (compile, exec, print,
    file I/O) while the sandbox waits for its program: the interpreter's code pages are
    then in memory, which takes over a millisecond off the run. Then imports the
    preloads. Nothing of it is left for the program to see."""
    _warm_paths()
    # asyncio is not imported here, though programs that call tools start with it: with
    # it here, every plain run paid too (a warm `print(1)` measured 3x to 5x slower, A/B
    # under the same load; the larger interpreter also takes longer to refill and to
    # tear down). A run with tools imports it at its go instead.
    # On the managed runtime, the modules of `warm_preload` (numpy, pandas,
    # matplotlib.pyplot by default): imported now, a run's own import of them is free.
    # Nothing is seeded here: numpy's global generator seeds itself from the OS when
    # imported, in this sandbox's own process, used by one run only.
    import importlib

    preload = os.environ.pop("SANDCALL_PRELOAD", None)
    for name in (preload or "").split(","):
        if name:
            try:
                importlib.import_module(name)
            except Exception:
                pass
    if "matplotlib.pyplot" in sys.modules:
        _warm_figures()
    if preload is not None:
        # sandcall hands this sandbox out only after this line (Launch::wait_ready).
        os.write(3, b"ready\n")


def _warm_paths():
    """The paths of a run without its imports: compile, exec, print, file I/O. A program
    forked from the template runs this alone (zygote.py, `_rehearse`): the figures and
    imports are the template's already, and drawing again would copy their pages."""
    import io

    sink = io.StringIO()
    code = compile("x = [i * 2 for i in range(10)]\nprint(x, file=sink)\n", "<warm-up>", "exec", dont_inherit=True)
    exec(code, {"sink": sink, "__name__": "__warm_up__"})
    with open("/proc/self/stat", "rb") as f:
        f.read()


def _warm_figures():
    """With matplotlib.pyplot preloaded: draws one throwaway chart (pandas' plotting
    backend when pandas is preloaded too) into memory and closes it, so that a run's
    first figure finds the Agg canvas, the fonts and the plotting modules loaded (about
    60 ms of a small chart's first draw and save). Nothing is left: no figure is open,
    the next figure is number 1, no file is written."""
    import io

    plt = sys.modules["matplotlib.pyplot"]
    try:
        fig, ax = plt.subplots()
        pandas = sys.modules.get("pandas")
        if pandas is not None:
            pandas.Series([1, 2], index=["a", "b"]).plot.bar(ax=ax, title="warm-up")
        else:
            ax.bar(["a", "b"], [1, 2])
            ax.set_title("warm-up")
        fig.savefig(io.BytesIO(), format="png")
    except Exception:
        pass
    finally:
        plt.close("all")


def _seed_generators():
    """A programmatic session's program draws the same random numbers when sandcall
    runs it again (replay, docs/scaling.md): `random` and numpy's global generator are
    seeded from /run/sandcall/seed, numpy once it is imported."""
    try:
        with open("/run/sandcall/seed", encoding="ascii") as f:
            seed = int(f.read())
    except (OSError, ValueError):
        return
    import random

    random.seed(seed)
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed(seed)
        return

    class SeedNumpy:
        def find_spec(self, name, path=None, target=None):
            if name != "numpy.random":
                return None
            sys.meta_path.remove(self)
            from importlib.machinery import PathFinder

            spec = PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def exec_and_seed(module):
                exec_module(module)
                module.seed(seed)

            spec.loader.exec_module = exec_and_seed
            return spec

    sys.meta_path.insert(0, SeedNumpy())


def main(warmed=False):
    """`warmed`: the warm-up already ran, in the template this process was forked from
    (zygote.py)."""
    if not warmed and os.environ.get("SANDCALL_WARM") == "1":
        _warm_up()
    if os.environ.pop("SANDCALL_WARM", None) == "1":
        global _status_fd
        line = b""
        while not line.endswith(b"\n"):
            chunk = os.read(3, 4096)
            if not chunk:
                break
            line += chunk
        start = json.loads(line or b"{}")
        # fd 3 stays open: the run's end is reported there (see _finish).
        _status_fd = 3
        args, with_tools = start.get("args", []), start.get("tools", False)
    else:
        args, with_tools = sys.argv[1:], True
    tools = []
    if with_tools:
        _seed_generators()
        with open(_TOOLS, encoding="utf-8") as f:
            tools = json.load(f)
        ToolError, _tool, _Policy = _tools_api()
    with open(_MAIN, "rb") as f:
        source = f.read()
    module = types.ModuleType("__main__")
    module.__file__ = _MAIN
    module.__builtins__ = builtins
    if with_tools:
        module.ToolError = ToolError
        # The Code Interpreter API's name for the same error.
        module.ToolExecutionError = ToolError
        # As in the Code Interpreter API, a program that calls tools starts with these
        # modules and typing names imported (LibreChat's tool description counts on
        # `asyncio`).
        import asyncio
        import typing

        for name, value in (("asyncio", asyncio), ("json", json), ("os", os), ("sys", sys)):
            setattr(module, name, value)
        for name in ("Any", "Dict", "List", "Optional", "Union"):
            setattr(module, name, getattr(typing, name))
        for tool in tools:
            names = tool["python"]
            function = _tool(tool["name"], names[0], tool.get("params", []), tool.get("required", 0))
            for python in names:
                setattr(module, python, function)
    sys.modules["__main__"] = module
    sys.argv = [_MAIN] + args
    # As `python3 main.py` would: the script's directory first (then PYTHONPATH).
    sys.path[0] = "/run/sandcall"
    if with_tools:
        import asyncio

        asyncio.set_event_loop_policy(_Policy())
    # Top-level await only where tools are: a plain run is `python3 main.py` exactly.
    flags = 0x2000 if with_tools else 0  # ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    try:
        code = compile(source, _MAIN, "exec", flags=flags, dont_inherit=True)
    except SyntaxError as error:
        import traceback

        traceback.print_exception(type(error), error, None)
        _finish(1)
    try:
        result = eval(code, module.__dict__)
        if with_tools and type(result).__name__ == "coroutine":
            import asyncio

            asyncio.run(result)
    except SystemExit as exit_request:
        _finish(exit_request)
    except BaseException as error:
        _report(error)
        _finish(1)
    _finish(0)


# zygote.py loads this file as a module of its own and calls main() in each forked run.
if __name__ == "__main__":
    main()
