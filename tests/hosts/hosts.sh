#!/usr/bin/env bash
# Test hosts on one machine (README "Across hosts"): N network namespaces, each with its own IPv4
# address on a private /24 and `lo` up, joined by veth pairs to one bridge in the root namespace.
# The bridge has no address, so the root namespace cannot reach the hosts and a host reaches
# another only through that host's address (never through loopback, which is per namespace).
#
#   tests/hosts/hosts.sh up N [PREFIX] [--json FILE] [--prefill H,H,...] [--decode H,...]
#   tests/hosts/hosts.sh down [N] [PREFIX]
#
# Names (PREFIX: 1..8 of a-z0-9, starting with a letter; default kvh, env KVF_HOSTS_PREFIX):
#   namespace PREFIXh<i>, bridge PREFIXbr, root end of host i's veth PREFIXv<i>, host end eth0.
# Subnet: env KVF_HOSTS_SUBNET, the first three octets (default 10.71.0): host i is SUBNET.i/24.
# `up` prints a hosts file for `kvferry replay --hosts` (or writes it to --json FILE): hosts h1..hN
# with address, exec ["ip","netns","exec",NS] and links ["eth0"], and a placement: bootstrap and
# router on h1, prefill and decode from --prefill/--decode (default: prefill h1,h1, decode h2,h2;
# with one host, everything on h1). `up` first removes what an earlier `up` of PREFIX left.
# `down` removes every namespace PREFIXh<digits>, veth PREFIXv<digits> and the bridge; it succeeds
# when there is nothing to remove (N is accepted and ignored: everything of PREFIX goes).
# Needs root and iproute2 (`ip`).
set -euo pipefail

usage() {
  sed -n '7,8p' "$0" | sed 's/^# *//' >&2
  exit 2
}

die() {
  echo "hosts.sh: $*" >&2
  exit 1
}

[ $# -ge 1 ] || usage
cmd=$1
shift
n=""
prefix=${KVF_HOSTS_PREFIX:-kvh}
json=""
prefill=""
decode=""
positional=()
while [ $# -gt 0 ]; do
  case $1 in
    --json) [ $# -ge 2 ] || usage; json=$2; shift 2 ;;
    --prefill) [ $# -ge 2 ] || usage; prefill=$2; shift 2 ;;
    --decode) [ $# -ge 2 ] || usage; decode=$2; shift 2 ;;
    -*) usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
case ${#positional[@]} in
  0) ;;
  1) n=${positional[0]} ;;
  2) n=${positional[0]}; prefix=${positional[1]} ;;
  *) usage ;;
esac
# down accepts "down PREFIX" too.
if [ "$cmd" = down ] && [ -n "$n" ] && ! [[ $n =~ ^[0-9]+$ ]]; then
  prefix=$n
  n=""
fi

[[ $prefix =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "PREFIX '$prefix' must be 1..8 of a-z0-9, starting with a letter"
subnet=${KVF_HOSTS_SUBNET:-10.71.0}
[[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "KVF_HOSTS_SUBNET '$subnet' must be three octets, e.g. 10.71.0"
command -v ip >/dev/null 2>&1 || die "'ip' (iproute2) is not installed: apt-get install iproute2"
[ "$(id -u)" = 0 ] || die "network namespaces need root (this is uid $(id -u))"

bridge=${prefix}br

down() {
  local ns link
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    if [[ $ns =~ ^${prefix}h[0-9]+$ ]]; then
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  # Deleting a namespace deletes its veth ends; a root end left by a failed `up` goes here.
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1); do
    if [[ $link =~ ^${prefix}v[0-9]+$ ]]; then
      ip link delete "$link" 2>/dev/null || true
    fi
  done
  if ip link show "$bridge" >/dev/null 2>&1; then
    ip link delete "$bridge" type bridge 2>/dev/null || true
  fi
  if ip link show "$bridge" >/dev/null 2>&1; then
    die "cannot delete bridge $bridge"
  fi
}

hosts_json() {
  local i sep="" pre=$prefill dec=$decode
  if [ -z "$pre" ]; then
    if [ "$n" -ge 2 ]; then pre=h1,h1; else pre=h1; fi
  fi
  if [ -z "$dec" ]; then
    if [ "$n" -ge 2 ]; then dec=h2,h2; else dec=h1; fi
  fi
  printf '{\n  "hosts": {\n'
  for i in $(seq 1 "$n"); do
    printf '%s    "h%d": {"address": "%s.%d", "exec": ["ip", "netns", "exec", "%sh%d"], "links": ["eth0"]}' \
      "$sep" "$i" "$subnet" "$i" "$prefix" "$i"
    sep=$',\n'
  done
  printf '\n  },\n  "place": {"bootstrap": "h1", "router": "h1", "prefill": [%s], "decode": [%s]}\n}\n' \
    "$(echo "$pre" | sed 's/[^,][^,]*/"&"/g; s/,/, /g')" "$(echo "$dec" | sed 's/[^,][^,]*/"&"/g; s/,/, /g')"
}

up() {
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 200 ] || die "N must be 1..200, got '$n'"
  down
  # A failed `up` leaves nothing behind.
  up_done=0
  trap '[ "$up_done" = 1 ] || down' EXIT
  ip link add "$bridge" type bridge || die "cannot create bridge $bridge"
  ip link set "$bridge" up
  local i ns
  for i in $(seq 1 "$n"); do
    ns=${prefix}h$i
    ip netns add "$ns" || die "cannot create namespace $ns"
    ip link add "${prefix}v$i" type veth peer name eth0 netns "$ns" || die "cannot create veth ${prefix}v$i"
    ip link set "${prefix}v$i" master "$bridge"
    ip link set "${prefix}v$i" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$subnet.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # Every link is up and its bridge port forwarding before `up` returns (links come up
  # asynchronously; a bridge without STP forwards at once).
  for i in $(seq 1 "$n"); do
    local tries=0
    until ip -n "${prefix}h$i" -o link show eth0 | grep -q 'state UP' &&
      [ "$(cat "/sys/class/net/${prefix}v$i/brport/state" 2>/dev/null)" = 3 ]; do
      tries=$((tries + 1))
      [ $tries -lt 100 ] || die "host h$i's link does not come up"
      sleep 0.05
    done
  done
  if [ -n "$json" ]; then
    hosts_json >"$json" || die "cannot write $json"
  else
    hosts_json
  fi
  up_done=1
}

case $cmd in
  up) up ;;
  down) down ;;
  *) usage ;;
esac
