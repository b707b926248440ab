#!/usr/bin/env bash
# Fails if any C++ source differs from the project's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files '*.cpp' '*.h' | xargs clang-format --dry-run --Werror
