#!/usr/bin/env bash
# `rocev2 perf write-bw` over the AF_XDP link (`--link xdp`) against the UDP link, in the same run: two network
# namespaces joined by a veth pair (scripts/netns.sh, 198.18.26.1 <-> 198.18.26.2, MTU 1500, so -m 1024), server
# in namespace A on CPU 1, client in namespace B on CPU 0, both `nice -n -20`; repetitions alternate udp and xdp
# so drifting load hits both. Prints one line per repetition and the medians (Mpps of completed 64 B WRITEs).
#
#   sudo scripts/bench-xdp.sh [--reps N] [--seconds S] [--size BYTES] [--lat] [ROCEV2_BINARY]
#
# --lat: `perf send-lat -s SIZE -n 10000` instead (RC, busy-polled; t_typical, the median half round trip, in µs).
#
# Default binary target/release/rocev2 (build it first: cargo build --release). Root only. The
# namespaces are removed on exit.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
REPS=5 SECS=2 SIZE=64 LAT=0
while [ $# -gt 0 ]; do
	case $1 in
	--reps) REPS=$2; shift 2 ;;
	--seconds) SECS=$2; shift 2 ;;
	--size) SIZE=$2; shift 2 ;;
	--lat) LAT=1; shift ;;
	*) BIN=$1; shift ;;
	esac
done
BIN=${BIN:-$ROOT/target/release/rocev2}
A=bxdp$$a B=bxdp$$b
cleanup() { bash "$ROOT/scripts/netns.sh" down "$A" "$B" >/dev/null 2>&1 || true; }
trap cleanup EXIT
bash "$ROOT/scripts/netns.sh" up "$A" "$B" 198.18.26.1/24 198.18.26.2/24 1500 >/dev/null
sleep 1
echo "# $(date -u +%FT%TZ) $(git -C "$ROOT" rev-parse --short HEAD) $(uname -r) $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
port=19300
if [ "$LAT" = 1 ]; then
	TEST=(send-lat -s "$SIZE" -n 10000 -m 1024) FIELD=t_typical_us UNIT=us
else
	TEST=(write-bw -s "$SIZE" -D "$SECS" -m 1024 -t 128 -Q 100 -l 1) FIELD=msg_rate_mpps UNIT=Mpps
fi
run() { # link -> prints the metric
	local link=$1 out
	port=$((port + 1))
	ip netns exec "$A" taskset -c 1 nice -n -20 "$BIN" perf "${TEST[@]}" --ip 198.18.26.1 -p $port --link "$link" \
		--json --timeout 30 >/dev/null 2>&1 &
	local srv=$! i
	for i in $(seq 1 200); do # up to 20 s for the server to listen (a loaded machine is slow to start it)
		ip netns exec "$A" ss -Htln "sport = :$port" | grep -q . && break
		sleep 0.1
	done
	out=$(ip netns exec "$B" taskset -c 0 nice -n -20 "$BIN" perf "${TEST[@]}" 198.18.26.1 --ip 198.18.26.2 -p $port \
		--link "$link" --json --timeout 30 \
		2>/tmp/bench-xdp.$$.err) || true
	wait "$srv" || true
	grep -q "AF_XDP cannot be used" /tmp/bench-xdp.$$.err && echo "warning: $link fell back: $(cat /tmp/bench-xdp.$$.err)" >&2
	local err
	err=$(tail -3 /tmp/bench-xdp.$$.err)
	rm -f /tmp/bench-xdp.$$.err
	python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["verified"]; print("%.4f" % j[sys.argv[2]])' "$out" "$FIELD" \
		2>/dev/null || { echo "warning: $link run failed: $out $err" >&2; echo 0; }
}
udp=() xdp=()
for r in $(seq 1 "$REPS"); do
	u=$(run udp); x=$(run xdp)
	udp+=("$u") xdp+=("$x")
	echo "rep $r: udp $u $UNIT, xdp $x $UNIT, xdp/udp $(python3 -c "print('%.2f' % ($x/$u) if $u > 0 else 'n/a')")"
done
python3 - "${udp[*]}" "${xdp[*]}" "$UNIT" <<'PY'
import statistics, sys
pairs = [(float(a), float(b)) for a, b in zip(sys.argv[1].split(), sys.argv[2].split()) if float(a) > 0 and float(b) > 0]
print("%d of %d repetitions with both runs complete" % (len(pairs), len(sys.argv[1].split())))
u = [a for a, _ in pairs]; x = [b for _, b in pairs]
r = [b / a for a, b in pairs]
unit = sys.argv[3]
print("median udp %.4f (%.4f-%.4f) %s, xdp %.4f (%.4f-%.4f) %s, xdp/udp %.2f (%.2f-%.2f)" % (
    statistics.median(u), min(u), max(u), unit, statistics.median(x), min(x), max(x), unit,
    statistics.median(r), min(r), max(r)))
PY
echo "# load at end $(cut -d' ' -f1-3 /proc/loadavg)"
