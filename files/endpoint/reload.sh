#!/bin/sh
# inference-nodes: reload the endpoint's nginx gracefully (deploys/endpoint.py: the unit's ExecReload=), and return
# once the new configuration serves: every worker of the old one has stopped accepting connections (it finishes the
# streams it carries, then exits). A configuration that does not load leaves the old one serving and fails here.
#   reload.sh MAINPID CONFIG
set -eu
main=$1
conf=$2
/usr/sbin/nginx -e stderr -c "$conf" -t -q
old=$(pgrep -P "$main" | tr '\n' ' ')
kill -HUP "$main"
i=0
while [ "$i" -lt 200 ]; do
  accepting=
  for p in $old; do
    case "$(ps -o args= -p "$p" 2>/dev/null)" in *"worker process") accepting=1 ;; esac
  done
  [ -z "$accepting" ] && exit 0
  i=$((i + 1))
  sleep 0.05
done
echo "inference-nodes: nginx did not take the new configuration within 10 s (its journal says why)" >&2
exit 1
