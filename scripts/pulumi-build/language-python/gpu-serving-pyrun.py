# gpu-serving-pyrun.py: run a Python program exactly as the interpreter would, then skip the
# interpreter's final teardown. Installed beside pulumi-language-python by scripts/bootstrap-pulumi.
#
#   python -u gpu-serving-pyrun.py --script PATH [ARGS...]   behaves as   python -u PATH [ARGS...]
#   python -u gpu-serving-pyrun.py --module NAME [ARGS...]   behaves as   python -u -m NAME [ARGS...]
#   --min-pool-threads N (before --script/--module): every concurrent.futures.ThreadPoolExecutor
#   the program makes may grow to at least N threads (the dynamic-provider launcher says why).
#   --invokes MODULE (before --module pulumi.dynamic): the provider server's Invoke calls go first
#   to MODULE.handle(token, args) (see _gs_invokes).
#
# Used by our language host for the program (PATH = pulumi-language-python-exec) and by the
# dynamic-provider launcher (NAME = pulumi.dynamic).
#
# Why: once a Pulumi program (or a dynamic provider, after the engine's SIGINT) is done, CPython's
# finalisation still deallocates every module and object it loaded: 40-110 ms with the Pulumi
# SDK, grpc, pydantic and paramiko in memory, on every `pulumi up`/`preview`, twice (program and
# provider), and the engine waits for it. This runner does the parts of Py_FinalizeEx a program
# can observe, in the same order: join non-daemon threads and run threading's exit hooks
# (threading._shutdown), run the atexit handlers (paramiko closes its transports, OpenTelemetry
# flushes its spans, logging shuts down), flush every file object still open (a program's
# unclosed file keeps its buffered data, as the teardown would have flushed it), then os._exit
# with the same status. What is skipped: destructors (__del__) of objects still alive at exit.
#
# The argv, sys.path[0] and the __main__ module the program sees are those of a plain run.
# Anything unusual (an uncaught exception, a SystemExit code that is not a small int) goes
# through the interpreter's ordinary exit. A SIGINT once the program has ended (the engine closing
# a plugin's process group) ends the exit quietly, with the program's own status (see _gs_finish).
#
# The process also ends, at once, when its parent has gone (see _gs_exit_with_parent): the engine
# for the dynamic provider, our language host for the program. GPU_SERVING_PYTHON_FULL_EXIT=1
# makes the language host and the launcher not use this runner at all (and so loses that too).


def _gs_pyrun(argv):
    import os
    import sys

    exit_status, finish, _gs_widen_pools, serve_invokes = _gs_exit_status, _gs_finish, _gs_widen, _gs_invokes
    _gs_exit_with_parent()
    _gs_defer(DEFERRED)
    main_globals = sys.modules["__main__"].__dict__
    # The program runs in __main__'s namespace, as it would: leave none of ours there.
    for name in ("_gs_pyrun", "_gs_exit_status", "_gs_finish", "_gs_widen", "_gs_exit_with_parent", "_gs_defer",
                 "_gs_invokes", "DEFERRED"):
        main_globals.pop(name, None)

    while len(argv) >= 3 and argv[1] in ("--min-pool-threads", "--invokes"):
        if argv[1] == "--min-pool-threads":
            _gs_widen_pools(int(argv[2]))
        else:
            serve_invokes(argv[2])
        argv = [argv[0], *argv[3:]]
    if len(argv) < 3 or argv[1] not in ("--script", "--module"):
        sys.stderr.write("usage: gpu-serving-pyrun.py [--min-pool-threads N] [--invokes MODULE] --script PATH [ARGS...] "
                         "| --module NAME [ARGS...]\n")
        raise SystemExit(2)
    mode, target, args = argv[1], argv[2], argv[3:]
    try:
        if mode == "--script":
            from importlib.machinery import SourceFileLoader

            # `python PATH`: argv[0] is PATH as given, sys.path[0] the directory of its real path.
            sys.argv[:] = [target, *args]
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            with open(target, "rb") as f:  # bytes: compile() honours a coding cookie, as a plain run does
                source = f.read()
            code = compile(source, target, "exec", dont_inherit=True)
            del source
            main_globals.update(__file__=target, __cached__=None,
                                __loader__=SourceFileLoader("__main__", target))
            exec(code, main_globals)
        else:
            import runpy

            # `python -m NAME`: sys.path[0] is the working directory; runpy sets argv[0] and runs
            # the module in the real __main__, exactly as -m does.
            sys.argv[:] = ["-m", *args]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(target)
    except SystemExit as e:
        status = exit_status(e.code)
        if status is None:
            raise  # let the interpreter report it as it always does
    else:
        status = 0
    finish(status)


