// Command conformance-report summarises the ginkgo JSON reports of
// `make conformance`'s passes (hack/conformance.sh) as Markdown: per pass
// the specs passed, failed and skipped, each failure with its message, and
// the skip reasons grouped, the suite's own words (which capability or
// volume type ruled a spec out).
//
//	conformance-report [-took SECONDS] [-not-run 'REGEXP|WHY' ...] NAME=REPORT.json ...
//
// -not-run names specs the run left out by name because this machine cannot
// run them (hack/conformance.sh's NOT_HERE): the summary lists each with its
// reason and how many of the suite's specs it names.
//
// It exits 1 when a spec failed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

// report and spec are the parts of ginkgo v2's JSON report (types.Report,
// types.SpecReport) read here.
type report struct {
	SuiteDescription string
	SpecReports      []spec
}

type spec struct {
	ContainerHierarchyTexts []string
	LeafNodeText            string
	LeafNodeType            string
	State                   string
	RunTime                 time.Duration
	Failure                 struct {
		Message  string
		Location struct {
			FileName   string
			LineNumber int
		}
	}
}

func (s spec) name() string {
	return strings.Join(append(append([]string(nil), s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
}

// pass is one ginkgo run's specs by outcome.
type pass struct {
	name                                 string
	passed, failed, skipped, interrupted []spec
	unselected                           []spec
	took                                 time.Duration
}

func main() {
	took := flag.Int("took", 0, "the whole run's seconds, sandbox included")
	var notRun []notHere
	flag.Func("not-run", "REGEXP|WHY: specs left out by name, and why (repeatable)", func(v string) error {
		re, why, ok := strings.Cut(v, "|")
		if !ok || why == "" {
			return fmt.Errorf("%q is not REGEXP|WHY", v)
		}
		r, err := regexp.Compile(re)
		if err != nil {
			return err
		}
		notRun = append(notRun, notHere{re: r, why: why})
		return nil
	})
	flag.Parse()
	var passes []pass
	for _, a := range flag.Args() {
		name, path, ok := strings.Cut(a, "=")
		if !ok {
			fmt.Fprintf(os.Stderr, "conformance-report: argument %q is not NAME=REPORT.json\n", a)
			os.Exit(2)
		}
		p, err := read(name, path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "conformance-report:", err)
			os.Exit(1)
		}
		passes = append(passes, p)
	}
	if write(os.Stdout, passes, notRun, time.Duration(*took)*time.Second) {
		os.Exit(1)
	}
}

func read(name, path string) (pass, error) {
	p := pass{name: name}
	b, err := os.ReadFile(path)
	if err != nil {
		return p, fmt.Errorf("pass %s: %w", name, err)
	}
	var reports []report
	if err := json.Unmarshal(b, &reports); err != nil {
		return p, fmt.Errorf("pass %s: %s: %w", name, path, err)
	}
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				// A suite node (BeforeSuite, ReportAfterSuite) that failed
				// fails the pass.
				if s.State != "passed" && s.State != "skipped" && s.State != "" {
					p.failed = append(p.failed, s)
				}
				continue
			}
			p.took += s.RunTime
			switch {
			case s.State == "passed":
				p.passed = append(p.passed, s)
			case s.State == "skipped" && s.Failure.Message == "":
				// Left out by the pass's focus or labels: not run.
				p.unselected = append(p.unselected, s)
			case s.State == "skipped" || s.State == "pending":
				p.skipped = append(p.skipped, s)
			case s.State == "interrupted":
				// Cut short by an interrupt of the run: neither verdict.
				p.interrupted = append(p.interrupted, s)
			default:
				p.failed = append(p.failed, s)
			}
		}
	}
	return p, nil
}

// numbers in a skip message (sizes, counts) vary between specs of one rule.
var numbers = regexp.MustCompile(`[0-9]+`)

// notHere is a selection of specs left out by name, and why.
type notHere struct {
	re  *regexp.Regexp
	why string
}

// write prints the summary and reports whether a spec failed.
func write(w io.Writer, passes []pass, notRun []notHere, took time.Duration) bool {
	failed := false
	fmt.Fprintf(w, "# External Storage suite on the sandbox\n\n")
	fmt.Fprintf(w, "| pass | passed | failed | skipped | interrupted | specs' run time |\n|---|---|---|---|---|---|\n")
	for _, p := range passes {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %s |\n", p.name, len(p.passed), len(p.failed), len(p.skipped), len(p.interrupted), p.took.Round(time.Second))
		failed = failed || len(p.failed) > 0
	}
	if took > 0 {
		fmt.Fprintf(w, "\nThe whole run, the sandbox's start and teardown included: %s.\n", took)
	}
	for _, p := range passes {
		if len(p.failed) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## Failed in pass %s\n\n", p.name)
		for _, s := range p.failed {
			msg := strings.TrimSpace(s.Failure.Message)
			if i := strings.IndexByte(msg, '\n'); i >= 0 {
				msg = msg[:i] + " …"
			}
			fmt.Fprintf(w, "- %s (%s)\n  - %s:%d: %s\n", s.name(), s.State, s.Failure.Location.FileName, s.Failure.Location.LineNumber, msg)
		}
	}
	for _, p := range passes {
		if len(p.interrupted) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n## Interrupted in pass %s (the run was cut short)\n\n", p.name)
		for _, s := range p.interrupted {
			fmt.Fprintf(w, "- %s\n", s.name())
		}
	}
	if len(notRun) > 0 {
		// Every pass's report lists every spec of the binary, so the first pass's
		// unselected specs are where the names are counted: a pass's own labels
		// (Serial or not) decide which of them it would have run.
		fmt.Fprintf(w, "\n## Not run here, by name\n\n| specs | selection | why |\n|---|---|---|\n")
		for _, n := range notRun {
			c := 0
			if len(passes) > 0 {
				for _, s := range passes[0].unselected {
					if n.re.MatchString(s.name()) {
						c++
					}
				}
			}
			fmt.Fprintf(w, "| %d | `%s` | %s |\n", c, n.re, strings.ReplaceAll(n.why, "|", `\|`))
		}
	}
	for _, p := range passes {
		if len(p.skipped) == 0 {
			continue
		}
		reasons := map[string]int{}
		for _, s := range p.skipped {
			reasons[numbers.ReplaceAllString(strings.TrimSpace(s.Failure.Message), "N")]++
		}
		keys := make([]string, 0, len(reasons))
		for k := range reasons {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			if reasons[keys[i]] != reasons[keys[j]] {
				return reasons[keys[i]] > reasons[keys[j]]
			}
			return keys[i] < keys[j]
		})
		fmt.Fprintf(w, "\n## Skipped in pass %s, by reason\n\n| specs | reason |\n|---|---|\n", p.name)
		for _, k := range keys {
			fmt.Fprintf(w, "| %d | %s |\n", reasons[k], strings.ReplaceAll(strings.ReplaceAll(k, "|", `\|`), "\n", " "))
		}
	}
	return failed
}
