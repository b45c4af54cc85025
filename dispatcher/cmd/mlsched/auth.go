package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/mlsched/mlsched/dispatcher/authconf"
)

// runAuth writes the NATS authorization of a deployment (docs/security.md).
func runAuth(_ context.Context, a *app, args []string) error {
	const synopsis = "auth init -dir DIR [-nodes n1,n2,...] [-redis] [-jwt] [-compose] [-rotate producer,node-n1,redis,worker-pool,...]"
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
	rotate := fs.String("rotate", "", "comma-separated identities to give new keys: dispatcher, producer, admin, node-<id>, redis (with -redis)")
	redis := fs.Bool("redis", false, "also write "+authconf.RedisPasswordFile+" (the dispatcher's Redis password, user "+authconf.RedisUser+") and "+authconf.RedisACLFile+" (for redis-server --aclfile; also the Sentinel users "+authconf.RedisReplicaUser+", "+authconf.RedisSentinelUser+") and "+authconf.SentinelACLFile+" (the sentinels')")
	compose := fs.Bool("compose", false, "for docker-compose.yml: -jwt, -redis, and secret files readable by the containers' non-root users (0644, in the 0700 directory; compose mounts each service only its own)")
	useJWT := fs.Bool("jwt", false, "operator mode (decentralised JWT): auth.conf holds the operator and account JWTs, each identity gets <name>.creds, and "+authconf.PoolKeyFile+" is the worker pool's scoped signing key, with which each worker replica signs its own identity (rotate it with -rotate "+authconf.PoolRotate+")")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if *dir == "" || fs.NArg() > 0 {
		fmt.Fprintln(a.stderr, "mlsched auth init: -dir is required and there are no arguments")
		return errUsage
	}
	o := authconf.Options{Nodes: splitList(*nodes), Rotate: splitList(*rotate), Redis: *redis || *compose, JWT: *useJWT || *compose}
	if *compose {
		o.SecretMode = 0o644
	}
	res, err := authconf.Write(*dir, o)
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
	switch {
	case *compose && len(res.Rotated) > 0:
		// compose's nats includes auth.conf already (deployments/nats/nats.conf)
		fmt.Fprintln(a.stdout, "wrote  ", res.Conf, "(operator mode) and a .creds file per identity; compose's nats includes it: docker compose kill -s HUP nats, then re-create the services whose keys changed")
	case *compose:
		fmt.Fprintln(a.stdout, "wrote  ", res.Conf, "(operator mode) and a .creds file per identity; compose's nats includes it: nothing to do before docker compose up")
	case o.JWT:
		fmt.Fprintln(a.stdout, "wrote  ", res.Conf, "(operator mode: include it from nats.conf, then restart nats-server) and a .creds file per identity")
	default:
		fmt.Fprintln(a.stdout, "wrote  ", res.Conf, "(include it from nats.conf, then reload nats-server)")
	}
	if res.RedisACL != "" {
		fmt.Fprintln(a.stdout, "wrote  ", res.RedisACL, "(redis-server --aclfile; ACL LOAD or restart Redis after a rotation)")
	}
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
