#!/usr/bin/env bash
# Builds the fuzz targets of p4/model (cargo-fuzz, nightly, AddressSanitizer, overflow checks)
# and runs each for FUZZ_SECONDS (default 60); `run.sh --build-only` only builds them (make
# setup does, beside its other downloads and builds). Corpora grow in .cache/fuzz-corpus/<target>/,
# starting from seeds written here; an input that crashes or hangs a target is saved under
# .cache/fuzz-artifacts/<target>/, its path printed, and the script exits non-zero.
# Needs `make fuzz-tools` (cargo-fuzz) and the machine's nightly toolchain.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
fuzz_dir=$root/p4/model/fuzz
cache=$root/.cache
export CARGO_HOME=$cache/cargo
unset MAKEFLAGS MFLAGS # make -j's jobserver descriptors, not passed to this script (cargo warns)
target_dir=$cache/target-fuzz
seconds=${FUZZ_SECONDS:-60}
targets=(parse_frame read_pcap)

[[ -x $CARGO_HOME/bin/cargo-fuzz ]] || {
  echo "fuzz: $CARGO_HOME/bin/cargo-fuzz is missing: run make fuzz-tools" >&2
  exit 1
}
rustup run nightly rustc --version >/dev/null || {
  echo "fuzz: cargo-fuzz needs the nightly toolchain (rustup toolchain list)" >&2
  exit 1
}

# Its own target dir (nightly, sanitizer flags). The workspace's release profile has
# lto = "thin": the fuzz build keeps cargo's default, as before it joined the workspace.
cd "$root"
build() {
  echo "fuzz: building ${targets[*]}"
  PATH=$CARGO_HOME/bin:$PATH CARGO_PROFILE_RELEASE_LTO=false cargo +nightly fuzz build \
    --fuzz-dir "$fuzz_dir" --target-dir "$target_dir" -O --debug-assertions
}
if [[ ${1:-} == --build-only ]]; then
  build
  exit 0
fi

# A member of the root workspace (one Cargo.lock) but not of its default-members, so the
# Makefile's build, clippy and test leave it out: linted here (and by `make lint`'s rustfmt).
cargo fmt --check -p p4bs-model-fuzz
cargo clippy -q --locked -p p4bs-model-fuzz --target-dir "$target_dir" --all-targets \
  -- -D warnings
build # nothing to do after `--build-only`
bin_dir=$target_dir/x86_64-unknown-linux-gnu/release

