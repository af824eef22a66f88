#!/usr/bin/env bash
# The first `specexec run` after install (an empty cache: the GGUF converted, every choice timed), on a
# quiet machine and while a second 2-thread process (another `specexec run`, in a loop) shares the
# cores; then a warm run (the cache it filled). Wall seconds of the whole command.
set -uo pipefail
prompt="Explain KV caching in two sentences."
timed() { local t0; t0=$(date +%s.%N); "$@" > /dev/null 2>&1; echo "$(date +%s.%N) - $t0" | bc; }
cold=$(mktemp -d)
printf 'quiet, empty cache: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$cold" specexec run --prompt "$prompt")"
printf 'quiet, warm cache: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$cold" specexec run --prompt "$prompt")"
printf 'quiet, warm cache: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$cold" specexec run --prompt "$prompt")"
other=$(mktemp -d)
SPECEXEC_CACHE_DIR="$other" specexec run --prompt "$prompt" > /dev/null 2>&1  # (its own cache, warm)
( while true; do SPECEXEC_CACHE_DIR="$other" specexec run --prompt "$prompt" --max-tokens 512 > /dev/null 2>&1; done ) &
loop=$!
sleep 5
busy=$(mktemp -d)
printf 'beside a specexec run loop, empty cache: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$busy" specexec run --prompt "$prompt")"
printf 'beside a specexec run loop, warm cache: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$busy" specexec run --prompt "$prompt")"
kill "$loop"; pkill -f "max-tokens 512"; wait 2>/dev/null
printf 'quiet again, the cache filled while busy: %.1f s\n' "$(timed env SPECEXEC_CACHE_DIR="$busy" specexec run --prompt "$prompt")"
rm -rf "$cold" "$other" "$busy"
