#!/usr/bin/env bash
# The "UCX and Open MPI" benchmark (BENCHMARKS.md): UCX 1.13 `ucx_perftest` and an Open MPI ping-pong on rocev2,
# beside `rocev2 perf` and raw kernel UDP, all between the same two network namespaces (scripts/netns.sh, veth,
# 198.18.46.1 <-> 198.18.46.2) in one run, repetitions interleaved so drifting load hits every row alike.
#
#   sudo scripts/bench-ucx.sh [--reps N] [--lat-iters N] [--mtu BYTES] [--autogroup-nice N]
#
# Each repetition, side A (client, sender) in namespace A on CPU 0 and side B (server) in namespace B on CPU 1, both
# `nice -n -20` (and, with autogroups on, a session of its own whose autogroup nice is --autogroup-nice, default -20;
# see scripts/bench-real-wire.sh for why):
#   raw-pingpong   `rawudp ping`/`pong`, 8 B, busy-poll: typical (median) round trip / 2
#   raw-sendmmsg   `rawudp send` (sendmmsg, 32 per call) -> `rawudp sink`, 4096 B (1024 B if the MTU is below
#                  4200), 2 s: delivered Gb/s
#   perf-send-lat  `rocev2 perf send-lat -s 8 -n LAT` (RC): typical half round trip
#   perf-write-bw  `rocev2 perf write-bw -s 1048576 -D 2` (RC, data verified): average Gb/s
#   ucx-tag-lat    `ucx_perftest -t tag_lat -s 8 -n LAT`: its 50th percentile (UCX reports half round trips)
#   ucx-tag-bw-8   `ucx_perftest -t tag_bw -s 8 -n 20*LAT`: overall message rate
#   ucx-tag-bw-1M  `ucx_perftest -t tag_bw -s 1048576 -n 200`: overall bandwidth (rendezvous: RDMA READ)
#   mpi-pingpong   `mpirun` of crates/roce-cli/tests/mpi/pingpong_allreduce.c, one rank per namespace, 8 B,
#                  LAT iterations, PML ucx with UCX_TLS=rc_verbs,ud_verbs,self (both ranks are on one host: UCX's
#                  defaults would take shared memory): average half round trip (every byte checked)
# Every UCX and MPI program runs under `rocev2 run`. ucx_perftest runs with no UCX_* variable: each side also gets
# its own IPC and PID namespaces (`unshare --ipc --pid --fork`), as two hosts look to UCX, and UCX then picks
# rc_verbs on rocev2 by itself (docs/UCX.md). mpirun reaches namespace B through tests/mpi/rsh-netns.
#
# Builds the working tree (release: rocev2, libroce_ibverbs.so, rawudp) and prints the commit (with the number of
# uncommitted changed files), the machine, the load before and after, every repetition and the medians as Markdown
# on stdout. Root only; about 1 minute per repetition. Namespaces ($BUX_NS<pid>a/b, default prefix `bux`),
# processes and temp files it makes are removed on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=3 LAT_ITERS=10000 MTU=9000 AG_NICE=-20
ARGS=("$@")
while [ $# -gt 0 ]; do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	--lat-iters) LAT_ITERS=$2; shift 2 ;;
	--mtu) MTU=$2; shift 2 ;;
	--autogroup-nice) AG_NICE=$2; shift 2 ;;
	-h | --help) sed -n '2,30p' "$0"; exit 0 ;;
	*) echo "bench-ucx.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "bench-ucx.sh: must run as root (ip netns, CAP_BPF)" >&2; exit 1; }
for t in ip taskset unshare ucx_perftest mpirun mpicc python3; do
	command -v "$t" >/dev/null || { echo "bench-ucx.sh: $t not found (ucx-utils, openmpi-bin, libopenmpi-dev)" >&2; exit 1; }
done
say() { echo "$@" >&2; }

AUTOGROUP="n/a (autogroups off)"
if [ -e /proc/self/autogroup ] && [ "$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null)" = 1 ]; then
	if [ -z "${BUX_OWN_SESSION:-}" ]; then
		exec setsid -w env BUX_OWN_SESSION=1 "$0" "${ARGS[@]}"
	fi
	echo "$AG_NICE" >/proc/self/autogroup
	AUTOGROUP=$(cat /proc/self/autogroup)
fi

NS=${BUX_NS:-bux}
NA=$NS$$a NB=$NS$$b IPA=198.18.46.1 IPB=198.18.46.2
NETNS=$ROOT/scripts/netns.sh
D=$(mktemp -d "${TMPDIR:-/tmp}/bench-ucx.XXXXXX")
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
	"$NETNS" down "$NA" "$NB" || true
	rm -rf "$D"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "== building the working tree (release)"
