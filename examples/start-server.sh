# Sourced by the examples' scripts: start_server ARGS... runs `$exe serve --port 0 ARGS...` in the
# background, sets $port once it listens, and stops the server when the script exits.
start_server() {
  server_log="$(mktemp)"
  "$exe" serve --port 0 "$@" 2>"$server_log" &
  server=$!
  trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -f "$server_log"' EXIT
  port=""
  for _ in $(seq 1 200); do
    port="$(sed -n 's|.*on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$server_log")"
    [ -n "$port" ] && return 0
    kill -0 "$server" 2>/dev/null || { cat "$server_log" >&2; exit 1; }
    sleep 0.1
  done
  echo "the server did not start" >&2
  cat "$server_log" >&2
  exit 1
}
