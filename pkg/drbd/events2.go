package drbd

import (
	"fmt"
	"strconv"
	"strings"
	"time"
	"unique"
)

// EventKind is the first word of an events2 line.
type EventKind string

const (
	EventExists   EventKind = "exists"   // initial state dump
	EventCreate   EventKind = "create"   // object came into existence
	EventChange   EventKind = "change"   // object changed
	EventDestroy  EventKind = "destroy"  // object went away
	EventCall     EventKind = "call"     // kernel calls a user-mode helper
	EventResponse EventKind = "response" // helper returned
)

// ObjectType is the second word of an events2 line.
type ObjectType string

const (
	ObjResource   ObjectType = "resource"
	ObjConnection ObjectType = "connection"
	ObjDevice     ObjectType = "device"
	ObjPeerDevice ObjectType = "peer-device"
	ObjPath       ObjectType = "path"
	ObjHelper     ObjectType = "helper"
)

// Event is one parsed line of `drbdsetup events2 [--timestamps]
// [--statistics] [--full]`.
type Event struct {
	// Time is the line's timestamp (--timestamps); zero without it.
	Time time.Time
	Kind EventKind
	// EndOfDump marks the "exists -" line that ends the initial state dump;
	// Object and Fields are empty then.
	EndOfDump bool
	Object    ObjectType
	// Fields are the key:value pairs in line order. Keys repeat only if
	// drbdsetup repeats them (it does not today).
	Fields []Field
}

// Field is one key:value pair. The value runs to the next space and may
// itself contain ':' (local:ipv4:10.0.0.1:7000).
type Field struct{ Key, Value string }

// Get returns the value of key.
func (e *Event) Get(key string) (string, bool) {
	for _, f := range e.Fields {
		if f.Key == key {
			return f.Value, true
		}
	}
	return "", false
}

// Name is the resource name every object line carries.
func (e *Event) Name() string { v, _ := e.Get("name"); return v }

// ParseError says which line could not be parsed and why.
type ParseError struct {
	Line   string
	Reason string
}

func (e *ParseError) Error() string { return fmt.Sprintf("events2 line %q: %s", e.Line, e.Reason) }

// timestampLayout is what --timestamps prints: ISO 8601 with microseconds
// and a numeric zone ("2026-11-22T00:56:08.191294+00:00").
const timestampLayout = "2006-01-02T15:04:05.999999999Z07:00"

// required keys per object type; their values must also be well-formed
// (ints where DRBD prints ints) so that downstream code can trust them.
var requiredKeys = map[ObjectType][]string{
	ObjResource:   {"name"},
	ObjConnection: {"name", "peer-node-id"},
	ObjDevice:     {"name", "volume"},
	ObjPeerDevice: {"name", "peer-node-id", "volume"},
	ObjPath:       {"name", "peer-node-id"},
	ObjHelper:     {"name", "helper"},
}

var intKeys = map[string]bool{"peer-node-id": true, "volume": true, "minor": true}

// ParseEvent parses one events2 line (without its newline). It never
// panics; anything it does not understand is a *ParseError, so an unknown
// line kind from a newer drbd-utils is reported, not misread.
func ParseEvent(line string) (Event, error) {
	var ev Event
	rest := strings.TrimRight(line, "\r\n")
	if strings.TrimSpace(rest) == "" {
		return ev, &ParseError{Line: line, Reason: "empty line"}
	}
	word, rest := cutWord(rest)
	// With --timestamps the first word is the time.
	if len(word) > 0 && word[0] >= '0' && word[0] <= '9' {
		t, err := time.Parse(timestampLayout, word)
		if err != nil {
			return ev, &ParseError{Line: line, Reason: "bad timestamp: " + err.Error()}
		}
		ev.Time = t
		word, rest = cutWord(rest)
	}
	switch k := EventKind(word); k {
	case EventExists, EventCreate, EventChange, EventDestroy, EventCall, EventResponse:
		ev.Kind = k
	default:
		return ev, &ParseError{Line: line, Reason: fmt.Sprintf("unknown event kind %q", word)}
	}
	word, rest = cutWord(rest)
	if word == "-" {
		if ev.Kind != EventExists || strings.TrimSpace(rest) != "" {
			return ev, &ParseError{Line: line, Reason: `"-" is only valid as "exists -"`}
		}
		ev.EndOfDump = true
		return ev, nil
	}
	obj := ObjectType(word)
	req, known := requiredKeys[obj]
	if !known {
		return ev, &ParseError{Line: line, Reason: fmt.Sprintf("unknown object type %q", word)}
	}
	if (obj == ObjHelper) != (ev.Kind == EventCall || ev.Kind == EventResponse) {
		return ev, &ParseError{Line: line, Reason: fmt.Sprintf("%s %s: helpers are only called and responded to", ev.Kind, obj)}
	}
	ev.Object = obj
	for rest != "" {
		word, rest = cutWord(rest)
		if word == "" {
			continue
		}
		key, value, ok := strings.Cut(word, ":")
		if !ok || key == "" {
			return ev, &ParseError{Line: line, Reason: fmt.Sprintf("field %q is not key:value", word)}
		}
		if intKeys[key] {
			if _, err := strconv.Atoi(value); err != nil {
				return ev, &ParseError{Line: line, Reason: fmt.Sprintf("field %s=%q is not an integer", key, value)}
			}
		}
		// Interned: a key or value is otherwise a piece of its line, and
		// the Observer keeps values of each resource's state (names,
		// states, addresses) for as long as the resource runs, which kept
		// every such line alive — a few hundred bytes a line, the largest
		// part of an agent's memory per DRBD resource after its cache
		// (docs/scale.md, "One agent on its own"). The values repeat
		// (states, a resource's name on each of its lines), so each is
		// held once.
		ev.Fields = append(ev.Fields, Field{Key: unique.Make(key).Value(), Value: unique.Make(value).Value()})
	}
	for _, k := range req {
		if v, ok := ev.Get(k); !ok || v == "" {
			return ev, &ParseError{Line: line, Reason: fmt.Sprintf("%s line without %s", obj, k)}
		}
	}
	if ev.Kind == EventResponse {
		if _, ok := ev.Get("status"); !ok {
			return ev, &ParseError{Line: line, Reason: "helper response without status"}
		}
	}
	return ev, nil
}

func cutWord(s string) (word, rest string) {
	s = strings.TrimLeft(s, " \t")
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// Typed accessors used by the Observer. Missing keys report ok=false;
// malformed values are errors.

func (e *Event) intField(key string) (int64, bool, error) {
	v, ok := e.Get(key)
	if !ok {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, true, fmt.Errorf("%s:%s is not an integer", key, v)
	}
	return n, true, nil
}

func (e *Event) boolField(key string) (bool, bool, error) {
	v, ok := e.Get(key)
	if !ok {
		return false, false, nil
	}
	switch v {
	case "yes":
		return true, true, nil
	case "no":
		return false, true, nil
	}
	return false, true, fmt.Errorf("%s:%s is not yes/no", key, v)
}