# Seeds: valid inputs for the mutations to start from, written from hex (spaces ignored).
hex() { printf '%b' "$(tr -d ' \n' <<<"$*" | sed -E 's/(..)/\\x\1/g')"; }
le32() { printf '%02x%02x%02x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24)); }
be32() { printf '%08x' "$1"; }
eth=020000000002020000000001 # destination and source MAC
# IPv4 10.201.1.10 -> 10.201.2.2, DF; TCP 40000 -> 5201, seq 1000, ack 7.
tcp_4_bytes="$eth 0800 4500002c 12344000 40060000 0ac9010a 0ac90202
  9c401451 000003e8 00000007 5018ffff 00000000 deadbeef"
options_vlan="$eth 8100 0005 0800 46000038 12344000 40060000 0ac9010a 0ac90202 01010100
  9c401451 000003e8 00000007 8010ffff 00000000 0101080a 00000001 00000002 000000000000"
qinq_syn="$eth 88a8 0064 8100 0005 0800 45000028 00014000 40060000 0ac9010a 0ac90202
  9c401451 000003e8 00000000 5002ffff 00000000"
ipv6="$eth 86dd 60000000 00000640 $(printf '0%.0s' {1..64}) 0000"
udp="$eth 0800 4500001c 00010000 40110000 0ac9010a 0ac90202 9c401451 00080000"
arp="$eth 0806 00010800 06040001 020000000001 0ac9010a 000000000000 0ac90202"
# A pcap file: header (magic, version 2.4, zone, accuracy, snaplen, link type Ethernet) and
# records (seconds, fraction, captured and original length, the frame), little- or big-endian.
pcap() { # word-function magic frames...
  local word=$1 magic=$2 out i=1
  shift 2
  local version=0x00020004 # major 2, minor 4: two 16-bit words
  [[ $word == le32 ]] && version=0x00040002
  out="$($word "$magic") $($word $version) 00000000 00000000 $($word 65535) $($word 1)"
  for frame in "$@"; do
    local len=$(($(tr -d ' \n' <<<"$frame" | wc -c) / 2))
    out+=" $($word $((1700000000 + i))) $($word $((i * 1000))) $($word $len) $($word $len) $frame"
    i=$((i + 1))
  done
  echo "$out"
}
seeds=$cache/fuzz-seeds
rm -rf "$seeds"
mkdir -p "$seeds/parse_frame" "$seeds/read_pcap"
for name in tcp_4_bytes options_vlan qinq_syn ipv6 udp arp; do
  hex "${!name}" >"$seeds/parse_frame/$name"
done
hex "$(pcap le32 0xa1b2c3d4 "$tcp_4_bytes" "$options_vlan" "$udp")" >"$seeds/read_pcap/us_le"
hex "$(pcap be32 0xa1b23c4d "$qinq_syn" "$ipv6")" >"$seeds/read_pcap/ns_be"
hex "$(pcap le32 0xa1b2c3d4 "$arp") 0a000000 00000000 64000000 64000000 0102" \
  >"$seeds/read_pcap/truncated"
# pcapng blocks: type, total length, the body padded to 4 bytes, the total length again.
block() { # word-function type body
  local word=$1 type=$2 body
  body=$(tr -d ' \n' <<<"$3")
  while ((${#body} % 8)); do body+=00; done
  local length=$((12 + ${#body} / 2))
  echo "$($word "$type") $($word $length) $body $($word $length)"
}
half() { # word-function 16-bit value
  if [[ $1 == le32 ]]; then printf '%02x%02x' $(($2 & 255)) $(($2 >> 8)); else printf '%04x' "$2"; fi
}
# Section header (byte-order magic, version 1.0, unknown length), Ethernet interfaces
# (snaplen 65535; options: if_tsresol 10^-9 or 2^-20, if_tsoffset), enhanced packets (interface,
# timestamp high and low, captured and original length, frame, a comment option).
shb() { block "$1" 0x0a0d0d0a "$($1 0x1a2b3c4d) $(half "$1" 1) $(half "$1" 0) ffffffffffffffff"; }
idb() { block "$1" 1 "$(half "$1" 1) 0000 $($1 65535) $2"; }
epb() { # word-function interface timestamp frame
  local len=$(($(tr -d ' \n' <<<"$4" | wc -c) / 2)) data
  data=$(tr -d ' \n' <<<"$4")
  while ((${#data} % 8)); do data+=00; done
  block "$1" 6 "$($1 "$2") $($1 0) $($1 "$3") $($1 $len) $($1 $len) $data
    $(half "$1" 1) $(half "$1" 3) 61626300 00000000"
}
spb() { block "$1" 3 "$($1 $(($(tr -d ' \n' <<<"$2" | wc -c) / 2))) $2"; }
tsresol() { echo "$(half "$1" 9) $(half "$1" 1) ${2}000000 00000000"; }
hex "$(shb le32) $(idb le32 "$(tsresol le32 09)") $(idb le32 "$(tsresol le32 94)")
  $(epb le32 0 1700000001 "$tcp_4_bytes") $(epb le32 1 123456 "$options_vlan")
  $(spb le32 "$udp")" >"$seeds/read_pcap/pcapng_le"
hex "$(shb be32) $(idb be32 "$(half be32 14) $(half be32 8) 0000000000000064 00000000")
  $(block be32 4 "0001 0009 0ac9010a 686f7374 00000000 0000 0000") $(epb be32 0 7 "$qinq_syn")
  $(shb le32) $(idb le32 "") $(block le32 5 "00000000 00000000 00000000")
  $(epb le32 0 99 "$ipv6")" >"$seeds/read_pcap/pcapng_two_sections"

# The targets side by side: libFuzzer runs one process on one core. Stopped with the script.
declare -A pids logs
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
for target in "${targets[@]}"; do
  corpus=$cache/fuzz-corpus/$target
  artifacts=$cache/fuzz-artifacts/$target
  log=$cache/fuzz-logs/$target.log
  logs[$target]=$log
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  echo "fuzz: $target for ${seconds}s (corpus $corpus)"
  "$bin_dir/$target" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" "$corpus" "$seeds/$target" >"$log" 2>&1 &
  pids[$target]=$!
done
failed=()
for target in "${targets[@]}"; do
  log=${logs[$target]}
  status=0
  wait "${pids[$target]}" || status=$?
  last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "fuzz: $target: ${runs:-?} executions (${rate:-?}/s); last report: ${last:-none}"
  if ((status != 0)); then
    # The panic and its message (up to the backtrace), libFuzzer's verdict and the input.
    awk '/panicked at/ { p = 6 } /^(stack backtrace|note: )/ { p = 0 }
      p > 0 { print; p--; next }
      /^==[0-9]+==|^SUMMARY|Test unit written to/' "$log"
    echo "fuzz: $target FAILED (exit $status); log $log; reproduce: $bin_dir/$target <input>"
    failed+=("$target")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: crashes in ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} passed, 0 failed"
