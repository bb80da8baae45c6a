// Command pulumi-language-python is gpu-serving's own Python language host for the Pulumi engine.
//
// Why it exists: the engine runs a Python program through a "language host" plugin. Upstream's
// host is a separate Go module (…/sdk/python/cmd/pulumi-language-python/v3) that the Go module
// proxy reachable from our machines does not serve, so scripts/bootstrap-pulumi builds this one
// instead. It is written for this project against the public gRPC contract in
// github.com/pulumi/pulumi/sdk/v3/proto/go (LanguageRuntime) and implements what the engine needs
// to preview/update/refresh/destroy a Python program:
//
//   - Run: starts `<python> -u pulumi-language-python-exec …` (the runner script shipped in the
//     sdk/v3 module, installed beside this binary) with the engine/monitor addresses, stack,
//     project and config, and maps its exit status to the engine's RunResponse. The script is run
//     through gpu-serving-pyrun.py (also beside this binary), which runs it exactly as `python
//     SCRIPT` would and then skips the interpreter's teardown of every loaded module (~40-110 ms
//     per run; see that file). GPU_SERVING_PYTHON_FULL_EXIT=1 runs the script directly.
//   - GetPluginInfo, About (the interpreter and its version), GetProgramDependencies (the installed
//     distributions, for `pulumi about`), InstallDependencies (venv + pip install -r
//     requirements.txt), RuntimeOptionsPrompts, Handshake, Cancel.
//
// Not implemented, on purpose: GetRequiredPackages / GetRequiredPlugins. The engine asks them
// before every run to load provider plugins ahead of the program; answering meant scanning the
// venv's packages for `pulumi-plugin.json` (an interpreter start, or a Go re-implementation of
// Python's site and metadata rules), and here the answer is always empty: the program uses only
// dynamic providers, which the engine starts itself. The engine takes `Unimplemented` for both as
// "no plugins known in advance" and loads any provider when the program first registers one of
// its resources (a missing one still fails at once, naming it).
//
// The host exits when the engine that started it is gone (exitWithEngine), and so does the
// program it runs (Pdeathsig) and the dynamic-provider process (gpu-serving-pyrun.py).
//
// Supported runtime options (Pulumi.yaml `runtime.options`): `virtualenv` (a path, relative to the
// project root) and `toolchain: pip` (the default). uv and poetry toolchains are not supported.
// Without `virtualenv`, $PULUMI_PYTHON_CMD or python3 on PATH runs the program.
// `invokeFirst: TOKEN`: as Run starts, before the interpreter does, the host calls the engine's
// resource monitor with an invoke of TOKEN (no arguments; the answer is ignored). gpu-serving names
// a call of the dynamic provider's package: the engine then launches that provider process at
// once, so that its start-up (~0.3-0.6 s: Python, the SDK, grpc) runs beside the program's own
// (the interpreter, the SDK's import, the program's imports) instead of after it
// (docs/benchmarks.md, issue 18). The program makes the same call first thing too
// (components/provider_start.py), for other language hosts; a second one is answered at once.
// `warmStart: MODULE`: the program runs in a copy of the project's warm process, which has
// imported MODULE once (gpu-serving-pyrun.py `--warm`, _gs_warm: the SDK, grpc, the settings
// models, ~0.5 s of every run), when the program directory is the working directory; the first
// run, or one after an edit of a loaded module, runs cold and starts the warm process for the
// next. GPU_SERVING_WARM_START=0 turns it off. The engine passes the same option to the dynamic
// provider's launcher as PULUMI_RUNTIME_WARMSTART.
//
// The engine starts the host as `pulumi-language-python [--logtostderr] [-v=N] [--tracing URL]
// ENGINE_ADDRESS`; the host prints the port it listens on (127.0.0.1) as its first stdout line.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// version is stamped by scripts/bootstrap-pulumi (-X main.version=…).
var version = "0.0.0-dev"

// bailExitCode is the runner script's "an error was already shown to the user" status.
const bailExitCode = 32

// execScriptName is the runner script that must sit beside this binary.
const execScriptName = "pulumi-language-python-exec"

// runnerName is gpu-serving's fast-exit runner, beside this binary (optional).
const runnerName = "gpu-serving-pyrun.py"

// distListScript prints the installed distributions as JSON [{name, version}] (`pulumi about`).
const distListScript = `
import json, importlib.metadata as md
print(json.dumps(sorted(({"name": d.metadata["Name"], "version": d.version} for d in md.distributions()), key=lambda d: d["name"].lower())))
`

