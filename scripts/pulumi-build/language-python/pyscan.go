package main

// pyscan.go: the program's installed Python packages, read from the virtualenv's files in Go.
//
// Why: the engine asks GetRequiredPackages on every preview/update/refresh/destroy before it runs
// the program, and `pulumi about` asks GetProgramDependencies. Answering with a Python script
// (pluginScanScript, distListScript) costs an interpreter start plus importlib.metadata: ~80 ms
// on the critical path of every run. The answer is only a function of files (pyvenv.cfg, the
// site-packages listing, .pth files, *.dist-info/RECORD, METADATA, pulumi-plugin.json), so we
// read them here.
//
// The rule: same results as the Python script, or no Go answer. This file reproduces what
// `<venv>/bin/python -c SCRIPT` does, step by step, for the case it models exactly: a plain
// virtualenv (include-system-site-packages = false) on CPython, as site.py, getpath and
// importlib.metadata (CPython 3.10-3.13) build sys.path and discover distributions. Whenever it meets
// something it does not model (no virtualenv, system site packages, a sitecustomize module, a
// .pth line that runs unknown code, a zip on sys.path, a RECORD Python's csv module would read
// differently, non-UTF-8 metadata, ...), it returns an *unsupportedError and the caller runs the
// Python script as before, so the result (or the error) is Python's own.
// tests/integration/test_language_host.py compares both answers on real and fake virtualenvs.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"unicode/utf8"
)

// unsupportedError: the Go scan does not model this environment exactly; ask Python instead.
type unsupportedError struct{ reason string }

func (e *unsupportedError) Error() string {
	return "the Go package scan does not model this environment: " + e.reason
}

func unsupported(format string, args ...any) error {
	return &unsupportedError{reason: fmt.Sprintf(format, args...)}
}

// pathEntry is one sys.path entry: the string Python holds (only its basename matters, to
// importlib.metadata) and the directory it names.
type pathEntry struct {
	root string
	dir  string
}

var (
	pyVersionRE = regexp.MustCompile(`^\s*(\d+)\.(\d+)`)
	pythonExeRE = regexp.MustCompile(`^python(\d+\.\d+)`)
)

const minPythonMinor, maxPythonMinor = 10, 13

// pyLayout is what the scan needs to know about the venv's interpreter.
type pyLayout struct {
	entries []pathEntry // sys.path
	minor   int         // 3.<minor>
}

