#!/usr/bin/env bash
# Install everything kvviz needs into the current Python environment.
#   bash scripts/setup.sh          runtime: the app, the CLI and the embedded models
#   bash scripts/setup.sh --test   also the test tools, Debian's Chromium for browser tests, Debian's
#                                  postgresql for the workshop store's PostgreSQL tests and Debian's nginx
#                                  for the several-servers recipe (scripts/workshop_cluster.py)
set -euo pipefail
cd "$(dirname "$0")/.."

with_tests=0
for argument in "$@"; do
  case "$argument" in
    --test) with_tests=1 ;;
    *) echo "usage: bash scripts/setup.sh [--test]" >&2; exit 2 ;;
  esac
done

python -m pip install --quiet --disable-pip-version-check -r requirements.txt
python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-embedded.txt

if [ "$with_tests" = 1 ]; then
  python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
  # Browser tests drive Debian's Chromium through Playwright; never `playwright install`.
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "Installing Debian's chromium for the browser tests ..."
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core >/dev/null
    else
      echo "note: /usr/bin/chromium is missing and this user cannot apt-get install it;" \
           "browser tests will skip (sudo apt-get install chromium)." >&2
    fi
  fi
  # The workshop store's suite also runs on a throwaway PostgreSQL server (tests/postgres_server.py):
  # the tests start it from Debian's binaries; the package's own cluster is not used.
  if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "Installing Debian's postgresql for the workshop store's tests ..."
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    else
      echo "note: PostgreSQL's initdb is missing and this user cannot apt-get install it;" \
           "the PostgreSQL store tests will skip (sudo apt-get install postgresql)." >&2
    fi
  fi
  # Several servers, one class (scripts/workshop_cluster.py, tests/integration/test_workshop_cluster.py): nginx
  # balances the app servers; the tests start it with a configuration of their own, not the package's service.
  if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "Installing Debian's nginx for the several-servers test ..."
      apt-get update -qq
      package=nginx-light
      apt-cache show nginx-light >/dev/null 2>&1 || package=nginx
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package" >/dev/null
      /usr/sbin/nginx -s quit 2>/dev/null || true  # where the package started its own service on port 80
    else
      echo "note: nginx is missing and this user cannot apt-get install it;" \
           "the several-servers test will skip (sudo apt-get install nginx-light)." >&2
    fi
  fi
fi
echo "kvviz setup done ($(python -c 'import torch, transformers, gradio; print(f"torch {torch.__version__}, transformers {transformers.__version__}, gradio {gradio.__version__}")'))"