// versionScript prints platform.python_version() (on CPython, the first word of sys.version)
// without site-packages or the user's environment (-I -S): half the start-up of a plain run, and
// the CLI asks About in parallel with every preview/update, on the same few cores.
var versionArgs = []string{"-I", "-S", "-c", "import sys; print(sys.version.split()[0])"}

// engineWatchInterval: how often the host checks that the engine is still there.
const engineWatchInterval = 250 * time.Millisecond

type host struct {
	pulumirpc.UnimplementedLanguageRuntimeServer

	mu            sync.Mutex
	engineAddress string
	execScript    string
}

func main() {
	engine, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: %v\n", err)
		os.Exit(2)
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: cannot locate own binary: %v\n", err)
		os.Exit(1)
	}
	if resolved, err := filepath.EvalSymlinks(self); err == nil {
		self = resolved
	}
	h := &host{
		engineAddress: engine,
		execScript:    filepath.Join(filepath.Dir(self), execScriptName),
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: listen: %v\n", err)
		os.Exit(1)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(400 * 1024 * 1024))
	pulumirpc.RegisterLanguageRuntimeServer(srv, h)

	go exitWithEngine(os.Getppid(), engineWatchInterval)
	exitOnInterrupt()

	// The engine reads the port from our first line of output.
	fmt.Printf("%d\n", lis.Addr().(*net.TCPAddr).Port)

	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		fmt.Fprintf(os.Stderr, "pulumi-language-python: serve: %v\n", err)
		os.Exit(1)
	}
}

// exitWithEngine ends the host once the process that started it (the engine) has gone. The engine
// closes its plugins when it ends normally, but a CLI killed by SIGKILL, or by SIGPIPE in
// `pulumi preview | head -3`, closes nothing: the host would serve nobody for ever, parented to
// init, and a scheduled drift check would pile them up. Linux gives an orphan a new parent (init
// or a subreaper), so a changed parent PID is the engine's end. Polling getppid (one cheap
// syscall) rather than PR_SET_PDEATHSIG: that signal follows the engine's *thread* that started
// us, and a Go engine's threads are not the process. The program that Run started is killed with
// us (its Pdeathsig, see command).
func exitWithEngine(engine int, every time.Duration) {
	for range time.Tick(every) {
		if os.Getppid() != engine {
			os.Exit(1)
		}
	}
}

// parseArgs accepts the engine's logging/tracing flags (ignored) and returns the positional
// engine address (optional: absent when the host is attached by port).
func parseArgs(args []string) (string, error) {
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--tracing" || a == "-tracing" || a == "--root" || a == "-root":
			i++ // takes a value
		case strings.HasPrefix(a, "-"):
			// --logtostderr, -v=N, --tracing=URL, --logflow …: nothing to do here.
		default:
			positional = append(positional, a)
		}
	}
	if len(positional) > 1 {
		return "", fmt.Errorf("unexpected arguments %q (want at most ENGINE_ADDRESS)", positional)
	}
	if len(positional) == 1 {
		return positional[0], nil
	}
	return "", nil
}

// ---- where the program's Python comes from --------------------------------------------------

type pythonEnv struct {
	python     string // interpreter to run
	virtualenv string // absolute venv dir, "" when none
}