// venvSysPath is the sys.path of `<venv>/bin/python -c …` started in cwd with this process's
// environment (as pythonEnv.environ passes it on: PYTHONHOME removed).
func venvSysPath(venv, cwd string) (*pyLayout, error) {
	if venv == "" {
		return nil, unsupported("no virtualenv (the interpreter's own sys.path is not modelled)")
	}
	// getpath and site.venv() take pyvenv.cfg from beside the executable first, then one level up.
	if fileExists(filepath.Join(venv, "bin", "pyvenv.cfg")) {
		return nil, unsupported("%s/bin/pyvenv.cfg", venv)
	}
	raw, err := os.ReadFile(filepath.Join(venv, "pyvenv.cfg"))
	if err != nil {
		return nil, unsupported("reading pyvenv.cfg: %v", err)
	}
	if !utf8.Valid(raw) {
		return nil, unsupported("pyvenv.cfg is not UTF-8")
	}
	cfg := map[string]string{}
	for _, line := range splitUniversal(string(raw)) {
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		key = strings.ToLower(strings.TrimSpace(key))
		if _, dup := cfg[key]; dup && key == "home" {
			return nil, unsupported("pyvenv.cfg names home twice") // getpath takes the first, site.py the last
		}
		cfg[key] = strings.TrimSpace(value)
	}
	// site.venv(): anything but "true" isolates the venv; a missing key means "true".
	if v, ok := cfg["include-system-site-packages"]; !ok || strings.ToLower(v) == "true" {
		return nil, unsupported("include-system-site-packages is not false")
	}
	home := cfg["home"]
	if home == "" || !filepath.IsAbs(home) {
		return nil, unsupported("pyvenv.cfg has no absolute home")
	}
	verText := cfg["version_info"] // uv, virtualenv
	if verText == "" {
		verText = cfg["version"] // python -m venv
	}
	m := pyVersionRE.FindStringSubmatch(verText)
	if m == nil {
		return nil, unsupported("pyvenv.cfg has no version")
	}
	xy := m[1] + "." + m[2]
	minor, _ := strconv.Atoi(m[2])
	// The versions whose site.py / importlib.metadata this file follows (checked against each by
	// tests/integration/test_language_host.py); 3.8/3.9 list distributions in another order.
	if m[1] != "3" || minor < minPythonMinor || minor > maxPythonMinor {
		return nil, unsupported("Python %s", xy)
	}
	// The interpreter the venv runs must be that version (a base replaced under the venv is not).
	if real, err := filepath.EvalSymlinks(filepath.Join(venv, "bin", "python")); err == nil {
		if bm := pythonExeRE.FindStringSubmatch(filepath.Base(real)); bm != nil && bm[1] != xy {
			return nil, unsupported("bin/python is %s but pyvenv.cfg says %s", filepath.Base(real), xy)
		}
	}
	for _, k := range []string{"PYTHONPLATLIBDIR", "PYTHONEXECUTABLE"} {
		if os.Getenv(k) != "" {
			return nil, unsupported("%s is set", k)
		}
	}
	if fileExists(filepath.Join(home, "pybuilddir.txt")) {
		return nil, unsupported("home is a CPython build tree")
	}
	// getpath: prefix and exec_prefix are found by searching up from home for the stdlib landmarks
	// (platlibdir "lib": a Python built with lib64 has no lib/pythonX.Y/os.py and is not modelled).
	stdlib := "lib/python" + xy
	prefix := searchUp(home, stdlib+"/os.py", stdlib+"/os.pyc")
	execPrefix := searchUp(home, stdlib+"/lib-dynload")
	if prefix == "" || execPrefix == "" {
		return nil, unsupported("no %s under %s", stdlib, home)
	}

	// getcwd() is the physical directory: relative entries are made absolute against it.
	physCwd, err := filepath.EvalSymlinks(cwd)
	if err != nil {
		return nil, unsupported("working directory %s: %v", cwd, err)
	}
	abspath := func(p string) string {
		if !filepath.IsAbs(p) {
			p = physCwd + "/" + p
		}
		return filepath.Clean(p) // os.path.abspath: lexical, like posixpath.normpath
	}

	// The interpreter's path: PYTHONPATH, then the stdlib zip, the stdlib, lib-dynload.
	var initial []string
	if pp := os.Getenv("PYTHONPATH"); pp != "" {
		initial = append(initial, strings.Split(pp, string(os.PathListSeparator))...)
	}
	initial = append(initial,
		prefix+"/lib/python"+m[1]+m[2]+".zip",
		prefix+"/"+stdlib,
		execPrefix+"/"+stdlib+"/lib-dynload")
	// site.removeduppaths(): absolute, first occurrence wins.
	known := map[string]bool{}
	var paths []string
	add := func(p string) {
		if !known[p] {
			known[p] = true
			paths = append(paths, p)
		}
	}
	for _, p := range initial {
		add(abspath(p))
	}
	// site.venv() -> addsitepackages([venv]) -> addsitedir(venv/lib/pythonX.Y/site-packages).
	site := abspath(filepath.Join(venv, stdlib, "site-packages"))
	if st, err := os.Stat(site); err == nil && st.IsDir() {
		add(site)
		if err := addPthFiles(site, minor, add, abspath); err != nil {
			return nil, err
		}
	}

	entries := make([]pathEntry, 0, len(paths)+1)
	// sys.path[0] for `-c` is "" (the working directory), unless PYTHONSAFEPATH is set.
	if os.Getenv("PYTHONSAFEPATH") == "" {
		entries = append(entries, pathEntry{root: "", dir: physCwd})
	}
	for _, p := range paths {
		entries = append(entries, pathEntry{root: p, dir: p})
	}
	return &pyLayout{entries: entries, minor: minor}, nil
}