cargo build --release -q -p roce-cli -p roce-ibverbs -p roce-rawudp --manifest-path "$ROOT/Cargo.toml"
TD=$(cargo metadata --format-version 1 --no-deps --manifest-path "$ROOT/Cargo.toml" |
	python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
ROCE=$TD/release/rocev2 RAW=$TD/release/rawudp
COMMIT=$(git -C "$ROOT" rev-parse --short HEAD)
DIRTY=$(git -C "$ROOT" status --porcelain -- crates Cargo.toml Cargo.lock | grep -c . || true)
mpicc -O2 -o "$D/mpipp" "$ROOT/crates/roce-cli/tests/mpi/pingpong_allreduce.c"

"$NETNS" up "$NA" "$NB" "$IPA/24" "$IPB/24" "$MTU" >/dev/null
for n in "$NA" "$NB"; do
	until [ "$(ip netns exec "$n" cat /sys/class/net/veth0/operstate)" = up ]; do sleep 0.05; done
done
RAW_SIZE=4096
[ "$MTU" -ge 4200 ] || RAW_SIZE=1024
A=(ip netns exec "$NA" nice -n -20 taskset -c 0)
B=(ip netns exec "$NB" nice -n -20 taskset -c 1)
# ucx_perftest's sides: no UCX_* variable, their own IPC and PID namespaces.
UA=(ip netns exec "$NA" nice -n -20 taskset -c 0 unshare --ipc --pid --fork env)
UB=(ip netns exec "$NB" nice -n -20 taskset -c 1 unshare --ipc --pid --fork env)
for v in $(env | sed -n 's/^\(UCX_[A-Za-z0-9_]*\)=.*/\1/p'); do UA+=(-u "$v"); UB+=(-u "$v"); done
OUT=$D/results.tsv
: >"$OUT"
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)

bg() { "$@" & PIDS+=($!); }
reap() {
	local p t
	for p in "${PIDS[@]}"; do
		t=0
		while kill -0 "$p" 2>/dev/null && [ $t -lt 300 ]; do sleep 0.1; t=$((t + 1)); done
		kill "$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	PIDS=()
}
# listening NS tcp|udp PORT: wait (at most 15 s) until something in NS listens on / is bound to PORT.
listening() {
	local t=0 f=-ltn
	[ "$2" = udp ] && f=-lun
	until ip netns exec "$1" ss -H "$f" "sport = :$3" | grep -q .; do
		sleep 0.05
		t=$((t + 1))
		[ $t -lt 300 ] || { say "   (nothing listening on $2 port $3 in $1 after 15 s)"; return 0; }
	done
}
# put NAME REP VALUE UNIT: one result row (VALUE "fail" when the run did not produce one).
put() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(cut -d' ' -f1 /proc/loadavg)" >>"$OUT"; }
# json FILE EXPR: EXPR (python, over the last JSON line `j`) or "fail".
json() {
	python3 - "$1" "$2" <<'EOF' || echo fail
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip().startswith("{")]
j = json.loads(lines[-1])
print(round(eval(sys.argv[2]), 3))
EOF
}
# final FILE FIELD: field FIELD (1-based, after "Final:") of ucx_perftest's Final line, or "fail".
final() { awk -v f="$2" '$1 == "Final:" { print $(f + 1); found = 1 } END { if (!found) print "fail" }' "$1"; }
# ucx REP NAME UNIT FIELD SCALE ARGS...: one ucx_perftest run, server in B, client in A.
ucx() {
	local rep=$1 name=$2 unit=$3 field=$4 scale=$5 v
	shift 5
	bg "${UB[@]}" timeout 120 "$ROCE" run -- ucx_perftest "$@" >"$D/us.out" 2>"$D/us.err"
	listening "$NB" tcp 13337
	"${UA[@]}" timeout 120 "$ROCE" run -- ucx_perftest "$IPB" "$@" >"$D/uc.out" 2>"$D/uc.err" || true
	reap
	v=$(final "$D/uc.out" "$field")
	[ "$v" = fail ] || v=$(python3 -c "print(round($v * $scale, 3))")
	[ "$v" != fail ] || say "   $name failed: $(tail -3 "$D/uc.err" "$D/us.err" | tr '\n' ' ')"
	put "$name" "$rep" "$v" "$unit"
}