func optionString(info *pulumirpc.ProgramInfo, key string) string {
	if info == nil || info.GetOptions() == nil {
		return ""
	}
	v, ok := info.GetOptions().AsMap()[key]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// resolvePython finds the interpreter for a program. A configured virtualenv must exist: creating
// it is `pulumi install` (InstallDependencies) or the project's own setup script, never a side
// effect of a preview.
func resolvePython(info *pulumirpc.ProgramInfo) (pythonEnv, error) {
	if tc := optionString(info, "toolchain"); tc != "" && tc != "pip" {
		return pythonEnv{}, fmt.Errorf("runtime option toolchain=%q is not supported by this language host "+
			"(only pip with an optional virtualenv)", tc)
	}
	if venv := venvDir(info); venv != "" {
		py := filepath.Join(venv, "bin", "python")
		if _, err := os.Stat(py); err != nil {
			return pythonEnv{}, fmt.Errorf("the virtualenv %s (Pulumi.yaml runtime.options.virtualenv) has no bin/python; "+
				"create it first: python3 -m venv %s && %s -m pip install -r requirements.txt", venv, venv, py)
		}
		return pythonEnv{python: py, virtualenv: venv}, nil
	}
	cmd := os.Getenv("PULUMI_PYTHON_CMD")
	if cmd == "" {
		cmd = "python3"
	}
	py, err := exec.LookPath(cmd)
	if err != nil {
		return pythonEnv{}, fmt.Errorf("no Python interpreter: %q not found on PATH (set PULUMI_PYTHON_CMD "+
			"or runtime.options.virtualenv in Pulumi.yaml)", cmd)
	}
	return pythonEnv{python: py}, nil
}

// venvDir is the absolute virtualenv directory named by the runtime options, or "".
func venvDir(info *pulumirpc.ProgramInfo) string {
	venv := optionString(info, "virtualenv")
	if venv == "" {
		return ""
	}
	if !filepath.IsAbs(venv) {
		venv = filepath.Join(info.GetRootDirectory(), venv)
	}
	return filepath.Clean(venv)
}

// environ is the environment for a child Python process, with extra KEY=VALUE entries last.
func (p pythonEnv) environ(extra ...string) []string {
	env := make([]string, 0, len(os.Environ())+len(extra)+2)
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if p.virtualenv != "" && (k == "PYTHONHOME" || k == "PATH" || k == "VIRTUAL_ENV") {
			continue
		}
		env = append(env, kv)
	}
	if p.virtualenv != "" {
		env = append(env,
			"VIRTUAL_ENV="+p.virtualenv,
			"PATH="+filepath.Join(p.virtualenv, "bin")+string(os.PathListSeparator)+os.Getenv("PATH"))
	}
	return append(env, extra...)
}

// command builds a child process that dies with this host (the engine may kill us abruptly).
func (p pythonEnv) command(ctx context.Context, dir string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, p.python, args...)
	cmd.Dir = dir
	cmd.Env = p.environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// runScript runs an inline Python script and returns its stdout.
func (p pythonEnv) runScript(ctx context.Context, dir, script string) ([]byte, error) {
	cmd := p.command(ctx, dir, "-c", script)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s -c <script>: %w: %s", p.python, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func programDir(info *pulumirpc.ProgramInfo, fallback string) string {
	if d := info.GetProgramDirectory(); d != "" {
		return d
	}
	if fallback != "" {
		return fallback
	}
	return "."
}

// ---- LanguageRuntime ---------------------------------------------------------------------------

func (h *host) Handshake(_ context.Context, req *pulumirpc.LanguageHandshakeRequest,
) (*pulumirpc.LanguageHandshakeResponse, error) {
	h.mu.Lock()
	h.engineAddress = req.GetEngineAddress()
	h.mu.Unlock()
	return &pulumirpc.LanguageHandshakeResponse{}, nil
}