// safePthImport matches the `import` lines of .pth files whose code adds no sys.path entry and
// no distribution finder: setuptools' distutils shim, virtualenv's patch, setuptools' editable
// finders (their find_spec-only finder and a path-hook placeholder entry that names no directory).
var safePthImport = []*regexp.Regexp{
	regexp.MustCompile(`^import os; var = 'SETUPTOOLS_USE_DISTUTILS'; enabled = os\.environ\.get\(var, 'local'\) == 'local'; enabled and __import__\('_distutils_hack'\)\.add_shim\(\); *$`),
	regexp.MustCompile(`^import _virtualenv\s*$`),
	regexp.MustCompile(`^import (__editable___[A-Za-z0-9_]+_finder); ([A-Za-z0-9_]+)\.install\(\)\s*$`),
}

// addPthFiles is site.addsitedir's .pth processing (site.addpackage) for one site directory.
func addPthFiles(site string, minor int, add func(string), abspath func(string) string) error {
	names, err := readDirNames(site)
	if err != nil {
		return nil // site.addsitedir: os.listdir failed -> no .pth files
	}
	var pth []string
	for _, n := range names {
		if strings.HasSuffix(n, ".pth") && !(minor >= 13 && strings.HasPrefix(n, ".")) { // 3.13 skips hidden ones
			pth = append(pth, n)
		}
	}
	sort.Strings(pth) // sorted(): code point order == UTF-8 byte order
	for _, n := range pth {
		raw, err := os.ReadFile(filepath.Join(site, n))
		if err != nil {
			continue // site.addpackage: OSError on open -> skipped
		}
		for _, b := range raw {
			if b >= 0x80 {
				return unsupported("%s is not ASCII (decoded with the locale encoding)", n)
			}
		}
		for _, line := range splitUniversal(string(raw)) {
			if strings.HasPrefix(line, "#") {
				continue
			}
			for _, c := range line {
				if c < 0x20 && c != '\t' {
					return unsupported("%s has control characters", n)
				}
			}
			if strings.TrimSpace(line) == "" {
				continue
			}
			if strings.HasPrefix(line, "import ") || strings.HasPrefix(line, "import\t") {
				ok := false
				for _, re := range safePthImport {
					if m := re.FindStringSubmatch(line); m != nil && (len(m) < 3 || m[1] == m[2]) {
						ok = true
						break
					}
				}
				if !ok {
					return unsupported("%s runs code: %q", n, line)
				}
				continue
			}
			dir := strings.TrimRight(line, " \t")
			if !filepath.IsAbs(dir) {
				dir = site + "/" + dir
			}
			dir = abspath(dir)
			if _, err := os.Stat(dir); err == nil {
				add(dir) // no-op when already known
			}
		}
	}
	return nil
}

