#!/usr/bin/env bash
# interop-bench.sh -- side by side on the same emulated link: Linux Soft-RoCE (rxe) <-> rxe versus
# rocev2 <-> rocev2, both inside two QEMU guests (g1 198.18.0.2, g2 198.18.0.3) of
# testdata/interop/softroce-vm.
#
#   1. rxe:    ib_write_bw / ib_send_lat (perftest, -x 1 -F) between rxe0 of g2 (server) and g1 (client)
#   2. rocev2: rxe is removed from both guests (rdma link delete rxe0; rmmod rdma_rxe, which frees
#              UDP 4791), then `rocev2 perf write-bw` / `send-lat` between the same two guests, same sizes,
#              iterations and path MTU (1024, rxe's active MTU on a 1500-byte link).
# The rocev2 binary is the workspace's release build, stripped (objcopy --strip-all) and pushed gzipped
# (the push channel moves about 75 KB/s), plus the host's libgcc_s.so.1, which the guest image lacks.
#
# Usage: scripts/interop-bench.sh [OUTDIR]      (default target/interop-bench)
#   Env: BW_SIZES ("4096 65536"), LAT_SIZES ("2 4096"), ITERS (1000)
# Prints a Markdown section (also written to OUTDIR/section.md) for BENCHMARKS.md; raw outputs in OUTDIR.
# Needs root. Takes the lock /var/tmp/softroce-interop.lock (shared with the roce-interop test suite) and
# always ends with `softroce-vm teardown` (guests and the roce-net namespace only).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VM=$ROOT/testdata/interop/softroce-vm
OUT=${1:-$ROOT/target/interop-bench}
BW_SIZES=${BW_SIZES:-"4096 65536"}
LAT_SIZES=${LAT_SIZES:-"2 4096"}
ITERS=${ITERS:-1000}
MTU=1024
G1=198.18.0.2
G2=198.18.0.3
T=300                                  # guest-side timeout of every command (exec -t)

die() { echo "interop-bench: $*" >&2; exit 1; }
log() { echo "interop-bench: $*" >&2; }
[ "$(id -u)" = 0 ] || die "must run as root"
[ -x "$VM" ] || die "$VM not found"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/section.md

exec 9>/var/tmp/softroce-interop.lock
if ! flock -n 9; then
    log "waiting for /var/tmp/softroce-interop.lock (another Soft-RoCE run is active)"
    flock -w 1800 9 || die "lock still held after 30 min"
fi

