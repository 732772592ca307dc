// Package docs_test checks the repository's documents as a reader follows them: every
// relative link in a markdown file, and every repository path that a file names
// (docs/layouts.md, pkg/datamesh/testdata/scenarios/detach_recheck.txt, ...), must lead
// to a file or directory that exists. Links to the web are not followed (no network in
// tests), and anchors (#section) are not checked.
package docs_test

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// skipDirs are not the repository's own text: build output, the control plane's
// binaries, VCS metadata.
var skipDirs = map[string]bool{".git": true, "bin": true, "_output": true, "node_modules": true}

// textExt are the files whose mentions of repository paths are checked.
var textExt = map[string]bool{".go": true, ".md": true, ".yaml": true, ".yml": true, ".sh": true, ".tpl": true, ".txt": true, ".json": true}

var (
	// inlineLink is [text](target) or ![alt](target), target up to a space or ')'.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink is a reference definition: [label]: target
	refLink = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+.*)?$`)
	// pathMention is a repository-relative path to a file under one of the top-level
	// directories, not part of a longer path (an import path, ../docs/...).
	pathMention = regexp.MustCompile(`(^|[^A-Za-z0-9_./-])((?:docs|pkg|internal|cmd|test|hack|charts|deploy|config|sanity)/[A-Za-z0-9_./-]*[A-Za-z0-9_-]\.(?:md|go|txt|sh|yaml|json|tpl))`)
	codeSpan    = regexp.MustCompile("`[^`]*`")
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root %s: no go.mod: %v", root, err)
	}
	return root
}

// walkText calls fn for every file under root that is not in skipDirs.
func walkText(t *testing.T, root string, fn func(rel string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && skipDirs[d.Name()] {
				return filepath.SkipDir
			}
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		fn(rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// lines returns the file's lines, with fenced code blocks blanked (their text is code,
// not links) when markdown is true.
func lines(t *testing.T, path string, markdown bool) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	fenced := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if markdown && strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			out = append(out, "")
			continue
		}
		if fenced {
			line = ""
		}
		out = append(out, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// relative reports whether a link target is a path in the repository (not a URL, a
// mail address or an anchor on the same page).
func relative(target string) bool {
	if target == "" || strings.HasPrefix(target, "#") {
		return false
	}
	if i := strings.Index(target, ":"); i > 0 && !strings.ContainsAny(target[:i], "/.") {
		return false // scheme: http:, https:, mailto:, ...
	}
	return true
}

// TestMarkdownLinksResolve: every relative link of every markdown file points to a file
// or directory of the repository that exists, resolved from the linking file's directory.
func TestMarkdownLinksResolve(t *testing.T) {
	root := repoRoot(t)
	files, links := 0, 0
	walkText(t, root, func(rel string) {
		if !strings.EqualFold(filepath.Ext(rel), ".md") {
			return
		}
		files++
		for n, line := range lines(t, filepath.Join(root, rel), true) {
			line = codeSpan.ReplaceAllString(line, "")
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				if !relative(target) {
					continue
				}
				links++
				p := target
				if i := strings.IndexAny(p, "#?"); i >= 0 {
					p = p[:i]
				}
				resolved := filepath.Join(root, filepath.Dir(rel), filepath.FromSlash(p))
				if strings.HasPrefix(p, "/") {
					resolved = filepath.Join(root, filepath.FromSlash(p))
				}
				if r := mustRel(root, resolved); r == ".." || strings.HasPrefix(r, "../") {
					// A clone has nothing outside the repository to point to.
					t.Errorf("%s:%d: link %q leaves the repository", rel, n+1, target)
				} else if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s:%d: link %q: %s does not exist", rel, n+1, target, r)
				}
			}
		}
	})
	if files == 0 || links == 0 {
		t.Fatalf("found %d markdown files and %d relative links under %s: the walk is broken", files, links, root)
	}
	t.Logf("%d markdown files, %d relative links checked", files, links)
}

// TestCitedPathsExist: every repository path that a source file, script, chart or
// document names (comments cite docs/*.md, scenario files and code that way) exists.
func TestCitedPathsExist(t *testing.T) {
	root := repoRoot(t)
	cites := 0
	walkText(t, root, func(rel string) {
		if !textExt[filepath.Ext(rel)] && filepath.Base(rel) != "Makefile" && filepath.Base(rel) != "Dockerfile" {
			return
		}
		for n, line := range lines(t, filepath.Join(root, rel), false) {
			for _, m := range pathMention.FindAllStringSubmatch(line, -1) {
				cites++
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(m[2]))); err != nil {
					t.Errorf("%s:%d: cites %s, which does not exist", rel, n+1, m[2])
				}
			}
		}
	})
	if cites == 0 {
		t.Fatalf("found no citation of a repository path under %s: the walk is broken", root)
	}
	t.Logf("%d citations of repository paths checked", cites)
}

func mustRel(root, path string) string {
	if rel, err := filepath.Rel(root, path); err == nil {
		return rel
	}
	return path
}