// splitUniversal splits text read in Python's text mode (universal newlines) into lines.
func splitUniversal(s string) []string {
	if strings.IndexByte(s, '\r') >= 0 {
		s = strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
	}
	lines := strings.Split(s, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	return lines
}

func searchUp(dir string, landmarks ...string) string {
	dir = filepath.Clean(dir)
	for {
		for _, l := range landmarks {
			if _, err := os.Stat(filepath.Join(dir, l)); err == nil {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// readDirNames lists a directory in the order the kernel returns entries, as os.listdir does
// (importlib.metadata keeps that order, so the plugin list's order matches Python's).
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// ---- importlib.metadata ---------------------------------------------------------------------

// distribution is a PathDistribution: a *.dist-info / *.egg-info directory (or egg-info file).
type distribution struct {
	path   string // absolute
	parent string // the sys.path directory it was found in (locate_file's base)
}

var nameRunRE = regexp.MustCompile(`[-_.]+`)

// distributions is importlib.metadata.distributions(): for each sys.path entry in order, the
// *.dist-info and *.egg-info children grouped by normalized name (first-seen group order), then
// the EGG-INFO of an entry that is itself an .egg.
func distributions(entries []pathEntry) ([]distribution, error) {
	var out []distribution
	for _, e := range entries {
		st, err := os.Stat(e.dir)
		if err != nil {
			continue // FastPath.children(): listdir and zip both fail -> nothing
		}
		if !st.IsDir() {
			return nil, unsupported("sys.path entry %s is a file (a zip archive?)", e.dir)
		}
		names, err := readDirNames(e.dir)
		if err != nil {
			continue
		}
		base := asciiLower(filepath.Base(e.root))
		if e.root == "" {
			base = ""
		}
		var order []string
		groups := map[string][]string{}
		var eggs []string
		for _, child := range names {
			if strings.HasPrefix(child, "sitecustomize") &&
				(child == "sitecustomize" || strings.HasPrefix(child, "sitecustomize.")) &&
				!(child == "sitecustomize.py" && harmlessSitecustomize(e.dir+"/"+child)) {
				return nil, unsupported("%s/%s runs at interpreter start", e.dir, child)
			}
			if !isASCII(child) {
				if strings.Contains(strings.ToLower(child), "-info") || strings.Contains(strings.ToLower(child), "egg") {
					return nil, unsupported("non-ASCII metadata directory name %q", child)
				}
				continue
			}
			low := asciiLower(child)
			if strings.HasSuffix(low, ".dist-info") || strings.HasSuffix(low, ".egg-info") {
				name := low[:strings.LastIndex(low, ".")]
				name, _, _ = strings.Cut(name, "-")
				norm := nameRunRE.ReplaceAllString(name, "_")
				if _, seen := groups[norm]; !seen {
					order = append(order, norm)
				}
				groups[norm] = append(groups[norm], child)
			} else if strings.HasSuffix(base, ".egg") && low == "egg-info" {
				eggs = append(eggs, child)
			}
		}
		for _, norm := range order {
			for _, child := range groups[norm] {
				out = append(out, distribution{path: e.dir + "/" + child, parent: e.dir})
			}
		}
		for _, child := range eggs {
			out = append(out, distribution{path: e.dir + "/" + child, parent: e.dir})
		}
	}
	return out, nil
}

// debianSitecustomize is Debian's and Ubuntu's /etc/python3.X/sitecustomize.py (linked into the
// system stdlib, so on sys.path of every venv made from /usr/bin/python3): it installs apport's
// exception hook, if apport is there, and touches neither sys.path nor the import system.
const debianSitecustomize = `# install the apport exception handler if available
try:
    import apport_python_hook
except ImportError:
    pass
else:
    apport_python_hook.install()
`

func harmlessSitecustomize(path string) bool {
	raw, err := os.ReadFile(path)
	return err == nil && strings.TrimSpace(string(raw)) == strings.TrimSpace(debianSitecustomize)
}

// readText is PathDistribution.read_text(name): the file's text, or ok=false for the errors
// Python suppresses (missing, a directory, not a directory, no permission). Text is decoded as
// strict UTF-8 with universal newlines; a decode error is an exception in Python: unsupported.
func (d distribution) readText(name string) (text string, ok bool, err error) {
	p := d.path
	if name != "" {
		p += "/" + name
	}
	raw, err := os.ReadFile(p)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.EISDIR) || errors.Is(err, syscall.ENOTDIR) ||
			errors.Is(err, fs.ErrPermission) {
			return "", false, nil
		}
		return "", false, unsupported("reading %s: %v", p, err)
	}
	if !utf8.Valid(raw) {
		return "", false, unsupported("%s is not UTF-8", p)
	}
	s := string(raw)
	if strings.IndexByte(s, '\r') >= 0 {
		s = strings.ReplaceAll(strings.ReplaceAll(s, "\r\n", "\n"), "\r", "\n")
	}
	return s, true, nil
}

// header is one metadata field: present=false is Python's None.
type header struct {
	value   string
	present bool
}

// metadata returns the Name and Version fields of Distribution.metadata (METADATA, else PKG-INFO,
// else the egg-info file itself, parsed by the email package with the compat32 policy).
func (d distribution) metadata() (name, version header, err error) {
	var text string
	var ok bool
	for _, f := range []string{"METADATA", "PKG-INFO", ""} {
		if text, ok, err = d.readText(f); err != nil {
			return header{}, header{}, err
		}
		if ok && text != "" {
			break
		}
	}
	if !ok {
		return header{}, header{}, unsupported("%s has no metadata", d.path) // Python: TypeError
	}
	lines := strings.Split(text, "\n")
	var last *header // the field the previous line started, when it is one we return
	for _, line := range lines {
		if line == "" {
			break // end of the header block
		}
		switch {
		case line[0] == ' ' || line[0] == '\t':
			if last != nil {
				return header{}, header{}, unsupported("%s: folded Name/Version field", d.path)
			}
			continue
		case strings.HasPrefix(line, "From "):
			return header{}, header{}, unsupported("%s: envelope line", d.path)
		}
		colon := strings.IndexByte(line, ':')
		if colon < 0 || strings.IndexFunc(line[:colon], func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			break // not a header line: the body starts here (MissingHeaderBodySeparatorDefect)
		}
		last = nil
		if colon == 0 {
			continue // "Missing header name": ignored
		}
		key := strings.ToLower(line[:colon])
		value := strings.TrimLeft(line[colon+1:], " \t")
		switch {
		case key == "name" && !name.present:
			name = header{value: value, present: true}
			last = &name
		case key == "version" && !version.present:
			version = header{value: value, present: true}
			last = &version
		}
	}
	return name, version, nil
}

// pluginFiles is `[f for f in dist.files or [] if f.name == "pulumi-plugin.json"]`:
// Distribution.files is the first column of RECORD (else of SOURCES.txt, each line quoted as
// importlib.metadata does), parsed as csv.reader does; every line is checked, because a line
// Python cannot turn into a file entry makes the whole script fail.
func (d distribution) pluginFiles(minor int) ([]string, error) {
	text, ok, err := d.readText("RECORD")
	if err != nil {
		return nil, err
	}
	quote := false
	if !ok || text == "" {
		if minor >= 12 { // 3.12 reads an egg-info's installed-files.txt next, resolving each path
			if _, ok, err := d.readText("installed-files.txt"); err != nil || ok {
				return nil, unsupported("%s/installed-files.txt", d.path)
			}
		}
		if text, ok, err = d.readText("SOURCES.txt"); err != nil {
			return nil, err
		}
		if !ok {
			return nil, nil
		}
		quote = true
	}
	if hasSpecialLineChars(text) {
		return nil, unsupported("%s: characters str.splitlines/csv treat specially", d.path)
	}
	var out []string
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		var first string
		if !quote && line != "" && strings.IndexByte(line, '"') < 0 {
			// The common case, without allocating: "path[,hash[,size]]".
			f0, rest, more := strings.Cut(line, ",")
			size := ""
			if more {
				var hasSize bool
				if _, size, hasSize = strings.Cut(rest, ","); hasSize && strings.IndexByte(size, ',') >= 0 {
					return nil, unsupported("%s: a line with more than 3 fields", d.path) // Python: TypeError
				}
			}
			if len(f0) > csvFieldLimit || len(rest) > csvFieldLimit {
				return nil, unsupported("%s: field larger than csv.field_size_limit()", d.path)
			}
			if size != "" {
				if _, err := strconv.Atoi(strings.TrimSpace(size)); err != nil {
					return nil, unsupported("%s: size %q", d.path, size)
				}
			}
			first = f0
		} else {
			if quote {
				line = `"` + line + `"`
			}
			fields, err := csvLine(line)
			if err != nil {
				return nil, unsupported("%s: %v", d.path, err)
			}
			if len(fields) < 1 || len(fields) > 3 {
				return nil, unsupported("%s: a line with %d fields", d.path, len(fields)) // Python: TypeError
			}
			if len(fields) == 3 && fields[2] != "" {
				if _, err := strconv.Atoi(strings.TrimSpace(fields[2])); err != nil {
					return nil, unsupported("%s: size %q", d.path, fields[2])
				}
			}
			first = fields[0]
		}
		if strings.Contains(first, "pulumi-plugin.json") {
			if parts := posixParts(first); len(parts) > 0 && parts[len(parts)-1] == "pulumi-plugin.json" {
				out = append(out, first)
			}
		}
	}
	return out, nil
}

// hasSpecialLineChars: characters str.splitlines() also breaks lines at (\v \f \x1c-\x1e \x85
// \u2028 \u2029), or that csv refuses (NUL).
func hasSpecialLineChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 0 || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e):
			return true
		case c == 0xc2 && i+1 < len(s) && s[i+1] == 0x85:
			return true
		case c == 0xe2 && i+2 < len(s) && s[i+1] == 0x80 && (s[i+2] == 0xa8 || s[i+2] == 0xa9):
			return true
		}
	}
	return false
}

