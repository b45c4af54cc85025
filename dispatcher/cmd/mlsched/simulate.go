package main

import "errors"

// runSimulate is a placeholder; the simulator engineer replaces this file.
func runSimulate(args []string) error { return errors.New("simulate: not built yet") }
