#!/usr/bin/env bash
# Pod-to-pod TCP throughput and request/response latency across two nodes, built several
# ways in one run: through ferry (VXLAN overlay, conntrack), through the Linux kernel
# (veth, routes, kernel VXLAN, nf_conntrack with a stateful rule), and through Open
# vSwitch's userspace datapath when it is installed. Prints each and the ratios, the
# processor time ferry's and Open vSwitch's processes took per GB carried, and that of
# the whole machine (every process and the kernel's work for them).
# Needs root. Traffic stays in namespaces this script makes; all are removed on exit.
#
#   bash scripts/bench-nodes.sh [SECONDS]      (default 10 s of iperf3 per topology)
#   BENCH_ONLY=ferry bash scripts/bench-nodes.sh 5     (only the topologies named)
#   BENCH_ONLY="kernel ferry ferry-pin ferry-2w" ...   (ferry-pin: its worker pinned to
#   the first CPU, --pin-workers; ferry-2w: 2 workers per node)
#   ferry-busy (run by default): ferry with --busy-poll $BUSY_POLL_US (default 100);
#   ferry-pin-busy: both, pinned and busy polling
#   RR_COUNT=N: N round trips instead of 5000; IPERF_ARGS="-C cubic": more iperf3 client
#   arguments; FERRY_BIN=PATH: run that ferry binary instead of the one built here (to
#   compare two builds in alternating runs)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages cc:build-essential ip:iproute2 iperf3:iperf3 nft:nftables python3:python3
secs=${1:-10}
rr_count=${RR_COUNT:-5000}
cargo build --release --locked -q -p ferry
ferry=${FERRY_BIN:-$PWD/target/release/ferry}
p="fb$$"
work=$(mktemp -d)
pids=()