const csvFieldLimit = 131072 // csv.field_size_limit()

// csvLine parses one line as Python's csv.reader (excel dialect, strict=False) does; an error
// when the line would not parse the same way on its own (an open quote continues on the next line).
func csvLine(line string) ([]string, error) {
	const (
		startField = iota
		inField
		inQuoted
		quoteInQuoted
	)
	var fields []string
	var cur strings.Builder
	state := startField
	if line == "" {
		return nil, nil // an empty row
	}
	if strings.IndexByte(line, '"') < 0 { // no quoting: the state machine below splits on commas
		fields = strings.Split(line, ",")
		for _, f := range fields {
			if len(f) > csvFieldLimit {
				return nil, errors.New("field larger than csv.field_size_limit()")
			}
		}
		return fields, nil
	}
	for _, c := range line {
		if cur.Len() >= csvFieldLimit {
			return nil, errors.New("field larger than csv.field_size_limit()")
		}
		switch state {
		case startField:
			switch c {
			case '"':
				state = inQuoted
			case ',':
				fields = append(fields, "")
			default:
				cur.WriteRune(c)
				state = inField
			}
		case inField:
			if c == ',' {
				fields = append(fields, cur.String())
				cur.Reset()
				state = startField
			} else {
				cur.WriteRune(c)
			}
		case inQuoted:
			if c == '"' {
				state = quoteInQuoted
			} else {
				cur.WriteRune(c)
			}
		case quoteInQuoted:
			switch c {
			case '"':
				cur.WriteRune('"')
				state = inQuoted
			case ',':
				fields = append(fields, cur.String())
				cur.Reset()
				state = startField
			default:
				cur.WriteRune(c)
				state = inField
			}
		}
	}
	if state == inQuoted {
		return nil, errors.New("a quoted field continues past the end of the line")
	}
	return append(fields, cur.String()), nil
}

