#!/usr/bin/env bash
# The compose setup without Docker: two app processes on loopback behind nginx (Debian's
# package, `apt-get install -y nginx`), configured with deploy/nginx/vram.conf and
# locations.conf as in compose.yaml, only with the two loopback ports as the upstream.
# Checks that a route cookie sticks to one replica, that sessions without one spread over
# both, then drives the proxy with benchmarks/load.py. Stops everything it started.
#
#   benchmarks/load_proxy.sh [sessions ...]        # default: 10 50 100
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-/work/main/.venv/bin/python}
SESSIONS=("${@:-10 50 100}")
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
DIR=$(mktemp -d /tmp/vram-proxy.XXXXXX)
PIDS=()

cleanup() {
    [[ -f $DIR/nginx.pid ]] && kill "$(cat "$DIR/nginx.pid")" 2>/dev/null || true
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$DIR"
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
P1=$(free_port); P2=$(free_port); PN=$(free_port)
for port in "$P1" "$P2"; do
    PYTHONPATH=$REPO "$PY" -m streamlit run app.py --server.address=127.0.0.1 \
        --server.port="$port" --server.headless=true >"$DIR/app-$port.log" 2>&1 &
    PIDS+=($!)
done
for port in "$P1" "$P2"; do
    for _ in $(seq 120); do
        [[ $(curl -s "http://127.0.0.1:$port/_stcore/health" || true) == ok ]] && break
        sleep 0.5
    done
done

mkdir -p "$DIR/tmp"
cat >"$DIR/nginx.conf" <<CONF
worker_processes 1;
pid $DIR/nginx.pid;
error_log $DIR/error.log;
events { worker_connections 1024; }
http {
    client_body_temp_path $DIR/tmp/body;
    proxy_temp_path $DIR/tmp/proxy;
    fastcgi_temp_path $DIR/tmp/fastcgi;
    uwsgi_temp_path $DIR/tmp/uwsgi;
    scgi_temp_path $DIR/tmp/scgi;
    include $REPO/deploy/nginx/vram.conf;
    upstream vram_app {
        hash \$vram_route consistent;
        server 127.0.0.1:$P1;
        server 127.0.0.1:$P2;
    }
    server {
        listen 127.0.0.1:$PN;
        access_log $DIR/access.log vram;
        include $REPO/deploy/nginx/locations.conf;
    }
}
CONF
"$NGINX" -t -q -c "$DIR/nginx.conf" -p "$DIR"
"$NGINX" -c "$DIR/nginx.conf" -p "$DIR"
sleep 1
echo "nginx $("$NGINX" -v 2>&1 | sed 's/.*nginx\///') on 127.0.0.1:$PN -> app replicas on :$P1 and :$P2"

# Stickiness: one cookie, one replica; the first answer without a cookie sets one.
for route in alpha beta gamma; do
    for _ in $(seq 10); do
        curl -s -o /dev/null -b "vram_route=$route" "http://127.0.0.1:$PN/_stcore/health"
    done
done
sleep 0.5
for route in alpha beta gamma; do
    n=$(grep "route=$route " "$DIR/access.log" | sed 's/.*upstream=\([^ ]*\).*/\1/' | sort -u | wc -l)
    echo "cookie vram_route=$route: 10 requests went to $n replica(s)"
    [[ $n == 1 ]] || { echo "FAIL: route $route was not sticky"; exit 1; }
done
cookie=$(curl -s -D - -o /dev/null "http://127.0.0.1:$PN/" | grep -i '^set-cookie: vram_route=' || true)
[[ -n $cookie ]] || { echo "FAIL: no route cookie on a first request"; exit 1; }
echo "first request without a cookie: ${cookie%%;*}"

"$PY" benchmarks/load.py --url "ws://127.0.0.1:$PN" --pid "${PIDS[0]}" --pid "${PIDS[1]}" \
    --sessions ${SESSIONS[*]}
echo "websocket sessions per replica:" \
    "$(grep '_stcore/stream' "$DIR/access.log" | sed 's/.*upstream=\([^ ]*\).*/\1/' | sort | uniq -c | tr -s ' ' | paste -sd,)"
