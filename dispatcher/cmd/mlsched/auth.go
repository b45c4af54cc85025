package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/mlsched/mlsched/shared/authconf"
)

// runAuth writes the NATS authorization of a deployment (docs/security.md).
func runAuth(_ context.Context, a *app, args []string) error {
	const synopsis = "auth init -dir DIR -nodes n1,n2,... [-rotate producer,node-n1,...]"
	if len(args) == 0 || args[0] != "init" {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
			fmt.Fprintf(a.stderr, "usage: mlsched %s\n", synopsis)
			return nil
		}
		fmt.Fprintf(a.stderr, "usage: mlsched %s\n", synopsis)
		return errUsage
	}
	fs := a.newFlags("auth init", synopsis)
	dir := fs.String("dir", "", "directory for auth.conf and the seed files (created, mode 0700)")
	nodes := fs.String("nodes", "", "comma-separated worker node ids, one key each")
	rotate := fs.String("rotate", "", "comma-separated identities to give new keys: dispatcher, producer, admin, node-<id>")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() > 0 {
		fmt.Fprintln(a.stderr, "mlsched auth init: -dir is required and there are no arguments")
		return errUsage
	}
	res, err := authconf.Init(*dir, splitList(*nodes), splitList(*rotate))
	if err != nil {
		return fmt.Errorf("auth init: %w", err)
	}
	for _, p := range res.Created {
		fmt.Fprintln(a.stdout, "created", p)
	}
	for _, p := range res.Rotated {
		fmt.Fprintln(a.stdout, "rotated", p)
	}
	for _, p := range res.Kept {
		fmt.Fprintln(a.stdout, "kept   ", p)
	}
	fmt.Fprintln(a.stdout, "wrote  ", res.Conf, "(include it from nats.conf, then reload nats-server)")
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
