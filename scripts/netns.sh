#!/usr/bin/env bash
# Two network namespaces joined by a veth pair, for tests and baselines over a real (virtual) wire.
#
#   netns.sh up   NAME_A NAME_B [IP_A/P IP_B/P [MTU]]   # default 198.18.1.1/24 198.18.1.2/24, MTU 9000
#   netns.sh down NAME ...                              # deletes the namespaces (and with them the veth pair)
#   netns.sh mac  NAME                                  # prints the MAC of veth0 in NAME
#
# Inside each namespace the veth end is called `veth0` (interface names are per namespace), `lo` is up, and each
# side has a permanent neighbour entry for the other (no ARP needed). `up` first removes namespaces of the same
# names, so both commands are idempotent. Needs root and iproute2. Addresses default to 198.18.0.0/15 (RFC 2544
# benchmarking range), never routed outside the pair.
set -euo pipefail

die() { echo "netns.sh: $*" >&2; exit 1; }
need() { command -v ip >/dev/null || die "iproute2 'ip' not found"; [ "$(id -u)" = 0 ] || die "must run as root"; }

down() {
	local n
	for n in "$@"; do
		if ip netns list | awk '{print $1}' | grep -qx -- "$n"; then
			ip netns del "$n"
		fi
	done
}

up() {
	[ $# -ge 2 ] || die "usage: up NAME_A NAME_B [IP_A/P IP_B/P [MTU]]"
	local a=$1 b=$2 ipa=${3:-198.18.1.1/24} ipb=${4:-198.18.1.2/24} mtu=${5:-9000}
	down "$a" "$b"
	# Temporary names in the root namespace, unique per invocation (max 15 characters).
	local ta="nsa$$" tb="nsb$$"
	ip netns add "$a"
	ip netns add "$b"
	if ! ip link add "$ta" mtu "$mtu" type veth peer name "$tb" mtu "$mtu"; then
		down "$a" "$b"
		die "cannot create veth pair"
	fi
	ip link set "$ta" netns "$a"
	ip link set "$tb" netns "$b"
	ip -n "$a" link set "$ta" name veth0
	ip -n "$b" link set "$tb" name veth0
	for n in "$a" "$b"; do
		ip -n "$n" link set lo up
		# No router solicitations / DAD chatter on the test wire.
		ip netns exec "$n" sysctl -qw net.ipv6.conf.veth0.disable_ipv6=1 || true
	done
	ip -n "$a" addr add "$ipa" dev veth0
	ip -n "$b" addr add "$ipb" dev veth0
	ip -n "$a" link set veth0 up
	ip -n "$b" link set veth0 up
	local maca macb
	maca=$(mac "$a")
	macb=$(mac "$b")
	ip -n "$a" neigh replace "${ipb%/*}" lladdr "$macb" dev veth0 nud permanent
	ip -n "$b" neigh replace "${ipa%/*}" lladdr "$maca" dev veth0 nud permanent
	echo "$a veth0 ${ipa%/*} $maca"
	echo "$b veth0 ${ipb%/*} $macb"
}

mac() { ip netns exec "$1" cat /sys/class/net/veth0/address; }

cmd=${1:-}
shift || true
case "$cmd" in
up) need; up "$@" ;;
down) need; down "$@" ;;
mac) need; mac "$@" ;;
*) die "usage: netns.sh up NAME_A NAME_B [IP_A/P IP_B/P [MTU]] | down NAME... | mac NAME" ;;
esac