// posixParts is PurePosixPath(p).parts without the anchor: "" and "." components dropped.
func posixParts(p string) []string {
	var parts []string
	for _, s := range strings.Split(p, "/") {
		if s != "" && s != "." {
			parts = append(parts, s)
		}
	}
	return parts
}

// locate is PackagePath.locate(): the dist's sys.path directory joined with the RECORD path.
func (d distribution) locate(p string) string {
	rel := strings.Join(posixParts(p), "/")
	if strings.HasPrefix(p, "/") {
		return "/" + rel
	}
	if rel == "" {
		return d.parent
	}
	return d.parent + "/" + rel
}

// pythonTruthy is bool(value) for a value json.loads produced.
func pythonTruthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		return err != nil || f != 0 // an out-of-range number is inf (or a big int): true
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

// pluginJSON parses a pulumi-plugin.json as json.loads would; ok=false when Python would fail.
func pluginJSON(raw []byte) (map[string]any, bool, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	if err == nil && len(bytes.TrimLeft(raw[dec.InputOffset():], " \t\r\n")) > 0 {
		err = errors.New("extra data") // json.loads: "Extra data"
	}
	if err != nil {
		if bytes.Contains(raw, []byte("NaN")) || bytes.Contains(raw, []byte("Infinity")) {
			return nil, false, unsupported("pulumi-plugin.json with NaN/Infinity")
		}
		return nil, false, nil
	}
	m, isMap := v.(map[string]any)
	return m, isMap, nil
}

