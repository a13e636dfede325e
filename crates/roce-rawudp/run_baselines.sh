#!/bin/bash
# The raw-UDP baselines between two namespaces (scripts/netns.sh, veth MTU 9000): sendmmsg throughput at 64 B,
# 1 KiB and 4 KiB payload (3 x 2 s each; raw sendmmsg and the same payload through roce_link::UdpLink) and busy-poll ping-pong RTT at 64 B (3 x 20000 round trips after 2000
# warm-up). Sender/client on CPU 0, sink/pong on CPU 1, nice -20. Prints one line per run with its JSON. Root only.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cargo build --release -q -p roce-rawudp --manifest-path "$ROOT/Cargo.toml" || exit 1
# A private copy: the shared target directory may be rebuilt while we run.
B=$(mktemp /tmp/rawudp.XXXXXX)
cp "$ROOT/target/release/rawudp" "$B" && chmod +x "$B"
NA=rb$$a NB=rb$$b S=$ROOT/scripts/netns.sh SINK=/tmp/rawudp_sink.$$.json
trap '"$S" down $NA $NB; rm -f "$B" "$SINK"' EXIT
"$S" up $NA $NB >/dev/null || exit 1
echo "loadavg_start=$(cut -d' ' -f1-3 /proc/loadavg)"
for size in 64 1024 4096; do
	for rep in 1 2 3; do
		ip netns exec $NB nice -n -20 taskset -c 1 "$B" sink 198.18.1.2:4791 --idle 0.5 >"$SINK" &
		sleep 0.3
		s=$(ip netns exec $NA nice -n -20 taskset -c 0 "$B" send 198.18.1.2:4791 --size $size --seconds 2)
		wait
		echo "size=$size rep=$rep send=$s"
		echo "size=$size rep=$rep sink=$(cat "$SINK")"
		# The same payload as RoCE v2 SEND frames through roce_link::UdpLink (datagram = size + 16).
		ip netns exec $NB nice -n -20 taskset -c 1 "$B" sink 198.18.1.2:4791 --idle 0.5 >"$SINK" &
		sleep 0.3
		s=$(ip netns exec $NA nice -n -20 taskset -c 0 "$B" link-send 198.18.1.2:4791 --local 198.18.1.1 --size $size --seconds 2)
		wait
		echo "size=$size rep=$rep link-send=$s"
		echo "size=$size rep=$rep link-sink=$(cat "$SINK")"
	done
done
for rep in 1 2 3; do
	ip netns exec $NB nice -n -20 taskset -c 1 "$B" pong 198.18.1.2:4791 --idle 1 --max-secs 60 >/dev/null &
	sleep 0.3
	echo "rep=$rep ping=$(ip netns exec $NA nice -n -20 taskset -c 0 "$B" ping 198.18.1.2:4791 --size 64 --iters 20000 --warmup 2000)"
	wait
done
echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
