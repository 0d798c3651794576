#!/bin/sh
# Written by agent-fsm ${version}: rolls ${name} back through the last-good release's own binary.
set -eu
exec ${last_good}/bin/agent-fsm --config ${config} recover
