#!/bin/sh
# The Sentinel profile's Redis processes (docker-compose.sentinel.yml):
#   redis-start data TEMPLATE   a data node from deployments/redis/TEMPLATE
#   redis-start sentinel        a sentinel from deployments/redis/sentinel.conf
# Redis and the sentinels rewrite their configuration (the master's role
# moves, sentinels record their peers), so each copies its template into its
# volume on first start and runs from the copy. At every start the password
# lines are replaced from /run/secrets/redis.password, so a rotated password
# is taken up on restart; it is never in the repository (it is in the copies
# in the volumes). Users and their rights: the ACL files of `make secrets`.
set -eu
pw=$(cat /run/secrets/redis.password)
case "${1:-}" in
data)
	conf=/data/redis.conf
	[ -f "$conf" ] || cp "/etc/redis/$2" "$conf"
	sed -i -e '/^masteruser /d' -e '/^masterauth /d' "$conf"
	printf 'masteruser mlsched-replica\nmasterauth %s\n' "$pw" >>"$conf"
	exec redis-server "$conf" --aclfile /run/secrets/redis-users.acl
	;;
sentinel)
	conf=/data/sentinel.conf
	[ -f "$conf" ] || { cp /etc/redis/sentinel.conf "$conf" && echo "sentinel announce-ip $(hostname)" >>"$conf"; }
	sed -i -e '/^sentinel auth-user /d' -e '/^sentinel auth-pass /d' \
		-e '/^sentinel sentinel-user /d' -e '/^sentinel sentinel-pass /d' "$conf"
	printf 'sentinel auth-user mlsched mlsched-sentinel\nsentinel auth-pass mlsched %s\nsentinel sentinel-user mlsched-sentinel\nsentinel sentinel-pass %s\n' \
		"$pw" "$pw" >>"$conf"
	exec redis-server "$conf" --sentinel --aclfile /run/secrets/sentinel-users.acl
	;;
*)
	echo "usage: redis-start data TEMPLATE | sentinel" >&2
	exit 2
	;;
esac