// scanPlugins is pluginScanScript in Go: every pulumi-plugin.json listed in a distribution's
// files whose "resource" is truthy, in discovery order (not yet deduplicated).
func scanPlugins(layout *pyLayout) ([]declaredPlugin, error) {
	dists, err := distributions(layout.entries)
	if err != nil {
		return nil, err
	}
	var found []declaredPlugin
	for _, d := range dists {
		files, err := d.pluginFiles(layout.minor)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			raw, err := os.ReadFile(d.locate(f))
			if err != nil || !utf8.Valid(raw) {
				continue // `except Exception: continue`
			}
			raw = bytes.ReplaceAll(bytes.ReplaceAll(raw, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
			data, ok, err := pluginJSON(raw)
			if err != nil {
				return nil, err
			}
			if !ok || !pythonTruthy(data["resource"]) {
				continue
			}
			var p declaredPlugin
			str := func(key string) (string, bool, error) { // data.get(key) when truthy
				v := data[key]
				if !pythonTruthy(v) {
					return "", false, nil
				}
				s, isStr := v.(string)
				if !isStr {
					return "", false, unsupported("%s: %q is not a string", d.locate(f), key)
				}
				return s, true, nil
			}
			var have bool
			if p.Name, have, err = str("name"); err != nil {
				return nil, err
			} else if !have {
				name, _, err := d.metadata()
				if err != nil {
					return nil, err
				}
				if !name.present {
					return nil, unsupported("%s has no Name", d.path) // Python: AttributeError on None
				}
				p.Name = strings.ReplaceAll(strings.ReplaceAll(name.value, "pulumi_", ""), "pulumi-", "")
			}
			if p.Version, have, err = str("version"); err != nil {
				return nil, err
			} else if !have {
				_, version, err := d.metadata()
				if err != nil {
					return nil, err
				}
				p.Version = version.value // None -> null -> ""
			}
			if p.Server, _, err = str("server"); err != nil {
				return nil, err
			}
			if v, present := data["parameterization"]; present && v != nil {
				if obj, isObj := v.(map[string]any); isObj {
					seen := map[string]bool{}
					for k := range obj {
						if seen[strings.ToLower(k)] {
							return nil, unsupported("%s: parameterization keys differing only in case", d.locate(f))
						}
						seen[strings.ToLower(k)] = true
					}
				}
				// The same decoding the script's JSON output went through.
				enc, err := json.Marshal(v)
				if err == nil {
					err = json.Unmarshal(enc, &p.Parameterization)
				}
				if err != nil {
					return nil, unsupported("%s: parameterization: %v", d.locate(f), err)
				}
			}
			found = append(found, p)
		}
	}
	return found, nil
}

type distInfo struct{ Name, Version string }

// scanDists is distListScript in Go: every distribution's Name and Version, sorted by lowercased
// name (a stable sort, as Python's sorted).
func scanDists(layout *pyLayout) ([]distInfo, error) {
	dists, err := distributions(layout.entries)
	if err != nil {
		return nil, err
	}
	out := make([]distInfo, 0, len(dists))
	for _, d := range dists {
		name, version, err := d.metadata()
		if err != nil {
			return nil, err
		}
		if !name.present {
			return nil, unsupported("%s has no Name", d.path) // Python: None.lower() fails
		}
		if !isASCII(name.value) {
			return nil, unsupported("non-ASCII name %q", name.value)
		}
		out = append(out, distInfo{Name: name.value, Version: version.value})
	}
	sort.SliceStable(out, func(i, j int) bool { return asciiLower(out[i].Name) < asciiLower(out[j].Name) })
	return out, nil
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}
