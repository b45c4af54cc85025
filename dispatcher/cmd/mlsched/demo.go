package main

import "errors"

// runDemo is a placeholder; the dispatcher engineer replaces this file.
func runDemo(args []string) error { return errors.New("demo: not built yet") }
