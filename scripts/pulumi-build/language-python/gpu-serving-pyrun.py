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

    import _signal

    # A process started with SIGINT ignored (a `pulumi` command run with `&` from a script, or
    # under nohup) keeps it ignored, and Python then sets no KeyboardInterrupt up for it: the
    # engine's stop of a plugin (SIGINT to its process group, SIGKILL 5 s later) waited the whole
    # 5 s. As Python does when started normally (_signal: built in, nothing to import):
    if _signal.getsignal(_signal.SIGINT) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)

    exit_status, finish, _gs_widen_pools, serve_invokes = _gs_exit_status, _gs_finish, _gs_widen, _gs_invokes
    exit_with_parent, defer, deferred = _gs_exit_with_parent, _gs_defer, DEFERRED
    warm_relay, warm_serve = _gs_warm()
    main_globals = sys.modules["__main__"].__dict__
    runner = main_globals["__file__"]
    # The program runs in __main__'s namespace, as it would: leave none of ours there.
    for name in ("_gs_pyrun", "_gs_exit_status", "_gs_finish", "_gs_widen", "_gs_exit_with_parent", "_gs_defer",
                 "_gs_invokes", "_gs_warm", "DEFERRED"):
        main_globals.pop(name, None)

    if len(argv) >= 5 and argv[1] == "--warm-serve":
        # The warm process (see _gs_warm); this returns only in a child it forked for one run, with
        # that run's arguments and the PID of the runner that asked for it.
        defer(deferred)
        argv, parent = warm_serve(argv[2], argv[3], argv[4], runner)
        exit_with_parent(parent)
        # Which process the engine launched for this run (its parent is the `pulumi` CLI): the
        # runner, for a copy (components/remote/handoff.py finds the CLI's run by it).
        os.environ["GPU_SERVING_LAUNCHED_PID"] = str(parent)
    else:
        exit_with_parent()
        os.environ["GPU_SERVING_LAUNCHED_PID"] = str(os.getpid())
        if len(argv) >= 3 and argv[1] == "--warm":
            module, argv = argv[2], [argv[0], *argv[3:]]
            warm_relay(module, argv, runner)  # returns only when no warm process took the run
        defer(deferred)

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