for rep in $(seq 1 "$REPS"); do
	say "== repetition $rep of $REPS (load $(cut -d' ' -f1 /proc/loadavg))"
	bg "${B[@]}" timeout 60 "$RAW" pong "$IPB:4791" --idle 1 --max-secs 50 >/dev/null 2>&1
	listening "$NB" udp 4791
	"${A[@]}" timeout 60 "$RAW" ping "$IPB:4791" --size 8 --iters "$LAT_ITERS" --warmup 2000 >"$D/o" 2>&1 || true
	reap
	put raw-pingpong "$rep" "$(json "$D/o" 'j["rtt_us"]["typical"] / 2')" "µs half RTT"

	bg "${B[@]}" timeout 60 "$RAW" sink "$IPB:4791" --idle 0.5 >"$D/sink" 2>&1
	listening "$NB" udp 4791
	"${A[@]}" timeout 60 "$RAW" send "$IPB:4791" --size "$RAW_SIZE" --seconds 2 >/dev/null 2>&1 || true
	reap
	put "raw-sendmmsg-$RAW_SIZE" "$rep" "$(json "$D/sink" 'j["gbps"]')" "Gb/s delivered"

	bg "${B[@]}" timeout 60 "$ROCE" perf send-lat --json -s 8 -n "$LAT_ITERS" --ip "$IPB" >/dev/null 2>&1
	listening "$NB" tcp 18515
	"${A[@]}" timeout 60 "$ROCE" perf send-lat --json -s 8 -n "$LAT_ITERS" --ip "$IPA" "$IPB" >"$D/o" 2>&1 || true
	reap
	put perf-send-lat "$rep" "$(json "$D/o" 'j["t_typical_us"] if j["verified"] else 1/0')" "µs half RTT"

	bg "${B[@]}" timeout 60 "$ROCE" perf write-bw --json -s 1048576 -D 2 --ip "$IPB" >/dev/null 2>&1
	listening "$NB" tcp 18515
	"${A[@]}" timeout 60 "$ROCE" perf write-bw --json -s 1048576 -D 2 --ip "$IPA" "$IPB" >"$D/o" 2>&1 || true
	reap
	put perf-write-bw-1M "$rep" "$(json "$D/o" 'j["bw_avg_gbps"] if j["verified"] else 1/0')" "Gb/s"

	ucx "$rep" ucx-tag-lat "µs half RTT (median)" 2 1 -t tag_lat -s 8 -n "$LAT_ITERS"
	ucx "$rep" ucx-tag-bw-8 "M msg/s" 7 0.000001 -t tag_bw -s 8 -n $((20 * LAT_ITERS))
	# MB/s in UCX is MiB/s: * 2^20 * 8 / 1e9 = Gb/s.
	ucx "$rep" ucx-tag-bw-1M "Gb/s" 5 0.008388608 -t tag_bw -s 1048576 -n 200

	"${A[@]}" env RSH_NETNS="$NA $NB" timeout 120 mpirun --allow-run-as-root --oversubscribe --timeout 100 \
		--mca plm_rsh_agent "$ROOT/crates/roce-cli/tests/mpi/rsh-netns" --host "$IPA:1,$IPB:1" -np 2 \
		--mca pml ucx -x UCX_TLS=rc_verbs,ud_verbs,self "$ROCE" run -- "$D/mpipp" "$LAT_ITERS" 8 >"$D/o" 2>"$D/e" || true
	v=$(sed -n 's/^pingpong ok=yes .* half_rtt_us \([0-9.]*\)$/\1/p' "$D/o")
	grep -q '^allreduce ok=yes' "$D/o" || v=
	[ -n "$v" ] || { say "   mpi-pingpong failed: $(tail -3 "$D/e" | tr '\n' ' ')"; v=fail; }
	put mpi-pingpong "$rep" "$v" "µs half RTT (average)"
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$OUT" <<EOF
import statistics, sys, collections
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
by = collections.OrderedDict()
for name, rep, v, unit, load in rows:
    by.setdefault((name, unit), []).append((v, load))
print("Command: \`sudo scripts/bench-ucx.sh ${ARGS[*]}\` (reps $REPS, $LAT_ITERS latency iterations, MTU $MTU). "
      "Commit \`$COMMIT\` ($DIRTY uncommitted changed files), $(date -u +%Y-%m-%dT%H:%MZ).")
print("Machine: $(nproc) vCPUs, $(lscpu | sed -n 's/^Model name: *//p' | head -1), Linux $(uname -r); "
      "load average $LOAD_START at the start, $LOAD_END at the end; autogroup $AUTOGROUP.")
print()
print("| measurement | unit | median | every repetition (1-min load) |")
print("|---|---|---|---|")
for (name, unit), vs in by.items():
    ok = [float(v) for v, _ in vs if v != "fail"]
    med = f"{statistics.median(ok):.3g}" if ok else "fail"
    reps = ", ".join(f"{v} ({l})" for v, l in vs)
    print(f"| {name} | {unit} | {med} | {reps} |")
EOF