// invokeFirst asks the engine's resource monitor, in the background, for an invoke of tok (see
// the runtime option of that name). Its answer, a refusal included, is of no interest: the call is
// made for what the engine does to serve it. It ends with the program's run (ctx).
func invokeFirst(ctx context.Context, monitor, tok string) {
	go func() {
		conn, err := grpc.NewClient(monitor, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = pulumirpc.NewResourceMonitorClient(conn).Invoke(ctx, &pulumirpc.ResourceInvokeRequest{Tok: tok})
	}()
}

func (h *host) GetPluginInfo(context.Context, *emptypb.Empty) (*pulumirpc.PluginInfo, error) {
	return &pulumirpc.PluginInfo{Version: version}, nil
}

func (h *host) Run(ctx context.Context, req *pulumirpc.RunRequest) (*pulumirpc.RunResponse, error) {
	info := req.GetInfo()
	py, err := resolvePython(info)
	if err != nil {
		return &pulumirpc.RunResponse{Error: err.Error()}, nil
	}
	if _, err := os.Stat(h.execScript); err != nil {
		return &pulumirpc.RunResponse{Error: fmt.Sprintf(
			"missing executor %s: it must be installed beside pulumi-language-python (scripts/bootstrap-pulumi)",
			h.execScript)}, nil
	}

	pwd := req.GetPwd()
	if pwd == "" {
		pwd = programDir(info, "")
	}
	program := req.GetProgram()
	if info != nil && info.GetProgramDirectory() != "" {
		entry := info.GetEntryPoint()
		if entry == "" {
			entry = "."
		}
		program = filepath.Join(info.GetProgramDirectory(), entry)
	}
	if program == "" {
		program = "."
	}

	h.mu.Lock()
	engine := h.engineAddress
	h.mu.Unlock()

	if tok := optionString(info, "invokeFirst"); tok != "" && req.GetMonitorAddress() != "" {
		invokeFirst(ctx, req.GetMonitorAddress(), tok)
	}

	args := []string{"-u"}
	// The exec script as `python -u SCRIPT …` runs it, ending without the interpreter's teardown
	// (gpu-serving-pyrun.py); run directly when the runner is missing or not wanted.
	if runner := filepath.Join(filepath.Dir(h.execScript), runnerName); os.Getenv("GPU_SERVING_PYTHON_FULL_EXIT") == "" &&
		fileExists(runner) {
		args = append(args, runner)
		// `warmStart: MODULE`: the runner asks the project's warm process (MODULE loaded once)
		// for a copy to run the program in (gpu-serving-pyrun.py, _gs_warm). Only when the
		// program is the working directory's: the warm process loaded MODULE from there.
		if module := optionString(info, "warmStart"); module != "" && filepath.Clean(program) == filepath.Clean(pwd) {
			args = append(args, "--warm", module)
		}
		args = append(args, "--script")
	}
	args = append(args, h.execScript,
		"--monitor", req.GetMonitorAddress(),
		"--engine", engine,
		"--project", req.GetProject(),
		"--stack", req.GetStack(),
		"--pwd", pwd,
		"--dry_run", strconv.FormatBool(req.GetDryRun()),
		"--parallel", strconv.Itoa(int(req.GetParallel())),
	)
	if org := req.GetOrganization(); org != "" {
		args = append(args, "--organization", org)
	}
	if root := info.GetRootDirectory(); root != "" {
		args = append(args, "--root_directory", root)
	}
	args = append(args, program)
	args = append(args, req.GetArgs()...)

	config := req.GetConfig()
	if config == nil {
		config = map[string]string{} // the runner expects a JSON object, never null
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return nil, err
	}
	secretKeys := req.GetConfigSecretKeys()
	if secretKeys == nil {
		secretKeys = []string{}
	}
	secretJSON, err := json.Marshal(secretKeys)
	if err != nil {
		return nil, err
	}

	cmd := py.command(ctx, pwd, args...)
	cmd.Env = py.environ(
		"PULUMI_CONFIG="+string(configJSON),
		"PULUMI_CONFIG_SECRET_KEYS="+string(secretJSON),
	)
	// The engine shows what the program prints as diagnostics.
	cmd.Stdout = os.Stdout
	cmd.Stderr = os.Stderr

	err = cmd.Run()
	var exitErr *exec.ExitError
	switch {
	case err == nil:
		return &pulumirpc.RunResponse{}, nil
	case errors.As(err, &exitErr):
		code := exitErr.ExitCode()
		if code == bailExitCode {
			return &pulumirpc.RunResponse{Bail: true}, nil
		}
		if code < 0 {
			return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program was terminated: %v", exitErr)}, nil
		}
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Program exited with non-zero exit code: %d", code)}, nil
	default:
		return &pulumirpc.RunResponse{Error: fmt.Sprintf("Problem executing program (could not run %s): %v",
			py.python, err)}, nil
	}
}

func (h *host) About(ctx context.Context, req *pulumirpc.AboutRequest) (*pulumirpc.AboutResponse, error) {
	py, err := resolvePython(req.GetInfo())
	if err != nil {
		return nil, err
	}
	cmd := py.command(ctx, programDir(req.GetInfo(), ""), versionArgs...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", py.python, strings.Join(versionArgs, " "), err,
			strings.TrimSpace(stderr.String()))
	}
	meta := map[string]string{"host": "gpu-serving pulumi-language-python"}
	if py.virtualenv != "" {
		meta["virtualenv"] = py.virtualenv
	}
	return &pulumirpc.AboutResponse{
		Executable: py.python,
		Version:    strings.TrimSpace(string(out)),
		Metadata:   meta,
	}, nil
}