# Modules `import pulumi` loads that neither a program nor a dynamic provider uses: the Automation
# API (pulumi/__init__.py imports it for `pulumi.automation.*`), 45 ms of the SDK's ~0.33 s import
# on this project's machines, in both processes of every program run (docs/benchmarks.md, issue 18).
DEFERRED = ("pulumi.automation",)


def _gs_defer(names):
    """Put a stand-in for each module `names` (a subpackage of a top-level package) in sys.modules:
    an import of it binds the stand-in, and the first use of one of its attributes imports the
    real module, which then replaces the stand-in everywhere the import system put it. Not
    importlib's LazyLoader: the import system reads a module's __spec__ on every import, and that
    read alone makes a LazyLoader module load. A package that is not installed, or not where its
    parent says, is left alone (its import then behaves as always)."""
    import importlib
    import importlib.util
    import os
    import sys
    import types

    class Deferred(types.ModuleType):
        def __getattr__(self, attr):
            name = self.__name__
            if sys.modules.get(name) is self:
                del sys.modules[name]
            real = importlib.import_module(name)  # also rebinds it on its parent package
            self.__dict__.update({k: v for k, v in real.__dict__.items() if k != "__class__"})
            return getattr(real, attr)

    for name in names:
        top, _, sub = name.partition(".")
        if name in sys.modules or not sub or "." in sub:
            continue
        parent = importlib.util.find_spec(top)  # a top-level name: found, not imported
        for base in (parent.submodule_search_locations or ()) if parent else ():
            init = os.path.join(base, sub, "__init__.py")
            if os.path.isfile(init):
                stand_in = Deferred(name)
                stand_in.__spec__ = importlib.util.spec_from_file_location(
                    name, init, submodule_search_locations=[os.path.join(base, sub)])
                stand_in.__file__, stand_in.__path__, stand_in.__package__ = init, [os.path.join(base, sub)], name
                sys.modules[name] = stand_in
                break


def _gs_exit_with_parent():
    """End this process as soon as its parent is gone. The engine stops the dynamic provider when
    it ends normally, but a CLI killed by SIGKILL, or by SIGPIPE in `pulumi preview | head -3`,
    stops nothing: the provider would wait for calls for ever, parented to init (a scheduled drift
    check would pile them up). Its calls can no longer be answered, nor their results recorded, so
    stopping at once (even mid-call) is what the user who killed the CLI asked for; the next
    refresh reads the host as it is.

    How: a daemon thread waits on a pidfd of the parent, readable the moment that process exits
    (no polling, nothing to do until then). Not PR_SET_PDEATHSIG: it follows the parent's
    *thread* that started us, and the engine is a Go program whose threads are not the process.
    A parent that is already gone when we look, or a kernel without pidfds, is seen by getppid
    changing (Linux gives an orphan a new parent): checked after pidfd_open (the PID named our
    parent then, not a reused one), and polled when there is no pidfd."""
    import os
    import select
    import threading
    import time

    parent = os.getppid()

    def watch():
        try:
            fd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            fd = None
        if fd is not None and os.getppid() == parent:
            select.select([fd], [], [])
        else:
            while os.getppid() == parent:
                time.sleep(0.5)
        os._exit(1)  # nobody is left to read a status or an error

    threading.Thread(target=watch, name="gpu-serving-exit-with-parent", daemon=True).start()


