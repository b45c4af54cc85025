package config

import (
	"errors"

	"github.com/kelseyhightower/envconfig"
)

func asParseError(err error, pe **envconfig.ParseError) bool { return errors.As(err, pe) }