def _gs_exit_with_parent(runner=None):
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
    parent then, not a reused one), and polled when there is no pidfd.

    A run forked by the warm process (`runner`: the PID of the runner that asked for it, see
    _gs_warm) watches that runner instead: it stands where this process would have been."""
    import os
    import select
    import threading
    import time

    parent = runner or os.getppid()

    def alive():
        if runner is None:
            return os.getppid() == parent
        try:
            os.kill(parent, 0)
            return True
        except ProcessLookupError:
            return False
        except OSError:
            return True

    def watch():
        try:
            fd = os.pidfd_open(parent)
        except (AttributeError, OSError):
            fd = None
        if fd is not None and alive():
            select.select([fd], [], [])
        else:
            while alive():
                time.sleep(0.5)
        os._exit(1)  # nobody is left to read a status or an error

    threading.Thread(target=watch, name="gpu-serving-exit-with-parent", daemon=True).start()


def _gs_warm():
    """Warm start: (relay, serve). A run's first ~0.5-0.7 s is Python loading the same modules
    (the Pulumi SDK, grpc, pydantic and the settings models, paramiko and the providers), twice
    per `pulumi preview` (program and dynamic provider) and four times per `pulumi up`
    (docs/benchmarks.md, issue 18). A warm process loads them once, then forks a copy of itself
    for each run: the copy runs the program or the provider exactly as this runner would have,
    with the run's own arguments, environment, working directory, umask and standard streams.

    relay(module, argv, runner), in the runner the language host or the launcher started (their
    `--warm MODULE`): asks the warm process of this project for a copy, then stands in for it
    (signals passed on, its exit status or signal taken as its own) and never returns. It returns,
    and the run goes on cold in this process as before, when warm starts are off
    (GPU_SERVING_WARM_START=0; OpenTelemetry variables, whose tracing is set up as `pulumi` is
    imported), when no warm process serves this project yet (one is started, in its own session,
    for the next run), or when the one there is stale.

    serve(path, key, module, runner), in the warm process (`--warm-serve`): imports MODULE from
    the working directory, with the variables that change what an import does (PYTHON*, locale,
    TZ, GRPC_*) and no other (no secret stays in it), listens on `path`, a socket in a directory
    only this user can enter, for runners of this user only, and forks one copy per request.
    Stale is any loaded module's file changed, moved or gone since the import (an edit of the
    program, a pip install): it answers "stale" and ends once its copies have, so a changed
    program never runs from a warm process. The key of a warm process holds the interpreter, this
    runner and its mtime, sys.path, the working directory, MODULE and the variables above: a run
    that differs in any of them finds another one. It ends after GPU_SERVING_WARM_IDLE_SECONDS
    (default 900) without a run. A copy ends with its runner (it watches that runner as the run
    watches its parent, _gs_exit_with_parent), and the warm process kills it when the runner's
    connection drops. The copy's command line is the warm process's (ps shows `--warm-serve`)."""
    import os
    import signal
    import sys

    import_env = ("PYTHON", "LANG", "LC_", "TZ", "GRPC_")  # name prefixes
    # The signals a runner passes on to its run.
    relayed = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
    cold_env = ("TRACEPARENT", "OTEL_", "PULUMI_OTEL_")
    header = 8  # bytes: the request's length

    def enabled():
        if os.environ.get("GPU_SERVING_WARM_START", "").strip().lower() in ("0", "false", "no", "off"):
            return False
        return not any(name.startswith(cold_env) for name in os.environ)

    def place(module, runner):
        """(socket path, key) of this run's warm process, or None when the place is not safe."""
        import hashlib
        import json
        import stat

        base = os.environ.get("GPU_SERVING_WARM_DIR") or f"/tmp/gpu-serving-warm-{os.getuid()}"
        try:
            os.mkdir(base, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(base)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None  # someone else's, or open to others: never trust a socket there
        real = os.path.realpath(runner)
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith(import_env))
        ident = [sys.executable, sys.version, real, os.stat(real).st_mtime_ns, sys.path, os.getcwd(), module, env,
                 list(sys.flags)]
        key = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]
        return os.path.join(base, key + ".sock"), key

    def read_line(sock, buf):
        while b"\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                return None, buf
            buf += chunk
        line, _, rest = buf.partition(b"\n")
        return line, rest

    def spawn(path, key, module, runner):
        import subprocess

        env = {k: v for k, v in os.environ.items() if k.startswith((*import_env, "GPU_SERVING_WARM_")) or k in ("PATH", "HOME")}
        try:
            subprocess.Popen([sys.executable, "-u", runner, "--warm-serve", path, key, module], cwd=os.getcwd(),
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, close_fds=True, start_new_session=True)
        except OSError:
            pass

    def relay(module, argv, runner):
        import json
        import signal
        import socket

        if not enabled():
            return
        if None in (sys.__stdin__, sys.__stdout__, sys.__stderr__):
            return  # a stream closed when this interpreter started: its number may be another file's now
        try:
            where = place(module, runner)
        except OSError:
            return
        if where is None:
            return
        path, key = where
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            spawn(path, key, module, runner)
            return
        # The signals a run gets are passed on from the moment the request is sent: the engine
        # ends its language host with SIGINT once the program reported an error, which on a
        # loaded machine can come before the warm process has said the run's PID. Until then a
        # signal is kept; once the PID is here it is passed on, and if no warm copy takes the
        # run it is given back to this interpreter, which runs cold as if it had come now.
        run = {"child": None, "pending": []}

        def forward(signum, frame):
            if run["child"] is None:
                run["pending"].append(signum)
                return
            try:
                os.kill(run["child"], signum)
            except OSError:
                pass

        before = {signum: signal.signal(signum, forward) for signum in relayed}

        def go_cold():
            sock.close()
            for signum, handler in before.items():
                signal.signal(signum, handler)
            for signum in run["pending"]:
                os.kill(os.getpid(), signum)

        mask = os.umask(0)
        os.umask(mask)
        body = json.dumps({"key": key, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(),
                           "umask": mask}).encode()
        data = len(body).to_bytes(header, "big") + body
        try:
            socket.send_fds(sock, [data[:4096]], [0, 1, 2])
            if len(data) > 4096:
                # Not with nothing left: a send of 0 bytes still fails once the warm process has
                # closed its end, and by then it may have run the whole request already.
                sock.sendall(data[4096:])
        except OSError:  # e.g. a standard stream closed: nothing was forked for a request cut short
            go_cold()
            return
        try:
            # A copy runs only once its PID has reached us (the warm process lets it go after
            # that answer is sent, see take()), so a connection closed or reset without one (a
            # warm process ending: idle, stale, or the loser of two started at once) means
            # nothing runs there, and this run goes cold. Silence is not that: wait for it.
            sock.settimeout(60)
            line, buf = read_line(sock, b"")
            answer = json.loads(line) if line else {}
        except TimeoutError:
            sys.stderr.write("gpu-serving: the warm process did not answer; run again, or with GPU_SERVING_WARM_START=0\n")
            os._exit(1)
        except (OSError, ValueError):
            answer = {}
        if "pid" not in answer:
            if answer.get("stale"):
                spawn(path, key, module, runner)  # for the next run: this one goes on cold
            go_cold()
            return
        run["child"] = answer["pid"]
        for signum in run["pending"]:
            forward(signum, None)
        sock.settimeout(None)
        try:
            line, _ = read_line(sock, buf)
            status = json.loads(line)["status"] if line else None
        except (OSError, ValueError, KeyError):
            status = None
        if status is None:
            sys.stderr.write("gpu-serving: the warm process ended before the run did\n")
            os._exit(1)
        if os.WIFSIGNALED(status):
            signum = os.WTERMSIG(status)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            os._exit(128 + signum)
        os._exit(os.waitstatus_to_exitcode(status))

    def serve(path, key, module, runner):
        import gc
        import importlib
        import json
        import selectors
        import signal
        import socket
        import struct
        import time

        os.closerange(3, 1 << 16)  # nothing of the runner that started us: it may hold a pipe open
        idle = float(os.environ.get("GPU_SERVING_WARM_IDLE_SECONDS") or 900)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
            os._exit(0)  # another warm process already serves this key
        except OSError:
            probe.close()

        failure = None
        cwd = os.getcwd()
        sys.path.insert(0, cwd)
        broken = set()
        try:
            importlib.import_module(module)
        except BaseException as exc:  # noqa: BLE001 - whatever it is, runs go cold and say nothing
            import traceback

            failure = type(exc).__name__
            # The files the failure came from: a failed import leaves its module out of
            # sys.modules, and the fix of that file must make this process stale.
            broken = {frame.filename for frame in traceback.extract_tb(exc.__traceback__)}
            if isinstance(getattr(exc, "filename", None), str):
                broken.add(exc.filename)
        finally:
            if sys.path and sys.path[0] == cwd:
                del sys.path[0]

        def stamp(name):
            try:
                st = os.stat(name)
                return st.st_mtime_ns, st.st_size, st.st_ino
            except OSError:
                return None

        files = {m.__file__ for m in list(sys.modules.values()) if isinstance(getattr(m, "__file__", None), str)}
        files |= {name for name in broken if os.path.isabs(name)}
        files.add(os.path.realpath(runner))
        stamps = {name: stamp(name) for name in files}
        gc.collect()
        gc.freeze()  # the copies' collector never walks what every run shares (and keeps it shared)

        def changed():
            for name, seen in stamps.items():
                if stamp(name) != seen:
                    return name
            return None

        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        temp = f"{path}.{os.getpid()}"
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        srv.bind(temp)
        os.chmod(temp, 0o600)
        srv.listen(64)
        os.replace(temp, path)
        mine = os.stat(path).st_ino
        sel = selectors.DefaultSelector()
        sel.register(srv, selectors.EVENT_READ, ("listen", None))
        runs = {}  # pid -> (connection, pidfd)
        state = {"accepting": True, "last": time.monotonic()}

        def ours():
            try:
                return os.stat(path).st_ino == mine
            except OSError:
                return False

        def retire():
            if state["accepting"]:
                state["accepting"] = False
                if ours():
                    os.unlink(path)
                sel.unregister(srv)
                srv.close()

        def reply(conn, answer):
            try:
                conn.sendall((json.dumps(answer) + "\n").encode())
                return True
            except OSError:
                return False

        def receive(conn):
            conn.settimeout(10)
            data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 3)
            while len(data) < header or len(data) < header + int.from_bytes(data[:header], "big"):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
            return data, fds

        def drop(conn, fds):
            for fd in fds:
                os.close(fd)
            conn.close()

        def take(conn, peer):
            got = None
            try:
                got = receive(conn)
                request = json.loads(got[0][header:])
            except (OSError, ValueError):
                request = None
            fds = got[1] if got else []
            if not isinstance(request, dict) or len(fds) != 3 or request.get("key") != key:
                drop(conn, fds)
                return None
            stale = changed()
            if stale or failure:
                reply(conn, {"stale": stale} if stale else {"cold": failure})
                drop(conn, fds)
                if stale:
                    retire()
                return None
            go_read, go_write = os.pipe()
            # The runner passes on a signal as soon as it has the copy's PID, which can be before
            # the copy's interpreter is back from fork(): Python drops a signal that comes in that
            # window (it clears the flags of signals caught "before the fork"). Held blocked until
            # the copy is set up, a signal stays pending in the kernel and is raised in the run.
            held = signal.pthread_sigmask(signal.SIG_BLOCK, relayed)
            pid = os.fork()
            if pid != 0:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
            if pid == 0:
                # The copy: nothing of the warm process's own, the run's streams, place and variables.
                os.close(go_write)
                sel.close()
                if state["accepting"]:
                    srv.close()
                for other, pidfd in runs.values():
                    other.close()
                    os.close(pidfd)
                conn.close()
                # Only once the runner has our PID (else it could go cold beside us).
                go = os.read(go_read, 1)
                os.close(go_read)
                if go != b"g":
                    os._exit(0)
                for i, fd in enumerate(fds):
                    os.dup2(fd, i)
                for fd in fds:
                    if fd > 2:
                        os.close(fd)
                os.chdir(request["cwd"])
                os.umask(request["umask"])
                os.environ.clear()
                os.environ.update(request["env"])
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                return request["argv"], peer
            os.close(go_read)
            for fd in fds:
                os.close(fd)
            runs[pid] = (conn, os.pidfd_open(pid))
            sel.register(conn, selectors.EVENT_READ, ("runner", pid))
            sel.register(runs[pid][1], selectors.EVENT_READ, ("run", pid))
            if reply(conn, {"pid": pid}):
                os.write(go_write, b"g")
            os.close(go_write)  # without "g" first: the copy ends without running anything
            return None

        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        while True:
            if state["accepting"] and not ours():
                retire()  # another warm process took the place (two started at once)
            if not runs and (not state["accepting"] or time.monotonic() - state["last"] > idle):
                retire()
                os._exit(0)
            for event, _mask in sel.select(timeout=1.0):
                kind, pid = event.data
                if kind == "listen":
                    try:
                        conn, _addr = srv.accept()
                        peer, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                                               struct.calcsize("3i")))
                    except OSError:
                        continue
                    if uid != os.getuid():  # runners of this user only
                        conn.close()
                        continue
                    state["last"] = time.monotonic()
                    child = take(conn, peer)
                    if child is not None:
                        return child
                elif pid in runs:
                    conn, pidfd = runs[pid]
                    if kind == "runner":  # the runner is gone (or broke the protocol): so is its run
                        sel.unregister(conn)
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
                        continue
                    _, status = os.waitpid(pid, 0)
                    sel.unregister(pidfd)
                    os.close(pidfd)
                    try:
                        sel.unregister(conn)
                    except KeyError:
                        pass
                    conn.settimeout(5)
                    reply(conn, {"status": status})
                    conn.close()
                    del runs[pid]
                    state["last"] = time.monotonic()

    return relay, serve


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
