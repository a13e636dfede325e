#!/usr/bin/env bash
# AddressSanitizer run of the tests of the crates whose `unsafe` touches application or kernel memory (issue #22):
# roce-verbs (MR memory, the gathered-piece hand-off), roce-link (sendmmsg/recvmmsg scratch, control messages),
# roce-proto (the engine's MR copies, through the tests' memory) and roce-ibverbs (the C ABI, exercised by its C
# programs). Bounded: each step runs under `timeout` (ASAN_STEP_TIMEOUT seconds, default 900); about 8.5 minutes from
# a clean target directory on 2 cores, about 4 once built (docs/TESTING.md).
#
# How: the nightly toolchain's `-Zsanitizer=address`, with an explicit `--target` so that build scripts and proc
# macros are built without it; std itself is not instrumented (that needs `-Zbuild-std` and the rust-src component).
# Separate target directory (ASAN_TARGET_DIR, default target/asan) so that the normal builds stay as they are.
# The C programs of roce-ibverbs' tests load the instrumented libibverbs.so.1, which needs an ASan runtime in the
# process: a `cc` wrapper on PATH builds them with `-fsanitize=address` (the compiler's libasan, first in the
# program's library list). Leak checking stays on for the Rust tests and is off for those C programs (they do not
# free what they allocate before exiting; leaks there are theirs, not the library's).
set -euo pipefail

cd "$(dirname "$0")/.."
target=x86_64-unknown-linux-gnu
step_timeout=${ASAN_STEP_TIMEOUT:-900}
export CARGO_TARGET_DIR="${ASAN_TARGET_DIR:-$PWD/target/asan}"
export RUSTFLAGS="-Zsanitizer=address"

if ! cargo +nightly --version >/dev/null 2>&1; then
    # Not a failure of the code under test: a machine whose registries serve no nightly toolchain cannot run it.
    echo "SKIPPED: the ASan job needs the nightly toolchain (rustup toolchain install nightly --profile minimal)" >&2
    exit 0
fi
cc_path=$(command -v cc) || {
    echo "error: no C compiler (cc) for roce-ibverbs' C programs" >&2
    exit 1
}

wrap=$(mktemp -d)
trap 'rm -rf "$wrap"' EXIT
printf '#!/bin/sh\nexec %s -fsanitize=address "$@"\n' "$cc_path" >"$wrap/cc"
chmod +x "$wrap/cc"

run() {
    timeout --kill-after=30 "$step_timeout" cargo +nightly test --target "$target" "$@"
}

echo "== ASan: roce-verbs, roce-link, roce-proto (target dir $CARGO_TARGET_DIR)"
# handle_segv=0 / handle_sigbus=0: the engine's fault handler (roce-verbs fault.rs) chains faults that are not its
# own to the previous disposition; with ASan's handler there a deliberate fault (fault.rs's
# `other_faults_still_end_the_process`) ends in an ASan report and exit 1 instead of the default SIGSEGV.
# Four tests compare CPU time, how a load splits between threads or a wall-clock bound, not memory: the two
# share-of-frames tests of roce-verbs' runtime.rs (issue #19), roce-proto's per-packet cost with 16 vs 16,384 QPs
# (scale.rs, bound 5x; 6.7x under ASan, whose allocator and shadow memory make the 16,384-QP working set slow) and
# stats_endpoint.rs's runtime that must stop within 1 s though a stats client does not read (1.005 s in a loaded
# ASan run). Under ASan's slowdown these figures are not the product's, so they are left to the normal test run.
ASAN_OPTIONS="handle_segv=0:handle_sigbus=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" run -p roce-verbs -p roce-link -p roce-proto --tests -- \
    --skip a_polling_program_receives_its_frames_itself --skip an_event_driven_program_receives_its_frames_itself \
    --skip per_packet_work_does_not_grow_with_the_qp_count \
    --skip a_client_that_does_not_read_its_answer_does_not_keep_the_runtime_alive
echo "== ASan: roce-ibverbs (C programs built with -fsanitize=address load the instrumented libibverbs.so.1)"
PATH="$wrap:$PATH" ASAN_OPTIONS="detect_leaks=0:handle_segv=0:handle_sigbus=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" run -p roce-ibverbs --tests
echo "== ASan: no errors"