BGPIDS=()
cleanup() {
    local p
    for p in "${BGPIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    "$VM" teardown >&2 || true
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD_START=$(loadavg)

# --- the binary ----------------------------------------------------------------------------------------
log "building rocev2 (cargo build --release -p roce-cli)"
(cd "$ROOT" && cargo build --release -p roce-cli >&2)
BIN=$ROOT/target/release/rocev2
STAGE=$(mktemp -d)
BGPIDS=()
trap 'cleanup; rm -rf "$STAGE"' EXIT
objcopy --strip-all "$BIN" "$STAGE/rocev2"
gzip -9 -c "$STAGE/rocev2" > "$STAGE/rocev2.gz"
LIBGCC=$(ldd "$BIN" | awk '/libgcc_s/{print $3}')
REV=$(cd "$ROOT" && git rev-parse --short HEAD)
DIRTY=$(cd "$ROOT" && git status --porcelain -- crates Cargo.toml Cargo.lock | grep -q . && echo "+uncommitted" || true)
log "rocev2 $REV$DIRTY: $(stat -c %s "$STAGE/rocev2") bytes stripped, $(stat -c %s "$STAGE/rocev2.gz") gzipped"

# --- guests --------------------------------------------------------------------------------------------
"$VM" build >&2
"$VM" teardown >&2
"$VM" netns >/dev/null
"$VM" up g1 $G1 > "$OUT/boot-g1.txt" 2>&1 & BGPIDS+=($!)
"$VM" up g2 $G2 > "$OUT/boot-g2.txt" 2>&1 & BGPIDS+=($!)
for p in "${BGPIDS[@]}"; do wait "$p" || { cat "$OUT"/boot-*.txt >&2; die "boot failed"; }; done
BGPIDS=()
grep -h "up in" "$OUT"/boot-g*.txt >&2

push_bin() {   # push_bin GUEST
    "$VM" push "$1" "$STAGE/rocev2.gz" /root/rocev2.gz >/dev/null
    [ -n "$LIBGCC" ] && "$VM" push "$1" "$LIBGCC" /usr/lib/x86_64-linux-gnu/libgcc_s.so.1 >/dev/null
    "$VM" exec -t 60 "$1" 'gunzip -f /root/rocev2.gz && chmod +x /root/rocev2 && /root/rocev2 --version'
}
t0=$SECONDS
push_bin g1 > "$OUT/push-g1.txt" 2>&1 & BGPIDS+=($!)
push_bin g2 > "$OUT/push-g2.txt" 2>&1 & BGPIDS+=($!)
for p in "${BGPIDS[@]}"; do wait "$p" || { cat "$OUT"/push-*.txt >&2; die "push failed (or the binary does not run in the guest)"; }; done
BGPIDS=()
log "pushed to both guests in $((SECONDS - t0)) s: $(tail -1 "$OUT/push-g1.txt")"

# wait until something listens on TCP 18515 in guest $1 (the server's out-of-band port)
wait_listen() {
    local i
    for i in $(seq 1 120); do
        "$VM" exec -t 20 "$1" 'ss -Hltn' 2>/dev/null | grep -q ':18515 ' && return 0
        sleep 0.5
    done
    return 1
}

# pair NAME SERVER_CMD CLIENT_CMD: server in g2, client in g1; outputs in $OUT/NAME.{server,client}.txt
pair() {
    local name=$1 srv=$2 cli=$3 spid rc=0 src=0
    echo "g2\$ $srv" > "$OUT/$name.server.txt"
    echo "g1\$ $cli" > "$OUT/$name.client.txt"
    "$VM" exec -t $T g2 "$srv" >> "$OUT/$name.server.txt" 2>&1 & spid=$!
    wait_listen g2 || { kill $spid 2>/dev/null; die "$name: server not listening"; }
    local l0; l0=$(loadavg)
    "$VM" exec -t $T g1 "$cli" >> "$OUT/$name.client.txt" 2>&1 || rc=$?
    wait $spid || src=$?
    echo "load $l0 -> $(loadavg)" >> "$OUT/$name.client.txt"
    [ $rc = 0 ] && [ $src = 0 ] || { tail -5 "$OUT/$name.server.txt" "$OUT/$name.client.txt" >&2; die "$name failed (client rc=$rc, server rc=$src)"; }
    log "$name done (load $l0)"
}

# --- 1. rxe <-> rxe ------------------------------------------------------------------------------------
PT="-d rxe0 -x 1 -F --report_gbits -m $MTU -n $ITERS"
for s in $BW_SIZES; do
    pair "rxe_write_bw_$s" "ib_write_bw $PT -s $s" "ib_write_bw $PT -s $s $G2"
done
for s in $LAT_SIZES; do
    pair "rxe_send_lat_$s" "ib_send_lat $PT -s $s" "ib_send_lat $PT -s $s $G2"
done

# --- 2. rocev2 <-> rocev2 (rxe removed: it owns UDP 4791) ---------------------------------------------
for g in g1 g2; do
    "$VM" exec -t 60 $g 'rdma link delete rxe0 && rmmod rdma_rxe && ! ss -Hlun | grep -q ":4791 " && echo rxe removed' \
        > "$OUT/rxe-remove-$g.txt" 2>&1 || { cat "$OUT/rxe-remove-$g.txt" >&2; die "cannot remove rxe from $g"; }
done
RV="/root/rocev2 perf"
RF="-m $MTU -n $ITERS --report_gbits --json --timeout 60"
for s in $BW_SIZES; do
    pair "rocev2_write_bw_$s" "$RV write-bw --ip $G2 $RF -s $s" "$RV write-bw $G2 --ip $G1 $RF -s $s"
done
for s in $LAT_SIZES; do
    pair "rocev2_send_lat_$s" "$RV send-lat --ip $G2 $RF -s $s" "$RV send-lat $G2 --ip $G1 $RF -s $s"
done
LOAD_END=$(loadavg)

# --- report --------------------------------------------------------------------------------------------
# perftest: the data line follows the '#bytes' header; rocev2: one JSON object per size.
pt_line() { awk '/#bytes/{getline; print; exit}' "$OUT/$1.client.txt"; }
js() { grep -o "\"$2\":[0-9.eE+-]*" "$OUT/$1.client.txt" | head -1 | cut -d: -f2; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
fmt() { awk -v a="$1" -v d="$2" 'BEGIN{ printf "%.*f", d, a }'; }
CPU=$(lscpu | awk -F: '/Model name/{gsub(/^ +/,"",$2); print $2; exit}')
QEMU=$(qemu-system-x86_64 --version | head -1)
KVER=$(cat "${SOFTROCE_DIR:-/var/tmp/softroce}/kernel/version" 2>/dev/null || echo "?")
{
echo "Command: \`scripts/interop-bench.sh\` ($(date -u '+%Y-%m-%d %H:%M UTC'), rocev2 at \`$REV$DIRTY\`)."
echo
echo "Machine: $(nproc) vCPUs ($CPU), $(free -g | awk '/Mem:/{print $2}') GiB, host Linux $(uname -r); $QEMU,"
echo "TCG (no KVM), two guests with 1 vCPU and 256 MiB each, Debian kernel $KVER, rxe on virtio-net, one bridge,"
echo "link MTU 1500, path MTU $MTU on both stacks. Host load average (1/5/15 min) at start $LOAD_START, at end"
echo "$LOAD_END (the 2 host cores are shared with other engineers' builds and tests; a busy-polling guest eats most of a core)."
echo "The ratio is rocev2's value over rxe's: below 1 means rocev2 is slower for bandwidth, above 1 means it is slower for"
echo "latency."
echo
echo "| test | size | iters | rxe ↔ rxe | rocev2 ↔ rocev2 | rocev2 / rxe |"
echo "|---|---|---|---|---|---|"
for s in $BW_SIZES; do
    read -r _ _ pk av _ <<<"$(pt_line "rxe_write_bw_$s")"
    rav=$(js "rocev2_write_bw_$s" bw_avg_gbps); rpk=$(js "rocev2_write_bw_$s" bw_peak_gbps)
    echo "| write-bw avg (peak), Gb/s | $s | $ITERS | $av ($pk) | $(fmt "$rav" 3) ($(fmt "$rpk" 3)) | $(ratio "$rav" "$av") |"
done
for s in $LAT_SIZES; do
    read -r _ _ mn mx ty av _ p99 _ <<<"$(pt_line "rxe_send_lat_$s")"
    rty=$(js "rocev2_send_lat_$s" t_typical_us); rav=$(js "rocev2_send_lat_$s" t_avg_us)
    rmn=$(js "rocev2_send_lat_$s" t_min_us); rp99=$(js "rocev2_send_lat_$s" p99_us)
    echo "| send-lat typical µs | $s | $ITERS | $ty | $(fmt "$rty" 1) | $(ratio "$rty" "$ty") |"
    echo "| send-lat avg / min / p99 µs | $s | $ITERS | $av / $mn / $p99 | $(fmt "$rav" 1) / $(fmt "$rmn" 1) / $(fmt "$rp99" 1) | $(ratio "$rav" "$av") (avg) |"
done
echo
echo "Exact commands (server in g2 = $G2, client in g1 = $G1):"
echo
echo '```'
for f in "$OUT"/rxe_*.server.txt "$OUT"/rxe_*.client.txt "$OUT"/rocev2_*.server.txt "$OUT"/rocev2_*.client.txt; do
    head -1 "$f"
done
echo '```'
} > "$OUT/section.md"
cat "$OUT/section.md"
