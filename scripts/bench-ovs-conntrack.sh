#!/usr/bin/env bash
# Open vSwitch's userspace connection tracker and ferry's, side by side in one run: a
# packet of an established UDP connection looked up and its connection updated, with
# 1 000 and 1 000 000 connections tracked, packets of connections spread over the whole
# table, in batches of 32; and a new UDP connection committed with source NAT (port
# allocation), in rounds of 4096 in an emptied table and in rounds of 2^20 in a table
# that grows from empty. Open vSwitch's is its library
# (lib/conntrack.c, from the Debian openvswitch-source package) driven through
# conntrack_execute() by scripts/ovs-conntrack/bench.c, as its PMD threads drive it;
# ferry's are its criterion benchmarks. Prints nanoseconds per packet (median of the
# rounds) and the ratios. Sends no packet: both work on packets in memory.
#
#   bash scripts/bench-ovs-conntrack.sh [ROUNDS]     (default 5)
#   OVS_BUILD_DIR=DIR: where Open vSwitch is built (kept between runs; default
#   /var/tmp/ferry-ovs-build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
tarball=/usr/src/openvswitch/openvswitch.tar.gz
ensure_packages cc:build-essential make:make python3:python3 "$tarball:openvswitch-source"
rounds=${1:-5}

# Open vSwitch's library, built once: the generated headers its sources include, then
# the library itself.
build=${OVS_BUILD_DIR:-/var/tmp/ferry-ovs-build}
src=$build/openvswitch
if [ ! -f "$src/lib/.libs/libopenvswitch.a" ]; then
  echo "building Open vSwitch's library in $src (some minutes, once)" >&2
  rm -rf "$build"
  mkdir -p "$build"
  tar xzf "$tarball" -C "$build"
  (
    cd "$src"
    ./configure -q --disable-ssl --disable-libcapng >/dev/null
    make -s -j"$(nproc)" include/odp-netlink.h include/odp-netlink-macros.h \
      lib/vswitch-idl.c lib/vswitch-idl.h lib/ovsdb-server-idl.c lib/ovsdb-server-idl.h \
      >/dev/null
    make -s -j"$(nproc)" lib/libopenvswitch.la >/dev/null
  )
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
: >"$work/results"
gcc -O2 -g -I"$src" -I"$src/include" -I"$src/lib" -o "$work/ovs-conntrack" \
  scripts/ovs-conntrack/bench.c "$src/lib/.libs/libopenvswitch.a" -lpthread -lrt -lm

# ferry's benchmark binaries (cargo names each on its standard error).
bench_bin() {
  cargo bench -p "$1" --bench "$2" --no-run --locked 2>"$work/build.txt" ||
    { cat "$work/build.txt" >&2; exit 1; }
  grep -o "target/release/deps/$2-[0-9a-f]*" "$work/build.txt" | tail -1
}
ferry_ct=$(bench_bin ferry-datapath conntrack)
ferry_pages=$(bench_bin ferry-linux conntrack_pages)

# The median time of each criterion row a filter selects, as "row ns" lines.
ferry_rows() {
  nice -n -15 "$1" --bench --noplot --warm-up-time 1 --measurement-time 3 "$2" 2>/dev/null |
    awk '/^[a-z_]+\/[^ ]+$/ { name = $1; next }
      /^[a-z_]+\/[^ ]+ +time:/ { name = $1; sub(/^[^ ]+ +/, "") }
      /time:/ && name != "" {
        v = $4; u = $5
        if (u == "ps") v /= 1000; else if (u == "µs" || u == "us") v *= 1000; else if (u == "ms") v *= 1e6
        print name, v; name = "" }'
}

median() {
  sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print v[int((NR + 1) / 2)] }'
}

for r in $(seq 1 "$rounds"); do
  echo "round $r of $rounds" >&2
  for n in 1000 1000000; do
    nice -n -15 "$work/ovs-conntrack" established "$n" 4000000 1 |
      sed "s/^/ovs_$n /" >>"$work/results"
  done
  nice -n -15 "$work/ovs-conntrack" new 4096 1000000 1 | sed "s/^/ovs_new /" >>"$work/results"
  nice -n -15 "$work/ovs-conntrack" new 1048576 1048576 1 |
    sed "s/^/ovs_new_growing /" >>"$work/results"
  ferry_rows "$ferry_ct" \
    'conntrack_established/lookup_update_1(K|M)_batch32$|conntrack_new/snat_port_allocation_and_commit(_4K_hot)?$' \
    >>"$work/results"
  ferry_rows "$ferry_pages" 'conntrack_pages/lookup_update_1M_huge_batch32$' >>"$work/results"
done
of() {
  awk -v k="$1" '$1 == k { print $2 }' "$work/results" | median ||
    { echo "no result for $1" >&2; exit 1; }
}
o1=$(of ovs_1000)
o2=$(of ovs_1000000)
f1=$(of conntrack_established/lookup_update_1K_batch32)
f2=$(of conntrack_established/lookup_update_1M_batch32)
f3=$(of conntrack_pages/lookup_update_1M_huge_batch32)
o4=$(of ovs_new)
f4=$(of conntrack_new/snat_port_allocation_and_commit_4K_hot)
o5=$(of ovs_new_growing)
f5=$(of conntrack_new/snat_port_allocation_and_commit)

printf '%-62s %9s\n' "established UDP packet, batches of 32 (median of $rounds rounds)" "ns/packet"
printf '%-62s %9.1f\n' "Open vSwitch conntrack_execute(), 1 000 connections" "$o1"
printf '%-62s %9.1f\n' "ferry, 1 000 connections" "$f1"
printf '%-62s %9.1f\n' "Open vSwitch conntrack_execute(), 1 000 000 connections" "$o2"
printf '%-62s %9.1f\n' "ferry, 1 000 000 connections (4 KiB pages, prefetch by reads)" "$f2"
printf '%-62s %9.1f\n' "ferry, 1 000 000 connections (huge pages, prefetch instruction)" "$f3"
printf '%-62s %9s\n' "new UDP connection with source NAT, committed" "ns/packet"
printf '%-62s %9.1f\n' "Open vSwitch conntrack_execute(), rounds of 4096" "$o4"
printf '%-62s %9.1f\n' "ferry, rounds of 4096" "$f4"
printf '%-62s %9.1f\n' "Open vSwitch conntrack_execute(), growing to 2^20" "$o5"
printf '%-62s %9.1f\n' "ferry, growing to 2^20" "$f5"
awk -v o1="$o1" -v f1="$f1" -v o2="$o2" -v f2="$f2" -v f3="$f3" -v o4="$o4" -v f4="$f4" \
  -v o5="$o5" -v f5="$f5" 'BEGIN {
  printf "ferry/Open vSwitch time, established: 1 000: %.2fx; 1 000 000: %.2fx (4 KiB pages), %.2fx (huge pages)\n",
    f1 / o1, f2 / o2, f3 / o2
  printf "ferry/Open vSwitch time, new connection with source NAT: %.2fx (rounds of 4096), %.2fx (growing)\n",
    f4 / o4, f5 / o5 }'
