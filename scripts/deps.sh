#!/usr/bin/env bash
# Debian packages the tests use beyond the toolchains, installed when missing (CI starts from
# a machine with only the toolchains): fio (exports of the I/O model are parsed by it) and
# chromium (HTML reports are loaded in it, headless).
set -euo pipefail
want=()
command -v fio >/dev/null || want+=(fio)
command -v chromium >/dev/null || want+=(chromium)
if [ ${#want[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${want[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q "${want[@]}" >/dev/null; }
fi