cleanup() {
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  ovs_stop
  sleep 0.5
  for ns in $(ip netns list | awk '{print $1}' | grep "^$p-" || true); do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

nsx() { ip netns exec "$p-$1" "${@:2}"; }

# A 1-byte TCP ping-pong, N round trips; prints the mean round trip in microseconds.
cat > "$work/rr.py" <<'PY'
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "server":
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b: break
        c.sendall(b)
else:
    c = socket.create_connection((host, port), timeout=5)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(200): c.sendall(b"x"); c.recv(1)
    t = time.perf_counter()
    for _ in range(n): c.sendall(b"x"); c.recv(1)
    print(round((time.perf_counter() - t) / n * 1e6, 1))
PY

# Builds namespaces n1 n2 p1 p2 and the wire between the nodes.
base() {
  for ns in n1 n2 p1 p2; do ip netns add "$p-$ns"; nsx "$ns" ip link set lo up; done
  ip link add up1 netns "$p-n1" type veth peer name up2 netns "$p-n2"
  nsx n1 ip link set up1 address 02:fe:00:00:00:01 up
  nsx n2 ip link set up2 address 02:fe:00:00:00:02 up
}

teardown() {
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  pids=()
  for ns in n1 n2 p1 p2; do ip netns del "$p-$ns" 2>/dev/null || true; done
  sleep 0.5
}

# cpu_ticks PID...: the processor time (user and system, in clock ticks) the processes
# have used so far, summed.
cpu_ticks() {
  local t=0 pid
  for pid in "$@"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
  done
  echo "$t"
}

# busy_ticks: the processor time (in clock ticks) all processors of the machine have spent
# so far on anything but idling: user, nice, system, irq and softirq of /proc/stat. Time
# stolen by the hypervisor is left out.
busy_ticks() {
  awk '/^cpu / {print $2 + $3 + $4 + $7 + $8}' /proc/stat
}

# measure NAME [PID...]: iperf3 and the ping-pong from pod 1 to pod 2 (10.244.2.5). The
# processes named are the datapath's (ferry's nodes, Open vSwitch's ovs-vswitchd): their
# processor time during iperf3, per GB received, is printed as well. So is the whole
# machine's (both pods' TCP stacks, iperf3, the datapath, everything else): the whole
# path's cost per GB, and with the machine's processors all busy, what bounds throughput.
measure() {
  local name=$1
  shift
  for _ in $(seq 50); do nsx p1 ping -c 1 -W 1 10.244.2.5 >/dev/null 2>&1 && break; sleep 0.2; done
  nsx p2 iperf3 -s -1 >/dev/null 2>&1 & pids+=($!)
  sleep 0.5
  local gbps bytes json t0 t1 m0 m1 cpu=- all
  t0=$(cpu_ticks "$@")
  m0=$(busy_ticks)
  # shellcheck disable=SC2086 # IPERF_ARGS is a list of words
  json=$(nsx p1 iperf3 -c 10.244.2.5 -t "$secs" ${IPERF_ARGS:-} -J)
  t1=$(cpu_ticks "$@")
  m1=$(busy_ticks)
  read -r gbps bytes < <(python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]["sum_received"]; print(round(e["bits_per_second"]/1e9, 3), e["bytes"])' <<<"$json")
  if [ $# -gt 0 ]; then
    cpu=$(python3 -c "print(round(($t1 - $t0) / $(getconf CLK_TCK) / ($bytes / 1e9), 3))")
  fi
  all=$(python3 -c "print(round(($m1 - $m0) / $(getconf CLK_TCK) / ($bytes / 1e9), 3))")
  nsx p2 python3 "$work/rr.py" server 10.244.2.5 5300 0 & pids+=($!)
  sleep 0.5
  local us
  us=$(nsx p1 python3 "$work/rr.py" client 10.244.2.5 5300 "$rr_count")
  printf '%-14s %8s Gbit/s %8s us %8s CPU-s/GB, machine %s CPU-s/GB\n' "$name" "$gbps" "$us" "$cpu" "$all"
  echo "$name $gbps $us $cpu $all" >> "$work/results"
}

kernel() {
  base
  for n in 1 2; do
    nsx "n$n" ip addr add "192.168.77.$n/24" dev "up$n"
    nsx "n$n" sysctl -qw net.ipv4.ip_forward=1
    ip link add "h$n" netns "$p-n$n" type veth peer name eth0 netns "$p-p$n"
    nsx "n$n" ip link set "h$n" up
    nsx "p$n" ip link set eth0 mtu 1450 up
    nsx "p$n" ip addr add "10.244.$n.5/32" dev eth0
    nsx "p$n" ip route add 169.254.1.1 dev eth0 scope link
    nsx "p$n" ip route add default via 169.254.1.1 dev eth0
    local hmac
    hmac=$(nsx "n$n" cat "/sys/class/net/h$n/address")
    nsx "p$n" ip neigh add 169.254.1.1 lladdr "$hmac" dev eth0 nud permanent
    nsx "n$n" ip route add "10.244.$n.5/32" dev "h$n"
    local peer=$((3 - n))
    nsx "n$n" ip link add vx0 type vxlan id 4096 dstport 4789 local "192.168.77.$n" remote "192.168.77.$peer" dev "up$n"
    nsx "n$n" ip link set vx0 up
    # The peer answers ARP for its pods across the tunnel.
    nsx "n$n" sysctl -qw net.ipv4.conf.vx0.proxy_arp=1
    nsx "n$n" ip addr add "10.244.$n.1/32" dev vx0
    nsx "n$n" ip route add "10.244.$peer.0/24" dev vx0
    nsx "n$n" nft -f - <<NFT
table inet ferrybench {
  chain forwarding {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    ct state new accept
  }
}
NFT
  done
  measure kernel
  teardown
}

# ferry_nodes NAME WORKERS [ARG...]: the ferry topology with WORKERS worker threads per
# node and further arguments of ferry node.
ferry_nodes() {
  local name=$1 workers=$2
  shift 2
  base
  for n in 1 2; do
    local peer=$((3 - n))
    cat > "$work/node$n.yaml" <<YAML
node: { name: node$n, addresses: [192.168.77.$n] }
ports:
  - { name: uplink, kind: uplink, mac: "02:fe:00:00:00:0$n", mtu: 1500, addresses: [192.168.77.$n/24], gso: true }
  - { name: pod, kind: pod, mac: "ee:ee:ee:ee:ee:ee", peer_mac: "0a:58:0a:f4:0$n:05", addresses: [10.244.$n.5], gso: true }
overlay: { vni: 4096, mode: always, uplink: uplink }
nodes:
  - { name: node$peer, address: 192.168.77.$peer, pod_cidrs: [10.244.$peer.0/24] }
YAML
    nsx "n$n" "$ferry" node --workers "$workers" "$@" --tables "$work/node$n.yaml" --attach "uplink=af-packet:up$n" --attach "pod=pod:$p-p$n" 2>"$work/ferry$n.log" &
    pids+=($!)
  done
  for n in 1 2; do
    for _ in $(seq 100); do nsx "p$n" ip link show eth0 >/dev/null 2>&1 && break; sleep 0.1; done
  done
  # The ferry processes themselves (the pids above are of the shells that started them).
  measure "$name" $(pgrep -f -- "--tables $work/node")
  teardown
}

# Stops the private ovsdb-server and ovs-vswitchd pairs that ovs() started (by the
# pidfiles in $work, so a system Open vSwitch is never touched) and deletes any
# root-namespace link with the script's prefix. The netdev bridges' internal ports are
# TAPs that go with their ovs-vswitchd.
ovs_stop() {
  local f pid
  for f in "$work"/ovs/n*/ovs-vswitchd.pid "$work"/ovs/n*/ovsdb-server.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null || true)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$f"
  done
  for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$p" || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

# Open vSwitch's userspace datapath (datapath_type=netdev): each node namespace runs its
# own ovsdb-server and ovs-vswitchd (private db, sockets, pidfiles and logs under $work).
# Per node: an integration bridge ${p}i<n> (the pod's veth on port 1, a VXLAN port with
# VNI 4096 on port 2) and an underlay bridge ${p}b<n>, whose internal port holds the node
# address 192.168.77.<n>/24 and which passes packets between it and the wire up<n> only.
# VXLAN is OVS's userspace tunnelling: ovs-vswitchd encapsulates, routes by its own route
# table and decapsulates; the tunnel neighbour (the other node's address) is static.
# (One ovs-vswitchd for both nodes does not work: OVS 3.1 decapsulates a tunnel packet for
# any address local to that ovs-vswitchd on output, so it never crosses the wire.)
# OpenFlow per node: every IP packet through ct(zone=1), new connections committed,
# established ones forwarded, anything else (including invalid) dropped; then routed
# (dec_ttl, MAC rewrite toward the pod). The pods' eth0 have transmit offloads off: this
# datapath takes no TSO/GSO super-packets from a veth (userspace TSO is experimental in
# this OVS version and excludes tunnels), so the pods send 1450-byte segments.
ovs() {
  if ! command -v ovs-vswitchd >/dev/null 2>&1; then
    echo "ovs        skipped: Open vSwitch is not installed (apt-get install openvswitch-switch)"
    return
  fi
  local schema= f
  for f in /usr/share/openvswitch/vswitch.ovsschema /usr/local/share/openvswitch/vswitch.ovsschema; do
    [ -f "$f" ] && schema=$f && break
  done
  if [ -z "$schema" ] || ! command -v ovsdb-server >/dev/null 2>&1 || ! command -v ovs-ofctl >/dev/null 2>&1; then
    echo "ovs        skipped: Open vSwitch is incomplete here (ovsdb-server, ovs-ofctl, vswitch.ovsschema)"
    return
  fi
  ensure_packages ethtool:ethtool
  base
  for n in 1 2; do
    local peer=$((3 - n)) gw="02:fe:00:00:01:0$n" pmac o="$work/ovs/n$n"
    mkdir -p "$o"
    # Every OVS tool of this node finds its sockets (and the bridges' .mgmt sockets) here.
    local env=(env OVS_RUNDIR="$o" OVS_LOGDIR="$o" OVS_DBDIR="$o" OVS_SYSCONFDIR="$o")
    "${env[@]}" ovsdb-tool create "$o/conf.db" "$schema"
    nsx "n$n" "${env[@]}" ovsdb-server "$o/conf.db" --remote="punix:$o/db.sock" --pidfile="$o/ovsdb-server.pid" \
      --unixctl="$o/ovsdb-server.ctl" --log-file="$o/ovsdb-server.log" --detach --no-chdir -vconsole:off 2>/dev/null
    "${env[@]}" ovs-vsctl --db="unix:$o/db.sock" --no-wait init
    nsx "n$n" "${env[@]}" ovs-vswitchd "unix:$o/db.sock" --pidfile="$o/ovs-vswitchd.pid" --unixctl="$o/ovs-vswitchd.ctl" \
      --log-file="$o/ovs-vswitchd.log" --detach --no-chdir -vconsole:off 2>/dev/null
    local vsctl=("${env[@]}" ovs-vsctl --db="unix:$o/db.sock" --timeout=20)
    local ofctl=("${env[@]}" ovs-ofctl)
    # Underlay bridge: the node address and the wire, nothing else.
    "${vsctl[@]}" add-br "${p}b$n" -- set bridge "${p}b$n" datapath_type=netdev fail-mode=secure \
      other-config:hwaddr="02:fe:00:00:00:1$n" \
      -- add-port "${p}b$n" "up$n" -- set interface "up$n" ofport_request=1
    "${ofctl[@]}" add-flows "${p}b$n" - <<FLOWS
priority=100,in_port=LOCAL,actions=output:1
priority=100,in_port=1,actions=LOCAL
FLOWS
    nsx "n$n" sysctl -qw "net.ipv6.conf.${p}b$n.disable_ipv6=1" 2>/dev/null || true
    nsx "n$n" ip addr add "192.168.77.$n/24" dev "${p}b$n"
    nsx "n$n" ip link set "${p}b$n" up
    # The pod: veth, MTU 1450, a static neighbour for its gateway.
    ip link add "${p}o$n" netns "$p-n$n" type veth peer name eth0 netns "$p-p$n"
    nsx "n$n" ip link set "${p}o$n" up
    nsx "p$n" ip link set eth0 mtu 1450 up
    nsx "p$n" ethtool -K eth0 tx off >/dev/null 2>&1
    nsx "p$n" ip addr add "10.244.$n.5/32" dev eth0
    nsx "p$n" ip route add 169.254.1.1 dev eth0 scope link
    nsx "p$n" ip route add default via 169.254.1.1 dev eth0
    nsx "p$n" ip neigh add 169.254.1.1 lladdr "$gw" dev eth0 nud permanent
    pmac=$(nsx "p$n" cat /sys/class/net/eth0/address)
    # Integration bridge: the pod on port 1, the VXLAN tunnel to the other node on port 2.
    "${vsctl[@]}" add-br "${p}i$n" -- set bridge "${p}i$n" datapath_type=netdev fail-mode=secure \
      -- add-port "${p}i$n" "${p}o$n" -- set interface "${p}o$n" ofport_request=1 \
      -- add-port "${p}i$n" "${p}v$n" -- set interface "${p}v$n" type=vxlan ofport_request=2 \
         options:remote_ip="192.168.77.$peer" options:key=4096
    ovs-appctl -t "$o/ovs-vswitchd.ctl" tnl/neigh/set "${p}b$n" "192.168.77.$peer" "02:fe:00:00:00:1$peer" >/dev/null
    "${ofctl[@]}" add-flows "${p}i$n" - <<FLOWS
table=0,priority=100,ip,actions=ct(table=1,zone=1)
table=0,priority=0,actions=drop
table=1,priority=100,ct_state=+trk+new-inv,ip,actions=ct(commit,zone=1),resubmit(,2)
table=1,priority=100,ct_state=+trk+est-inv,ip,actions=resubmit(,2)
table=1,priority=0,actions=drop
table=2,priority=100,ip,nw_dst=10.244.$n.5,actions=dec_ttl,mod_dl_src:$gw,mod_dl_dst:$pmac,output:1
table=2,priority=100,ip,nw_dst=10.244.$peer.0/24,actions=dec_ttl,output:2
table=2,priority=0,actions=drop
FLOWS
  done
  measure ovs $(cat "$work"/ovs/n*/ovs-vswitchd.pid)
  ovs_stop
  teardown
}

echo "pod-to-pod across two nodes, iperf3 ${secs} s and $rr_count TCP round trips of 1 byte"
# BENCH_ONLY="ferry kernel" runs only those topologies (default: kernel ferry ferry-busy ovs).
only=${BENCH_ONLY:-kernel ferry ferry-busy ovs}
for t in kernel ferry ferry-busy ferry-pin ferry-pin-busy ferry-2w ovs; do
  case " $only " in *" $t "*) ;; *) continue ;; esac
  case $t in
    ferry) ferry_nodes ferry 1 ;;
    ferry-pin) ferry_nodes ferry-pin 1 --pin-workers ;;
    ferry-2w) ferry_nodes ferry-2w 2 ;;
    ferry-busy) ferry_nodes ferry-busy 1 --busy-poll "${BUSY_POLL_US:-100}" ;;
    ferry-pin-busy) ferry_nodes ferry-pin-busy 1 --pin-workers --busy-poll "${BUSY_POLL_US:-100}" ;;
    *) "$t" ;;
  esac
done
python3 - "$work/results" <<'PY'
import sys
r = {l.split()[0]: l.split()[1:] for l in open(sys.argv[1])}
for name in ("ferry", "ferry-busy", "ferry-pin", "ferry-pin-busy", "ferry-2w"):
    if name not in r:
        continue
    f = r[name]
    for base in ("kernel", "ovs"):
        if base in r:
            b = r[base]
            label = f"{name}/{base}:"
            line = f"{label:<17} throughput {float(f[0]) / float(b[0]):.2f}x, latency {float(f[1]) / float(b[1]):.2f}x"
            if f[2] != "-" and b[2] != "-":
                line += f", CPU per GB {float(f[2]) / float(b[2]):.2f}x"
            line += f", machine CPU per GB {float(f[3]) / float(b[3]):.2f}x"
            print(line)
PY
