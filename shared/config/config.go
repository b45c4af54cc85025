// Package config loads MLSCHED_* environment variables with envconfig and
// builds the zerolog logger every mlsched process uses.
package config

import (
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/rs/zerolog"
)

// Prefix of every mlsched environment variable.
const Prefix = "MLSCHED"

// Load fills spec (a pointer to a struct with envconfig tags) from the
// environment. An invalid value yields an error naming the variable.
func Load(spec any) error {
	if err := envconfig.Process(Prefix, spec); err != nil {
		var pe *envconfig.ParseError
		if asParseError(err, &pe) {
			// KeyName is the whole variable name, prefix included.
			return fmt.Errorf("invalid %s=%q: %v", pe.KeyName, pe.Value, pe.Err)
		}
		return fmt.Errorf("configuration: %w", err)
	}
	return nil
}

// Usage writes the variables of spec, aligned in columns, with their
// defaults (none said for a variable without one), for -help output.
func Usage(w io.Writer, spec any) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if err := envconfig.Usagef(Prefix, spec, tw, "{{range .}}  {{usage_key .}}\t{{with usage_default .}}default {{.}}{{else}}-{{end}}\t{{usage_description .}}\n{{end}}"); err != nil {
		return err
	}
	return tw.Flush()
}

// Log is the logging configuration shared by every process.
type Log struct {
	// Format is json (default) or console.
	Format string `envconfig:"LOG_FORMAT" default:"json" desc:"json or console"`
	// Level is a zerolog level name (empty, as in a Config built in code:
	// info).
	Level string `envconfig:"LOG_LEVEL" default:"info" desc:"trace, debug, info, warn, error"`
}

// Logger builds the process logger; component names the process.
func (l Log) Logger(component string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(l.Level)) // "" parses as NoLevel
	if l.Level == "" {
		lvl, err = zerolog.InfoLevel, nil
	}
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("invalid %s_LOG_LEVEL=%q", Prefix, l.Level)
	}
	var w io.Writer
	switch l.Format {
	case "json", "":
		w = os.Stderr
	case "console":
		// Colours only on a terminal: a log file or a pipe gets plain text.
		w = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly, NoColor: !isTerminal(os.Stderr)}
	default:
		return zerolog.Nop(), fmt.Errorf("invalid %s_LOG_FORMAT=%q: want json or console", Prefix, l.Format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", component).Logger(), nil
}

// Defaults fills spec with the defaults of its `default` tags alone, ignoring
// the environment: for programs and tests that build a configuration in code.
func Defaults(spec any) error {
	// No variable has this prefix, so envconfig applies only the defaults.
	return envconfig.Process("MLSCHED_DEFAULTS_ONLY_3F1B", spec)
}

// FillZero gives every zero field of *spec that has a `default` tag that
// default, so that a configuration built in code means what an empty
// environment means and each default is stated once, in its tag. A field
// tagged `zero:"keep"` keeps its zero value (its default is for the
// environment only, e.g. a listen address). Nested structs are filled
// field by field.
func FillZero[T any](spec *T) error {
	var def T
	if err := Defaults(&def); err != nil {
		return err
	}
	fillZero(reflect.ValueOf(spec).Elem(), reflect.ValueOf(&def).Elem())
	return nil
}

func fillZero(v, def reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("zero") == "keep" {
			continue
		}
		if _, tagged := f.Tag.Lookup("default"); !tagged {
			if f.Type.Kind() == reflect.Struct {
				fillZero(v.Field(i), def.Field(i))
			}
			continue
		}
		if v.Field(i).IsZero() {
			v.Field(i).Set(def.Field(i))
		}
	}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