func (h *host) GetProgramDependencies(ctx context.Context, req *pulumirpc.GetProgramDependenciesRequest,
) (*pulumirpc.GetProgramDependenciesResponse, error) {
	py, err := resolvePython(req.GetInfo())
	if err != nil {
		return nil, err
	}
	out, err := py.runScript(ctx, programDir(req.GetInfo(), req.GetPwd()), distListScript)
	if err != nil {
		return nil, err
	}
	var dists []struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	}
	if err := json.Unmarshal(out, &dists); err != nil {
		return nil, fmt.Errorf("listing installed packages: bad output %q: %w", out, err)
	}
	resp := &pulumirpc.GetProgramDependenciesResponse{}
	for _, d := range dists {
		resp.Dependencies = append(resp.Dependencies, &pulumirpc.DependencyInfo{Name: d.Name, Version: d.Version})
	}
	return resp, nil
}

// streamWriter forwards a child's output to an InstallDependencies stream.
type streamWriter struct {
	mu     *sync.Mutex
	send   func(*pulumirpc.InstallDependenciesResponse) error
	stderr bool
}

func (w streamWriter) Write(p []byte) (int, error) {
	chunk := append([]byte(nil), p...)
	msg := &pulumirpc.InstallDependenciesResponse{Stdout: chunk}
	if w.stderr {
		msg = &pulumirpc.InstallDependenciesResponse{Stderr: chunk}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.send(msg); err != nil {
		return 0, err
	}
	return len(p), nil
}

// InstallDependencies creates the configured virtualenv when missing and installs
// requirements.txt into it (`pulumi install`, `pulumi new`).
func (h *host) InstallDependencies(req *pulumirpc.InstallDependenciesRequest,
	stream grpc.ServerStreamingServer[pulumirpc.InstallDependenciesResponse],
) error {
	ctx := stream.Context()
	info := req.GetInfo()
	dir := req.GetDirectory()
	if dir == "" {
		dir = programDir(info, "")
	}
	var mu sync.Mutex
	stdout := streamWriter{mu: &mu, send: stream.Send}
	stderr := streamWriter{mu: &mu, send: stream.Send, stderr: true}

	run := func(name string, args ...string) error {
		fmt.Fprintf(stdout, "$ %s %s\n", name, strings.Join(args, " "))
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir = dir
		cmd.Stdout, cmd.Stderr = stdout, stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
		}
		return nil
	}

	py := pythonEnv{}
	if venv := venvDir(info); venv != "" {
		vpy := filepath.Join(venv, "bin", "python")
		if _, err := os.Stat(vpy); err != nil {
			base := os.Getenv("PULUMI_PYTHON_CMD")
			if base == "" {
				base = "python3"
			}
			if err := run(base, "-m", "venv", venv); err != nil {
				return err
			}
		}
		py = pythonEnv{python: vpy, virtualenv: venv}
	} else {
		var err error
		if py, err = resolvePython(info); err != nil {
			return err
		}
	}
	reqs := filepath.Join(dir, "requirements.txt")
	if _, err := os.Stat(reqs); err != nil {
		fmt.Fprintf(stdout, "no requirements.txt in %s: nothing to install\n", dir)
		return nil
	}
	return run(py.python, "-m", "pip", "install", "-r", reqs)
}

func (h *host) RuntimeOptionsPrompts(context.Context, *pulumirpc.RuntimeOptionsRequest,
) (*pulumirpc.RuntimeOptionsResponse, error) {
	return &pulumirpc.RuntimeOptionsResponse{}, nil
}

func (h *host) Cancel(context.Context, *emptypb.Empty) (*emptypb.Empty, error) {
	// Running programs are children of Run's context and stop with it.
	return &emptypb.Empty{}, nil
}

// RunPlugin would run a provider written in Python from source; this project has none.
func (h *host) RunPlugin(*pulumirpc.RunPluginRequest, grpc.ServerStreamingServer[pulumirpc.RunPluginResponse]) error {
	return status.Error(codes.Unimplemented, "RunPlugin is not supported by gpu-serving's pulumi-language-python")
}

var _ io.Writer = streamWriter{}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// exitOnInterrupt: the engine stops a plugin with SIGINT to its process group, and with SIGKILL
// 5 s later if it is still there. Go keeps SIGINT ignored in a process started with it ignored (a
// `pulumi` command run with `&` from a script, or under nohup), and every stop of this host then
// waited the whole 5 s (once per command, before the program ran). SIGINT ends it here whatever it
// was started with, as it does by default (exit status 130, the shell's for SIGINT).
func exitOnInterrupt() {
	interrupts := make(chan os.Signal, 1)
	signal.Notify(interrupts, os.Interrupt)
	go func() {
		<-interrupts
		os.Exit(130)
	}()
}
