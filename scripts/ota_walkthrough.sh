#!/usr/bin/env bash
# Run the README's over-the-air walkthrough (the bash block after <!-- ota-walkthrough -->) as written,
# in a scratch directory: pack -> serve -> upload -> list -> rollback -> publish -> agent.
#
# It needs what "The main job" leaves behind: keys/ and bundles/smollm2-orin. With OTA_BUNDLE (a bundle
# directory) and OTA_KEYS (its keys directory) those are yours; otherwise fresh keys and a bundle of
# preset:tiny (random weights, built in seconds) stand in at those paths: the walkthrough exercises the
# plugin path, not the model. The one change made to the block: ports 8000 and 8080 become free ports,
# so concurrent runs never collide. Everything listens on 127.0.0.1; started processes are stopped on exit.
# Without OTA_WORKDIR it runs in a temporary folder that is deleted at the end (keys and token included).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f "$ROOT/.venv/bin/activate" ]; then
  . "$ROOT/.venv/bin/activate"
fi
# A scratch folder of our own is removed on exit, success or not: it holds a private signing key and the admin
# token. With OTA_WORKDIR the folder is the caller's, and kept for them to inspect.
if [ -n "${OTA_WORKDIR:-}" ]; then
  WORK=$OTA_WORKDIR
else
  WORK=$(mktemp -d)
  trap 'cd / && rm -rf "$WORK"' EXIT
fi
mkdir -p "$WORK" && cd "$WORK"

if [ -n "${OTA_BUNDLE:-}" ]; then
  mkdir -p bundles && ln -sfn "$(cd "$OTA_BUNDLE" && pwd)" bundles/smollm2-orin
  ln -sfn "$(cd "${OTA_KEYS:?OTA_KEYS: the keys directory that signed OTA_BUNDLE}" && pwd)" keys
else
  edgekit keys generate keys >/dev/null
  edgekit build preset:tiny --target orin --key keys/edgekit.key --precision fp16 --context 128 --buckets 16,64 \
    -o bundles/smollm2-orin >build.log 2>&1 || { cat build.log; exit 1; }
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
P1=$(free_port); P2=$(free_port)
# the block, verbatim apart from the ports
awk '/<!-- ota-walkthrough -->/{found=1; next} found && /^```bash/{inside=1; next} inside && /^```/{exit} inside{print}' \
  "$ROOT/README.md" | sed -e "s/localhost:8000/localhost:$P1/g; s/--port 8000/--port $P1/g; s/127.0.0.1:8080/127.0.0.1:$P2/g; s/http.server 8080/http.server $P2/g" \
  > walkthrough.sh
[ -s walkthrough.sh ] || { echo "no ota-walkthrough block found in README.md"; exit 1; }
echo "== README OTA walkthrough in $WORK (ports $P1, $P2)"
# Its own process group, so whatever it started in the background is stopped even if a step fails.
set +e
timeout 900 setsid bash -euo pipefail walkthrough.sh &
GROUP=$!
wait $GROUP
rc=$?
kill -- -"$GROUP" 2>/dev/null
set -e
echo "== walkthrough exit status $rc"
exit $rc
