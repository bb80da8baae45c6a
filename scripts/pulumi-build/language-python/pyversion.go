package main

// pyversion.go: the interpreter's version for About, without starting Python on every run.
//
// Why: the CLI calls About at the start of every preview/update (for the update's metadata), in a
// language host of its own. `python -c "import platform; print(platform.python_version())"` costs
// ~25 ms of a CPU the CLI is using at the same time (2-core machines). The answer only changes
// when the interpreter binary does, so it is cached per binary: the key is the real path of the
// executable (venv/bin/python resolves to the base interpreter) with its size, mtime, ctime and
// inode, so an upgrade or reinstall in place is a miss. Only ELF binaries are cached: a script
// (a pyenv shim, a wrapper) may pick a different interpreter on each run, so it is always asked.
// pyvenv.cfg's `version` is not used: it is written once at venv creation and goes stale when
// the base interpreter is upgraded under the venv.
//
// The cache is a small JSON file in the user's cache directory ($XDG_CACHE_HOME or ~/.cache),
// gpu-serving/pulumi-language-python/python-versions.json, replaced atomically. Any problem with
// it (unwritable, corrupt) just means asking Python, as before.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

const versionCacheMax = 64

const versionScript = "import platform; print(platform.python_version())"

func versionCachePath() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "gpu-serving", "pulumi-language-python", "python-versions.json")
}

// interpreterKey identifies the interpreter binary behind python; ok=false when it must not be
// cached (not found, not an ELF executable).
func interpreterKey(python string) (string, bool) {
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return "", false
	}
	f, err := os.Open(real)
	if err != nil {
		return "", false
	}
	defer f.Close()
	magic := make([]byte, 4)
	if n, _ := f.Read(magic); n != 4 || string(magic) != "\x7fELF" {
		return "", false
	}
	st, err := f.Stat()
	if err != nil {
		return "", false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	return fmt.Sprintf("%s|size=%d|mtime=%d.%09d|ctime=%d.%09d|ino=%d|dev=%d", real, st.Size(),
		sys.Mtim.Sec, sys.Mtim.Nsec, sys.Ctim.Sec, sys.Ctim.Nsec, sys.Ino, sys.Dev), true
}

func readVersionCache(path string) map[string]string {
	m := map[string]string{}
	if raw, err := os.ReadFile(path); err == nil {
		if json.Unmarshal(raw, &m) != nil {
			return map[string]string{}
		}
	}
	return m
}

func writeVersionCache(path string, m map[string]string) {
	if len(m) > versionCacheMax { // keys of interpreters long gone: start over
		m = map[string]string{}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".python-versions-*.json")
	if err != nil {
		return
	}
	_, werr := tmp.Write(raw)
	cerr := tmp.Close()
	if werr != nil || cerr != nil || os.Rename(tmp.Name(), path) != nil {
		os.Remove(tmp.Name())
	}
}

// version is platform.python_version() of the interpreter, cached per interpreter binary.
func (p pythonEnv) version(ctx context.Context, dir string) (string, error) {
	key, cacheable := interpreterKey(p.python)
	cachePath := versionCachePath()
	if cacheable && cachePath != "" {
		if v, ok := readVersionCache(cachePath)[key]; ok && v != "" {
			return v, nil
		}
	}
	out, err := p.runScript(ctx, dir, versionScript)
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(out))
	if cacheable && cachePath != "" && v != "" {
		m := readVersionCache(cachePath)
		m[key] = v
		writeVersionCache(cachePath, m)
	}
	return v, nil
}