def _gs_widen(threads):
    """Let every ThreadPoolExecutor made from now on grow to at least `threads` threads. The SDK's
    dynamic-provider server fixes its pool at 4 inside its unguarded main(); this is the one
    place to widen it without a copy of that server. An executor starts a thread only when work
    is waiting and none is idle, so the ceiling costs nothing until used."""
    import concurrent.futures
    import concurrent.futures.thread

    base = concurrent.futures.thread.ThreadPoolExecutor

    class ThreadPoolExecutor(base):
        def __init__(self, max_workers=None, *args, **kwargs):
            super().__init__(max(max_workers or 0, threads), *args, **kwargs)

    concurrent.futures.ThreadPoolExecutor = ThreadPoolExecutor
    concurrent.futures.thread.ThreadPoolExecutor = ThreadPoolExecutor


def _gs_invokes(module_name):
    """Give the dynamic-provider server's Invoke calls to `module_name`.handle(token, args) first:
    it returns the answer (a dict) or None, and None (or a module the working directory does not
    have: another project on this engine) leaves the call to the SDK's server, which refuses every
    Invoke as not implemented. The SDK's server is built inside its unguarded main(); the one
    place to reach it without a copy of that server is where it registers its servicer with grpc,
    so that function is wrapped: the servicer's Invoke is replaced on the instance before grpc
    reads it. The module is imported on the first call (from the working directory, the project,
    as the pickled providers are), and `args` is the request's Struct as a plain dict."""
    import importlib

    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

    register = provider_pb2_grpc.add_ResourceProviderServicer_to_server
    found = []

    def handler():
        if not found:
            try:
                found.append(importlib.import_module(module_name).handle)
            except ImportError:
                found.append(None)
        return found[0]

    def add_servicer(servicer, server):
        not_ours = servicer.Invoke

        def Invoke(request, context):
            handle = handler()
            answer = None
            if handle is not None:
                from google.protobuf import json_format, struct_pb2

                answer = handle(request.tok, json_format.MessageToDict(request.args))
            if answer is None:
                return not_ours(request, context)
            ret = struct_pb2.Struct()
            ret.update(answer)
            return provider_pb2.InvokeResponse(**{"return": ret})

        servicer.Invoke = Invoke
        return register(servicer, server)

    provider_pb2_grpc.add_ResourceProviderServicer_to_server = add_servicer


def _gs_exit_status(code):
    """The process exit status the interpreter would use for SystemExit(code), when simple."""
    if code is None:
        return 0
    if isinstance(code, int) and not isinstance(code, bool) and 0 <= code <= 255:
        return code
    return None


def _gs_finish(status):
    import atexit
    import gc
    import os
    import signal
    import sys
    import threading

    import _io

    # The program has ended with `status`. The engine, closing its plugins, sends SIGINT to a
    # whole process group, so one can reach a program that is already on its way out (our
    # language host's group holds the program; a failed `pulumi up` closes it at any moment). It
    # means "exit now", not a new error: it stops the wait for the program's threads, as the
    # interpreter's exit does (there with an "Exception ignored" traceback, here silently), and is
    # ignored in the short steps after. The status stays the program's.
    waiting = [True]

    def on_sigint(signum, frame):
        if waiting[0]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    try:
        try:
            threading._shutdown()
        finally:
            waiting[0] = False  # from here on a SIGINT is ignored (on_sigint returns)
    except KeyboardInterrupt:
        pass
    atexit._run_exitfuncs()
    file_base = _io._IOBase
    for obj in gc.get_objects():
        # _io._IOBase (not the io.IOBase ABC, whose isinstance check is ~4x slower): every built-in
        # and user-defined file object derives from it. type(), not isinstance(): isinstance also
        # reads obj.__class__, and that read makes a lazily loaded module (importlib's LazyLoader:
        # the program's paramiko) import itself, ~0.1 s of the program's exit (docs/benchmarks.md).
        if issubclass(type(obj), file_base):
            try:
                if not obj.closed:
                    obj.flush()
            except Exception:
                pass
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)


_gs_pyrun(__import__("sys").argv)
